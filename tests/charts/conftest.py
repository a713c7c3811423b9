"""The broker's integration fixtures (KCP namespace with the mapping CRD, Compass simulator,
Director credentials file), shared with the chart tests that run the real flow."""

from tests.integration.broker.conftest import (  # noqa: F401 - fixtures are found by name
    broker_crds,
    creds_file,
    kcp_ns,
    sim,
)
