"""A typed async Director client: one GraphQL POST per operation, OAuth and `Tenant` on each.

Holds: every call goes through the Director limiter (breaker, capacity schedule, concurrency
limit), with the reservation of the request it belongs to when it belongs to one; every failure
leaves as `DirectorRetryable` or `DirectorPermanent` (see `director.classification`), and says
whether it may have written; a mutation's answer that carries its data next to errors in fields
resolved after the commit is the mutation's result; every answer to a writing call that may have
written is told to `on_uncertain`; tokens are never logged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from control_plane_broker.capped import MIB, BodyTooLarge, read_capped
from control_plane_broker.director import documents as docs
from control_plane_broker.director.answers import (
    DirectorRuntime,
    GraphQLError,
    OneTimeToken,
    RuntimePage,
    RuntimeRegisterInput,
)
from control_plane_broker.director.classification import (
    WRITING_OPERATIONS,
    AnswerError,
    DirectorNotFound,
    DirectorPermanent,
    DirectorRetryable,
    classify,
    committed,
    may_have_written,
)
from control_plane_broker.director.oauth import OAuthTokenSource
from control_plane_broker.overload.director_limiter import CallerPresent, DirectorLimiter
from control_plane_broker.overload.reservations import Reservation
from kubeapi import describe_transport_error

# httpx errors raised before any byte of the request left: nothing reached Director.
UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
PAGE_SIZE = 100  # Director's maximum for `first`
MAX_PAGES = 50  # 5,000 runtimes with one label value is not an answer we can act on
# A page of 100 runtimes with their labels is well under 1 MiB; beyond this an answer is not
# read (a body read whole can take the broker over its memory limit).
MAX_ANSWER_BYTES = 4 * MIB

M = TypeVar("M", bound=BaseModel)


def parse_field(data: dict[str, Any], key: str, model: type[M], operation: str) -> M:
    """`data[key]` as `model`; anything else Director sends is its fault, not a crash of ours."""
    try:
        return model.model_validate(data[key])
    except (KeyError, TypeError, ValidationError) as exc:
        raise DirectorPermanent(f"{operation}: unexpected answer from Director") from exc


def label_query(value: str) -> str:
    """Director matches `query` by JSON containment: a string label is matched by its JSON form."""
    return json.dumps(value)


class DirectorApi(Protocol):
    """What the rest of the broker calls on Director: `DirectorClient`, or a test double."""

    async def runtimes_by_label(
        self, *, tenant: str, key: str, value: str, reservation: Reservation | None = None
    ) -> list[DirectorRuntime]: ...

    async def register_runtime(
        self, *, tenant: str, spec: RuntimeRegisterInput, reservation: Reservation | None = None
    ) -> DirectorRuntime: ...

    async def unregister_runtime(self, *, tenant: str, runtime_id: str) -> bool: ...

    async def request_one_time_token(
        self,
        *,
        tenant: str,
        runtime_id: str,
        reservation: Reservation | None = None,
        follow_up: bool = False,
        caller_present: CallerPresent | None = None,
    ) -> OneTimeToken: ...

    async def set_runtime_label(
        self, *, tenant: str, runtime_id: str, key: str, value: Any
    ) -> None: ...

    async def runtime(
        self, *, tenant: str, runtime_id: str, reservation: Reservation | None = None
    ) -> DirectorRuntime | None: ...


class DirectorClient:
    def __init__(
        self,
        *,
        http: httpx.AsyncClient,
        url: str,
        oauth: OAuthTokenSource,
        limiter: DirectorLimiter,
        on_uncertain: Callable[[str, str], None] | None = None,
    ) -> None:
        """`on_uncertain(operation, message)`: an answer to a writing call that does not prove
        what Director wrote (`director.uncertain_answers`)."""
        self._http = http
        self._url = url
        self._oauth = oauth
        self._limiter = limiter
        self._on_uncertain = on_uncertain

    async def _execute(
        self,
        document: str,
        variables: dict[str, Any],
        *,
        tenant: str,
        operation: str,
        subject: str,
        reservation: Reservation | None = None,
        follow_up: bool = False,
        then: int = 0,
        caller_present: CallerPresent | None = None,
    ) -> dict[str, Any]:
        """`subject`: the runtime the call is about (its Compass ID, name or label value), so
        the breaker can tell one runtime's internal errors from Director's. `reservation`: the
        request's the call belongs to (`DirectorLimiter.call`)."""

        async def attempt() -> dict[str, Any]:
            for second_try in (False, True):
                # A failing token endpoint raises before the request leaves: nothing written.
                token = await self._oauth.token()
                try:
                    async with self._http.stream(
                        "POST",
                        self._url,
                        json={"query": document, "variables": variables},
                        headers={"Authorization": f"Bearer {token}", "Tenant": tenant},
                    ) as response:
                        status = response.status_code
                        raw = await read_capped(response, MAX_ANSWER_BYTES, what=operation)
                except httpx.HTTPError as exc:
                    raise DirectorRetryable(
                        f"{operation}: {describe_transport_error(exc)}",
                        maybe_written=not isinstance(exc, UNSENT),
                    ) from exc
                except BodyTooLarge as exc:
                    # Sent and answered: Director may have acted.
                    raise DirectorRetryable(str(exc), maybe_written=True) from None
                if status == 401 and not second_try:
                    self._oauth.invalidate()  # revoked or expired early: fetch a new one once
                    continue
                return self._parse(status, raw, operation)
            raise AssertionError("unreachable")

        try:
            return await self._limiter.call(
                attempt,
                reservation=reservation,
                subject=subject,
                follow_up=follow_up,
                then=then,
                caller_present=caller_present,
            )
        except DirectorRetryable as exc:
            if operation in WRITING_OPERATIONS and may_have_written(exc):
                self._tell_uncertain(operation, str(exc))
            raise

    def _tell_uncertain(self, operation: str, message: str) -> None:
        if self._on_uncertain is not None:
            self._on_uncertain(operation, message)

    def _parse(self, status: int, raw: bytes, operation: str) -> dict[str, Any]:
        body: Any = None
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            body = None
        raw_errors = body.get("errors") if isinstance(body, dict) else None
        try:
            errors = [GraphQLError.model_validate(e) for e in raw_errors or []]
        except (TypeError, ValidationError):
            errors = [GraphQLError(message="malformed GraphQL error")]
        message = f"{operation}: HTTP {status}"
        if errors:
            message += ": " + "; ".join(e.message[:200] for e in errors[:3])
        found = [
            AnswerError(e.code, e.message, depth=len(e.path) if e.path is not None else 0)
            for e in errors
        ]
        data = body.get("data") if isinstance(body, dict) else None
        if (
            status == 200
            and operation in WRITING_OPERATIONS
            and committed(found)
            and isinstance(data, dict)
            and isinstance(data.get(operation), dict)
        ):
            # The mutation committed; a field resolved after it (in a transaction of its own)
            # failed. Its result is the mutation's: the ID in it is what Director wrote.
            self._tell_uncertain(operation, message)
            return data
        problem = classify(status=status, errors=found, message=message)
        if problem is not None:
            raise problem
        if not isinstance(data, dict):
            raise DirectorRetryable(f"{operation}: answer without data", maybe_written=True)
        return data

    async def runtimes_by_label(
        self, *, tenant: str, key: str, value: str, reservation: Reservation | None = None
    ) -> list[DirectorRuntime]:
        found: list[DirectorRuntime] = []
        after: str | None = None
        for _ in range(MAX_PAGES):
            data = await self._execute(
                docs.RUNTIMES_BY_LABEL,
                {
                    "filter": [{"key": key, "query": label_query(value)}],
                    "first": PAGE_SIZE,
                    "after": after,
                },
                tenant=tenant,
                operation="runtimes",
                subject=value,
                reservation=reservation,
            )
            page = parse_field(data, "runtimes", RuntimePage, "runtimes")
            found.extend(page.data)
            if not page.page_info.has_next_page or not page.page_info.end_cursor:
                return found
            after = page.page_info.end_cursor
        raise DirectorPermanent("runtimes: more pages than any Kyma runtime can have")

    async def register_runtime(
        self, *, tenant: str, spec: RuntimeRegisterInput, reservation: Reservation | None = None
    ) -> DirectorRuntime:
        data = await self._execute(
            docs.REGISTER_RUNTIME,
            {"in": spec.model_dump(exclude_none=True)},
            tenant=tenant,
            operation="registerRuntime",
            subject=spec.name,
            reservation=reservation,
            then=1,  # the token of the request that registers
        )
        return parse_field(data, "registerRuntime", DirectorRuntime, "registerRuntime")

    async def unregister_runtime(self, *, tenant: str, runtime_id: str) -> bool:
        """True when unregistered now, False when it was already gone (code 20 counts as done)."""
        try:
            await self._execute(
                docs.UNREGISTER_RUNTIME,
                {"id": runtime_id},
                tenant=tenant,
                operation="unregisterRuntime",
                subject=runtime_id,
            )
        except DirectorNotFound:
            return False
        return True

    async def request_one_time_token(
        self,
        *,
        tenant: str,
        runtime_id: str,
        reservation: Reservation | None = None,
        follow_up: bool = False,
        caller_present: CallerPresent | None = None,
    ) -> OneTimeToken:
        """`follow_up`: the request already spent a Director call (it registered the runtime),
        so its token goes before requests that have not started yet. `caller_present`: asked
        once a slot is free; a token nobody would receive is not requested (`CallerGone`)."""
        op = "requestOneTimeTokenForRuntime"
        data = await self._execute(
            docs.REQUEST_OTT,
            {"id": runtime_id},
            tenant=tenant,
            operation=op,
            subject=runtime_id,
            reservation=reservation,
            follow_up=follow_up,
            caller_present=caller_present,
        )
        return parse_field(data, op, OneTimeToken, op)

    async def set_runtime_label(
        self, *, tenant: str, runtime_id: str, key: str, value: Any
    ) -> None:
        await self._execute(
            docs.SET_RUNTIME_LABEL,
            {"runtimeID": runtime_id, "key": key, "value": value},
            tenant=tenant,
            operation="setRuntimeLabel",
            subject=runtime_id,
        )

    async def runtime(
        self, *, tenant: str, runtime_id: str, reservation: Reservation | None = None
    ) -> DirectorRuntime | None:
        """The runtime, or None when Director has no such runtime in this tenant."""
        data = await self._execute(
            docs.RUNTIME_BY_ID,
            {"id": runtime_id},
            tenant=tenant,
            operation="runtime",
            subject=runtime_id,
            reservation=reservation,
        )
        if data.get("runtime") is None:
            return None
        return parse_field(data, "runtime", DirectorRuntime, "runtime")
