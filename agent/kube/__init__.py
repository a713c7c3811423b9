"""Thin adapters between the agent and the runtime's API server; no decisions in here."""
