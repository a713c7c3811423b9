"""Process plumbing shared by every component: `observability.logs` (JSON lines, redacted)."""
