"""Exactly-once registration: the mapping record, the pure transition function, the service."""

from control_plane_broker.registration.service import Registered, RegistrationService
from control_plane_broker.registration.state import Mapping

__all__ = ["Mapping", "Registered", "RegistrationService"]
