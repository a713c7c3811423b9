"""The control-plane half of the pull model: verifies identity, registers once, issues tokens.

Public names: the configuration and the root of the error tree. The parts live in the
subpackages (`api`, `director`, `identity`, `kube`, `registration`); `wiring.run` composes them.
"""

from control_plane_broker.errors import BrokerError, PermanentError, TemporaryError
from control_plane_broker.settings import DirectorCredentials, Settings, load_director_credentials

__all__ = [
    "BrokerError",
    "DirectorCredentials",
    "PermanentError",
    "Settings",
    "TemporaryError",
    "load_director_credentials",
]
