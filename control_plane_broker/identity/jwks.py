"""Identity by local signature check with the runtime's ServiceAccount issuer keys (OIDC/JWKS).

Keys come from the runtime API server (`/openid/v1/jwks`, issuer from
`/.well-known/openid-configuration`) through its kubeconfig, or from a configured issuer URL
(`{runtime_id}` is substituted), or, for a BYOC runtime enrolled with an approved issuer
(`verify_with_issuer`, see `enrolment/enrolment_service.py`), from that issuer's OIDC discovery
document (`issuer_discovery`).
An unknown `kid` triggers one refetch, at most every `refetch_seconds` per runtime (or issuer),
so garbage tokens cannot make us hammer the cluster; callers that need the same keys at the same
time share one fetch (a cold start of thousands of runtimes costs one fetch per runtime, not one
per request), and a failed fetch is not repeated for `refetch_seconds` (an unreachable issuer is
not asked again per request). Keys are also refetched once they are `max_age_seconds` old, so a
key the cluster retired (rotated out or revoked) stops being trusted within that time.
RS256 and ES256 only; iss, aud, exp, nbf checked. No call per request once keys are known.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import jwt

from control_plane_broker.capped import KIB, BodyTooLarge, read_capped
from control_plane_broker.errors import ControlPlaneUnavailable, IdentityNotProven, RuntimeApiSilent
from control_plane_broker.identity import claims, issuer_discovery
from control_plane_broker.identity.claims import Identity
from control_plane_broker.kube.runtime_access import RuntimeAccess
from control_plane_broker.singleflight import SingleFlight
from kubeapi import KubeError, KubeUnavailable

log = logging.getLogger(__name__)

MAX_VERDICTS = 20_000
MAX_SOURCES = 20_000  # runtimes (or issuers) whose keys or failed fetch are remembered
JWKS_ACCEPT = "application/jwk-set+json, application/json"  # the API server refuses plain JSON
# A discovery document is well under 2 KiB and a key set of a few keys a few KiB: an answer
# beyond this is refused unread (a 64 MiB document took the broker over its memory limit).
MAX_ISSUER_BODY_BYTES = 256 * KIB


def _too_large(exc: BodyTooLarge) -> ControlPlaneUnavailable:
    log.warning("issuer answer refused", extra={"problem": str(exc)})
    return ControlPlaneUnavailable(
        f"the issuer's answer is larger than {exc.limit} bytes", retry_after=30
    )


@dataclass
class _Keys:
    issuer: str
    keys: dict[str, jwt.PyJWK]
    fetched_at: float


Fetch = Callable[[], Awaitable[_Keys]]
_V = TypeVar("_V")


def _store(memory: OrderedDict[str, _V], key: str, value: _V) -> None:
    memory[key] = value
    memory.move_to_end(key)
    while len(memory) > MAX_SOURCES:
        memory.popitem(last=False)


class JwksVerifier:
    mode = "jwks"

    def __init__(
        self,
        access: RuntimeAccess,
        *,
        audience: str,
        allowed: frozenset[tuple[str, str]],
        issuer_url: str,
        http: httpx.AsyncClient,
        clock: Callable[[], float],
        refetch_seconds: float = 10.0,
        max_age_seconds: float = 300.0,
        leeway: float = 5.0,
        max_concurrent_fetches: int = 16,
    ) -> None:
        self._access = access
        self._audience = audience
        self._allowed = allowed
        self._issuer_url = issuer_url
        self._http = http
        self._clock = clock
        self._refetch = refetch_seconds
        self._max_age = max_age_seconds
        self._leeway = leeway
        # Per runtime (or issuer), least recently stored first, at most MAX_SOURCES each.
        self._keys: OrderedDict[str, _Keys] = OrderedDict()
        # fingerprint of (runtime, token) → (when the key set that verified it was fetched, ...)
        self._verdicts: OrderedDict[str, tuple[float, Identity]] = OrderedDict()
        self._failed_at: OrderedDict[str, float] = OrderedDict()
        self._fetches: SingleFlight[_Keys] = SingleFlight()
        # Fetches wait here rather than in the HTTP client's pool (whose bookkeeping grows with
        # its queue); a cold start of thousands of runtimes fetches this many keys at a time.
        self._fetch_slots = asyncio.Semaphore(max_concurrent_fetches)

    async def _fetch(self, runtime_id: str) -> _Keys:
        try:
            if self._issuer_url:
                issuer = self._issuer_url.format(runtime_id=runtime_id)
                jwks: Any = await self._get_json(
                    issuer.rstrip("/") + "/openid/v1/jwks", accept=JWKS_ACCEPT
                )
            else:
                client = await self._access.client_for(runtime_id)
                if self._access.unreachable_for(client) is not None:
                    raise ControlPlaneUnavailable(
                        "the runtime API server did not answer recently", retry_after=5
                    )
                try:
                    discovery = await client.get("/.well-known/openid-configuration")
                    issuer = str(discovery["issuer"])
                    jwks = await client.get("/openid/v1/jwks", accept=JWKS_ACCEPT)
                except KubeUnavailable as exc:
                    if not isinstance(exc.__cause__, httpx.TransportError):
                        raise
                    self._access.note_unreachable(client)
                    raise RuntimeApiSilent(
                        "cannot fetch the runtime's issuer keys", retry_after=5
                    ) from exc
        except BodyTooLarge as exc:
            raise _too_large(exc) from None
        except (httpx.HTTPError, KubeError, KeyError, ValueError) as exc:
            raise ControlPlaneUnavailable(
                "cannot fetch the runtime's issuer keys", retry_after=5
            ) from exc
        return self._parsed(issuer, jwks)

    async def _discover(self, issuer: str) -> _Keys:
        """An enrolled issuer's keys, found by its OIDC discovery document (redirects are not
        followed: the approved origin answers itself)."""
        try:
            document = await self._get_json(
                issuer_discovery.discovery_url(issuer), accept="application/json"
            )
            jwks_uri = issuer_discovery.jwks_uri_from_discovery(issuer, document)
            jwks: Any = await self._get_json(jwks_uri, accept=JWKS_ACCEPT)
        except issuer_discovery.DiscoveryInvalid as exc:
            log.warning("enrolled issuer unusable", extra={"issuer": issuer, "problem": str(exc)})
            raise ControlPlaneUnavailable(
                f"the approved issuer's discovery document is unusable: {exc}", retry_after=30
            ) from exc
        except BodyTooLarge as exc:
            raise _too_large(exc) from None
        except (httpx.HTTPError, ValueError) as exc:
            raise ControlPlaneUnavailable(
                "cannot fetch the approved issuer's keys", retry_after=5
            ) from exc
        return self._parsed(issuer, jwks)

    async def _get_json(self, url: str, *, accept: str) -> Any:
        """An issuer's JSON answer, at most `MAX_ISSUER_BODY_BYTES` (`BodyTooLarge`, a
        ValueError, beyond: the fetch fails like any unusable answer)."""
        async with self._http.stream("GET", url, headers={"Accept": accept}) as response:
            response.raise_for_status()
            raw = await read_capped(response, MAX_ISSUER_BODY_BYTES, what="issuer")
        return json.loads(raw)

    def _parsed(self, issuer: str, jwks: Any) -> _Keys:
        keys: dict[str, jwt.PyJWK] = {}
        listed = jwks.get("keys") if isinstance(jwks, dict) else None
        for raw in listed if isinstance(listed, list) else []:
            if not isinstance(raw, dict):
                continue
            try:
                key = jwt.PyJWK.from_dict(raw)
            except jwt.PyJWTError:
                continue  # an algorithm we do not use
            if key.key_id:
                keys[key.key_id] = key
        return _Keys(issuer=issuer, keys=keys, fetched_at=self._clock())

    async def _fetch_shared(self, source: str, fetch: Fetch) -> _Keys:
        failed_at = self._failed_at.get(source)
        if failed_at is not None and self._clock() - failed_at < self._refetch:
            raise ControlPlaneUnavailable(
                "the runtime's issuer keys are unavailable", retry_after=5
            )
        try:
            async with self._fetch_slots:
                keys = await fetch()
        except ControlPlaneUnavailable:
            _store(self._failed_at, source, self._clock())
            raise
        self._failed_at.pop(source, None)
        _store(self._keys, source, keys)
        return keys

    async def _key_for(self, source: str, fetch: Fetch, kid: str) -> tuple[str, jwt.PyJWK, float]:
        cached = self._keys.get(source)
        age = None if cached is None else self._clock() - cached.fetched_at
        if (
            cached is None
            or age is None
            or age >= self._max_age
            or (kid not in cached.keys and age >= self._refetch)
        ):
            cached = await self._fetches.do(source, lambda: self._fetch_shared(source, fetch))
        key = cached.keys.get(kid)
        if key is None:
            raise IdentityNotProven("token signed by an unknown key", reason="unknown-kid")
        return cached.issuer, key, cached.fetched_at

    async def verify(self, *, runtime_id: str, headers: Mapping[str, str]) -> Identity:
        token = claims.bearer_token(headers.get("authorization"))
        return await self._verified(
            runtime_id,
            token,
            scope=runtime_id,
            source=runtime_id.lower(),
            fetch=lambda: self._fetch(runtime_id),
        )

    async def verify_with_issuer(self, *, runtime_id: str, token: str, issuer: str) -> Identity:
        """For a runtime enrolled with an approved `issuer` (no kubeconfig): keys from that
        issuer's discovery document. Keys are cached per issuer (an issuer URL holds `://`, a
        runtime ID never does); verdicts per runtime *and* issuer, so a changed or withdrawn
        approval is never answered from a verdict of the old one."""
        return await self._verified(
            runtime_id,
            token,
            scope=f"{runtime_id}\0{issuer}",
            source=issuer,
            fetch=lambda: self._discover(issuer),
        )

    async def _verified(
        self, runtime_id: str, token: str, *, scope: str, source: str, fetch: Fetch
    ) -> Identity:
        # A token verified before is not verified again until it expires or its key could have
        # been retired (the key set's refresh age): a signature check is most of a token's CPU.
        fingerprint = claims.token_fingerprint(scope, token)
        hit = self._verdicts.get(fingerprint)
        if hit is not None:
            keys_fetched_at, cached = hit
            expired = cached.expires_at is not None and cached.expires_at <= time.time()
            if not expired and self._clock() - keys_fetched_at < self._max_age:
                return cached
        keys_fetched_at, identity = await self._verify(runtime_id, token, source, fetch)
        self._verdicts[fingerprint] = (keys_fetched_at, identity)
        while len(self._verdicts) > MAX_VERDICTS:
            self._verdicts.popitem(last=False)
        return identity

    async def _verify(
        self, runtime_id: str, token: str, source: str, fetch: Fetch
    ) -> tuple[float, Identity]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise IdentityNotProven("not a JWT", reason="malformed") from exc
        if header.get("alg") not in claims.ISSUER_KEY_ALGORITHMS:
            raise IdentityNotProven("unsupported signature algorithm", reason="algorithm")
        try:
            issuer, key, fetched_at = await self._key_for(source, fetch, str(header.get("kid", "")))
        except IdentityNotProven as exc:
            if exc.reason != "unknown-kid":
                raise
            # Not signed by any key of this cluster: another cluster's token, or no identity.
            raise claims.refusal_for_foreign_token(
                token, audience=self._audience, now=time.time()
            ) from exc
        try:
            payload = jwt.decode(
                token,
                key=key.key,
                algorithms=list(claims.ISSUER_KEY_ALGORITHMS),
                audience=self._audience,
                issuer=issuer,
                leeway=self._leeway,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError as exc:
            raise IdentityNotProven("the token has expired", reason="expired") from exc
        except jwt.InvalidAudienceError as exc:
            raise IdentityNotProven("wrong audience", reason="audience") from exc
        except (jwt.InvalidIssuerError, jwt.InvalidSignatureError) as exc:
            # Another cluster's issuer, or a key id that collides with one of ours.
            raise claims.refusal_for_foreign_token(
                token, audience=self._audience, now=time.time()
            ) from exc
        except jwt.PyJWTError as exc:
            raise IdentityNotProven("token not valid", reason="invalid") from exc
        subject = str(payload.get("sub", ""))
        claims.check_service_account(subject, self._allowed)
        exp = payload.get("exp")
        return fetched_at, Identity(
            runtime_id=runtime_id,
            subject=subject,
            mode=self.mode,
            expires_at=float(exp) if isinstance(exp, int | float) else None,
        )
