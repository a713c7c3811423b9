"""The agent tests' environment (a runtime namespace, the agent in-process), reused here."""

from tests.integration.agent.conftest import agent_env  # noqa: F401 - fixtures are found by name
