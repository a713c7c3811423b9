"""The HTTP surface: FastAPI app, routes and RFC 9457 problem responses."""
