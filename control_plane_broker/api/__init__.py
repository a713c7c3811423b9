"""The HTTP surface: FastAPI app, routes and RFC 9457 problem responses."""

from control_plane_broker.api.app import create_app
from control_plane_broker.api.problems import MEDIA_TYPE, TYPE_PREFIX, Problem, problem_for

__all__ = ["MEDIA_TYPE", "TYPE_PREFIX", "Problem", "create_app", "problem_for"]
