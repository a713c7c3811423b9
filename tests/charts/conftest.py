"""The broker's integration fixtures (KCP namespace with the mapping CRD, Compass simulator,
Director credentials file), shared with the chart tests that run the real flow, and a real
broker's scrape (`broker_scrape`) for the alert and dashboard checks."""

from tests.charts.promql import broker_exposition, broker_scrape  # noqa: F401
from tests.integration.broker.conftest import (  # noqa: F401 - fixtures are found by name
    broker_crds,
    creds_file,
    kcp_ns,
    sim,
)
