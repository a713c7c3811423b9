"""Bodies read from outside, never larger than their cap.

Every answer the broker reads comes from a party that may be hostile or broken: an issuer an
operator approved (its discovery document and keys), a runtime's API server, Director, the OAuth
endpoint. Read whole, one 64 MiB discovery document took the broker from 79 to 289 MiB, over
its memory limit. So a body is read as a stream and given up once it passes its cap (after
content decoding, so a compressed bomb is caught at the cap too), and a declared length beyond
the cap is refused before a byte is read.
"""

from __future__ import annotations

import httpx

KIB = 1024
MIB = 1024 * KIB


class BodyTooLarge(ValueError):
    """An answer over its cap: refused as a whole, never parsed."""

    def __init__(self, what: str, limit: int) -> None:
        super().__init__(f"{what}: the answer exceeds {limit} bytes")
        self.limit = limit


async def read_capped(response: httpx.Response, limit: int, *, what: str) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(what, limit)
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge(what, limit)
    return bytes(body)
