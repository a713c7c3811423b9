"""A small real HTTPS broker that answers as the issue-13 contract says, for the agent's report
and revocation tests until they run against the real broker.

`POST /v1/runtimes/{id}/token`: 201 with `ott-<n>` (n counts tokens issued), or 403
`runtime-revoked` with the operator's reason while `revoked` is set. `POST
/v1/runtimes/{id}/connection`: the body is checked against the contract (JSON of at most 4 KiB,
the five fields only, a known state, lastError ≤ 1024 chars, a 64-hex tokenSha256, RFC 3339
times; anything else: 400 `malformed-request`), then 403 `runtime-revoked` while revoked, 429
with Retry-After for the first `rate_limited_reports` reports, else 202 with
`{"nextReportAfterSeconds": next_report_after}`. A caller without the expected bearer token
gets 401 whatever it asks (revocation is no oracle). Every request is kept in `seen`.

Also the `broker` fixture and the helpers the report and revocation tests share.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from devenv.clusters import free_port
from tests.integration.agent.conftest import CC, AgentEnv, Pki, eventually

PROBLEM_PREFIX = "urn:kyma-compass-pull:broker:problem:"
REVOKED_TYPE = PROBLEM_PREFIX + "runtime-revoked"
EXPECTED_AUTHORIZATION = "Bearer fake-sa-token"  # what `AgentEnv.settings` writes


class ReportBody(BaseModel):
    """The contract's request body, strictly."""

    model_config = ConfigDict(extra="forbid", strict=False)

    connectionState: Literal[  # the contract spells its fields in camelCase
        "Connected",
        "ConnectionFailed",
        "ConnectionMaintenanceFailed",
        "SynchronizationFailed",
        "ResourceApplicationFailed",
        "MetadataUpdateFailed",
        "Synchronized",
        "NotFound",
    ]
    certificateNotAfter: datetime | None = None
    lastError: str | None = Field(default=None, max_length=1024)
    tokenSha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    observedAt: datetime


@dataclass
class Seen:
    at: float  # time.monotonic() on arrival
    kind: str  # "token" or "connection"
    runtime_id: str
    authorization: str | None
    body: dict[str, Any] | None  # a report's body as sent
    status: int = 0  # the answer given


def _problem(
    status: int, slug: str, detail: str, headers: dict[str, str] | None = None
) -> Response:
    return JSONResponse(
        status_code=status,
        content={"type": PROBLEM_PREFIX + slug, "title": slug, "status": status, "detail": detail},
        media_type="application/problem+json",
        headers=headers,
    )


class ContractBroker:
    def __init__(self, folder: Path) -> None:
        pki = Pki("contract-broker-ca")
        pair = pki.issue("127.0.0.1", server=True)
        self.ca_file = folder / "contract-broker-ca.crt"
        self.ca_file.write_bytes(pki.cert_pem)
        self._cert_file, self._key_file = folder / "broker.crt", folder / "broker.key"
        pair.write(self._cert_file, self._key_file)
        self.port = free_port()
        self.revoked: str | None = None  # the operator's reason while the runtime is revoked
        self.next_report_after = 3600
        self.rate_limited_reports = 0
        self.retry_after = "2"
        self.hold_reports: asyncio.Event | None = None  # set: reports wait for it first
        self.issued = 0
        self.seen: list[Seen] = []
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def requests(self, kind: str) -> list[Seen]:
        return [s for s in self.seen if s.kind == kind]

    @property
    def reports(self) -> list[Seen]:
        return self.requests("connection")

    @property
    def tokens(self) -> list[Seen]:
        return self.requests("token")

    def accepted_reports(self, **fields: Any) -> list[Seen]:
        """Reports answered 202 whose body has all of `fields` (a None value: field absent)."""
        return [
            s
            for s in self.reports
            if s.status == 202
            and s.body is not None
            and all(s.body.get(k) == v for k, v in fields.items())
        ]

    def _app(self) -> FastAPI:
        app = FastAPI()

        def refusal(seen: Seen) -> Response | None:
            if seen.authorization != EXPECTED_AUTHORIZATION:
                return _problem(401, "unauthenticated", "identity not proven")
            if self.revoked is not None:
                return _problem(403, "runtime-revoked", self.revoked)
            return None

        def answer(seen: Seen, response: Response) -> Response:
            seen.status = response.status_code
            return response

        @app.post("/v1/runtimes/{runtime_id}/token")
        async def token(runtime_id: str, request: Request) -> Response:
            seen = Seen(
                time.monotonic(), "token", runtime_id, request.headers.get("authorization"), None
            )
            self.seen.append(seen)
            refused = refusal(seen)
            if refused is not None:
                return answer(seen, refused)
            self.issued += 1
            expires = datetime.now(UTC) + timedelta(hours=1)
            body = {
                "token": f"ott-{self.issued}",
                "connectorURL": "https://connector.test/graphql",
                "compassRuntimeID": "compass-rt-1",
                "tenant": "ga-1",
                "expiresAt": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            return answer(seen, JSONResponse(status_code=201, content=body))

        @app.post("/v1/runtimes/{runtime_id}/connection")
        async def connection(runtime_id: str, request: Request) -> Response:
            raw = await request.body()
            seen = Seen(
                time.monotonic(),
                "connection",
                runtime_id,
                request.headers.get("authorization"),
                None,
            )
            self.seen.append(seen)
            if len(raw) > 4096 or request.headers.get("content-type") != "application/json":
                return answer(seen, _problem(400, "malformed-request", "not a report"))
            try:
                ReportBody.model_validate_json(raw)
            except ValidationError as e:
                return answer(seen, _problem(400, "malformed-request", str(e)[:200]))
            seen.body = json.loads(raw)  # as sent
            refused = refusal(seen)
            if refused is not None:
                return answer(seen, refused)
            if self.hold_reports is not None:
                await self.hold_reports.wait()
            if len(self.reports) <= self.rate_limited_reports:
                headers = {"Retry-After": self.retry_after}
                return answer(seen, _problem(429, "rate-limited", "too many reports", headers))
            content = {"nextReportAfterSeconds": self.next_report_after}
            return answer(seen, JSONResponse(status_code=202, content=content))

        return app

    async def start(self) -> None:
        config = uvicorn.Config(
            self._app(),
            host="127.0.0.1",
            port=self.port,
            ssl_certfile=str(self._cert_file),
            ssl_keyfile=str(self._key_file),
            http="h11",
            ws="none",
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the contract broker stopped during startup")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self.hold_reports is not None:
            self.hold_reports.set()
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self._task, timeout=10)
        self._server = self._task = None


# -- shared by the report and revocation tests ----------------------------------------------


@pytest.fixture(name="broker")
async def broker_fixture(tmp_path: Path) -> AsyncIterator[ContractBroker]:
    """The contract broker; import `broker_fixture` into a test module to use `broker`."""
    server = ContractBroker(tmp_path)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def set_connection(
    env: AgentEnv, state: str, *, error: str = "", not_after: str | None = None
) -> None:
    """The CompassConnection as compass-runtime-agent writes it (with the certificate's expiry)."""
    env.set_connection(state, error=error)
    if not_after is not None:
        status: dict[str, Any] = {
            "connectionState": state,
            "connectionStatus": {"certificateStatus": {"notAfter": not_after}, "error": error},
        }
        env.cluster.custom.patch_cluster_custom_object(
            *CC, "compass-connection", {"status": status}
        )


def reports_total(agent: Any, outcome: str) -> float:
    value = agent.metrics.registry.get_sample_value(
        "compass_agent_reports_total", {"outcome": outcome}
    )
    return float(value or 0.0)


async def enabled_with_token(env: AgentEnv, token: str = "ott-1") -> None:
    env.put_kyma(modules=["application-connector"])
    await eventually(lambda: (env.secret_data() or {}).get("TOKEN") == token, what=token)
