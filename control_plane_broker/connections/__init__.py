"""Connection reports: an agent tells the broker its runtime's Compass connection.

`report_rules` (pure) decides what a report or the passing of time writes on the mapping and
which Warning Events are news; `report_service` is the use case behind `POST .../connection`;
`fleet_gauges` turns every mapping into the fleet gauges at scrape time. Inside the broker,
import these modules, not this package.
"""
