"""The runtime half of the pull model: pulls a Compass one-time token from the broker."""
