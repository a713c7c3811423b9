"""The control-plane half of the pull model: verifies identity, registers once, issues tokens."""
