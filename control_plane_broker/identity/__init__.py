"""Cluster identity: who is asking. Pure checks in `claims`; one adapter per proof mode."""
