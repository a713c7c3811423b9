"""`python -m devenv.demo.compass_sim_mtls`: the Compass simulator and its certificate-secured side.

The same command line as `python -m devenv.compass_sim` (its parser and configuration), plus
`CertificateSecuredCompass` (`devenv/compass_sim/mtls.py`): the certificate-secured Connector and
Director a real compass-runtime-agent talks to after `Connected`, over mutual TLS with the
certificate the simulator's Connector issued. Its URLs go into every `configuration` answer from
then on, so the real agent can reach `Synchronized`. Prints one JSON line like the simulator's,
with `certificate_secured_url` added. The simulator's faults (`down`) reach its main listener
only: the certificate-secured listener stays up, as a runtime's established connection to
Compass is not what the demo's outage is about.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from pydantic import ValidationError

from devenv.compass_sim.__main__ import build_parser, config_from_args
from devenv.compass_sim.mtls import CertificateSecuredCompass
from devenv.compass_sim.server import CompassSimulator


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    parser.prog = "python -m devenv.demo.compass_sim_mtls"
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = config_from_args(args)
    except (ValueError, ValidationError) as exc:
        parser.error(str(exc))

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    sim = CompassSimulator(config, access_log=args.access_log)
    with (
        sim.running(args.host, args.port, admin_port=args.admin_port),
        CertificateSecuredCompass(sim, host=args.host) as secured,
    ):
        endpoints = {
            "url": sim.url,
            "admin_url": sim.admin_url,
            "token_url": sim.token_url,
            "director_url": sim.director_url,
            "connector_url": sim.connector_url,
            "certificate_secured_url": secured.url,
        }
        print(json.dumps(endpoints), flush=True)
        while not stop.wait(1.0):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
