"""The development environment: test control planes, the Compass simulator, the demo."""
