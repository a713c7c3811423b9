"""Small Kubernetes adapters over one async HTTP client; no decisions are made here."""
