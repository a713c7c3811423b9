"""Talking to Compass Director: GraphQL documents, typed models, OAuth, and the async client."""
