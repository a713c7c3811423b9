"""What the door learns its pace from (`api/door.py`), told from where the time went. Pure
plumbing, no I/O.

The door measures how long a first contact holds its place and derives from it how many it lets
in a second. A hold that ended because a runtime's API server did not answer within its timeout
says nothing about that pace: learned from, one stalled runtime made the door believe it could
let in a few first contacts a second and send the fleet away for minutes. The identity check
that saw the timeout says so with `discount_hold()`; the door, which set `holding` for the
request, then leaves that hold out of its average. The call is carried by a context variable, so
the layers in between (the app, the use case) need not pass it on.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar, Token

_discount: ContextVar[Callable[[], None] | None] = ContextVar("door_hold", default=None)


def holding(discount: Callable[[], None]) -> Token[Callable[[], None] | None]:
    """Set by the door while a request holds a place; `discount` drops the hold's measure."""
    return _discount.set(discount)


def released(token: Token[Callable[[], None] | None]) -> None:
    _discount.reset(token)


def discount_hold() -> None:
    """The current request's hold ended in a timeout: not a measure of the door's pace."""
    discount = _discount.get()
    if discount is not None:
        discount()
