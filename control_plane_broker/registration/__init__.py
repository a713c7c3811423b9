"""Exactly-once registration: the mapping record, the pure transition function, the service."""
