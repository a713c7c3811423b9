"""Admission to Director's capacity: a booking calendar instead of a queue that collapses.

The broker has `capacity` slots for Director calls, and a request that books k calls holds them
for about k·`latency` seconds in all (measured). A request books k·latency/capacity seconds of
that capacity right after everything booked before it. When its turn comes within `max_wait`
it is admitted and queues for a slot; otherwise it is deferred: answered 503 with
`Retry-After` = the time until its turn, and its booking is kept as a ticket under the runtime's
key. When the agent comes back at that time its capacity is still reserved, so it is admitted
instead of booking again.

What this buys: after an outage or a restart the whole fleet asks at once; instead of thousands
of requests waiting in one queue until they time out (and asking again, and again), each agent
is told when to come back, and the fleet arrives spread over exactly the time Director needs.

Agents add jitter to `Retry-After` (agent/retry_policy.py: up to a tenth of it, at least a second),
so an agent told its exact turn arrives after it, and the capacity booked for it idles meanwhile:
measured, Director then served 72 % of what it could. `advise` answers a time early enough that
the agent is there by its turn (it is admitted up to `max_wait` before it and waits in the queue,
keeping Director busy), and never so early that it would be sent away again. It aims a quarter
of `max_wait` before the turn, not at it: turns are estimates, and an agent that waits a little
in the queue costs an open connection, while one that arrives after Director ran out of work
costs Director's capacity (measured, cold start at N = 1,000: the queue ran dry a second before
the first deferred agents were back).

Whether a request is admitted is judged at the moving average of Director's calls against the
queue in front of it; what any request books, and a deferred request's turn, are counted at the
pace of the fastest of Director's recent calls. A turn booked too late leaves Director idle until
its agent is back (measured, cold start at N = 5,000: a burst that slowed the broker's loop for
a second pushed the average to 0.9 s a call, the turns booked in that second spread over 19 s
more than Director needed, and Director sat idle for those 19 s; when only admitted requests
still booked at the average, the ones admitted in that second pushed the first deferred turn
9 s out, and Director idled 6 s); a turn booked too early costs only the agent's visit: it
finds the queue long and its turn moves back with the calendar's shift.

Turns are booked with the latency known at the time (while Director is down, an old guess).
When Director serves slower than that, every later turn is late by as much: the first ticket
that comes back to a queue longer than promised moves all turns from its own on back by what
the queue is late (`shift`), instead of each overdue agent being sent away for a second and
asking again. Measured before, outage at N = 5,000: 300 such 503s a second, and a broker busy
answering them served Director 57 calls a second of its 80.

What `latency` measures is the request's whole use of the slots, per call it booked, as the
broker experiences it (`Admissions`): from each slot's grant (the moment it is handed over, not
when the event loop gets round to resuming the waiter) to the answer parsed, summed over every
call the request makes, divided by the calls it booked. Not Director's latency alone: measured,
cold start of N = 1,000 against the real Director, the broker's CPU busy: a call took 73 ms in
Director's hands, its slot was held 85 ms (the loop's delay before the call went out), and every
request that booked 2 calls made 4 (two look-ups before registering, which issuing does not
book): 171 ms of slot time per booked call. Priced so, the calendar expected 27-35 requests a
second in each 5 s window and the broker served 28.5; priced at Director's 73 ms it expected 68.
The queue in front (`queued_calls`) is counted in the same unit: what admitted requests booked
and their calls have not held yet (booked calls less slot seconds held / `latency`, summed), from
the moment a request's first call asks for a slot to its end, plus calls that belong to no
request (the reconciler's). Before its first call a request is in the broker's own work (its
mapping written to KCP) and counts only in the bookings (`booked_until`); once its calls have
held what it booked, it is writing its status and answering, and counts nothing. Measured on
the real Director (N = 1,000, 2 calls per runtime, 2 cores shared with other engineers' work,
23 interleaved runs, docs/benchmarks.md section 11): counted as booked calls until the request
ended (b0b3ac5), the calendar once saw 420 calls in front while 6 held slots and none waited
(the rest were requests in KCP writes); up to 1,378 agents were deferred, Director's 10 slots
held 5.7-8.5 calls on average and the fleet took a median 1.67x the capacity bound (8 runs);
counted so, no agent was deferred, 7.6-8.8 slots were busy, median 1.37x (5 runs; the
admission before b0b3ac5, which counted only the calls waiting for a slot: 1.79x, 8 runs). What
it does not see is the broker's own time after admission: with other work taking 35 CPU-s of
the 2 cores during the run (KCP's API server starved), a registered request spent a median 15 s
in KCP writes before it answered and 472 agent attempts timed out; the count of b0b3ac5 deferred
instead (0 timeouts in its 8 runs, one with 40 CPU-s of other work), the one before b0b3ac5
timed out in 3 of 8.

Holds: pure (the clock is an argument); no request waits longer than `max_wait` for its turn by
the estimate, also one that comes back on its ticket while the queue in front of Director is
longer than the calendar expected; the order of booked turns survives a shift; a key holds at
most one ticket; tickets expire, so agents that never come back do not hold capacity forever;
while Director is down a ticket keeps its place until its turn; memory is bounded by the number
of distinct keys with a ticket.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

# What an agent adds to Retry-After (agent/retry_policy.py): up to this share of it, at least a
# second.
CLIENT_JITTER_SHARE = 0.1
CLIENT_MIN_JITTER = 1.0
LEAD_SHARE_OF_MAX_WAIT = 0.25  # how far before its turn an agent is aimed to arrive


def advise(wait: float, *, max_wait: float) -> float:
    """Whole seconds to answer in `Retry-After` for a turn `wait` seconds ahead: a time from which
    an agent arrives a quarter of `max_wait` before its turn despite its jitter, but not more
    than `max_wait` before it (it would only be deferred again). At least one second."""
    lead = LEAD_SHARE_OF_MAX_WAIT * max(max_wait, 0.0)
    latest = min(wait / (1 + CLIENT_JITTER_SHARE), wait - CLIENT_MIN_JITTER) - lead
    earliest = wait - max(max_wait, 0.0)
    # (the epsilon: 33 / 1.1 is 29.999... in binary, and 30 + its tenth is still on time)
    return float(max(1, math.floor(latest + 1e-9), math.ceil(earliest - 1e-9)))


@dataclass(frozen=True)
class GuardSnapshot:
    """What an operator watches to see whether Director or the broker is the limit."""

    in_flight: int  # calls holding a slot
    waiting: int  # calls admitted and waiting for a slot
    call_seconds: float  # the calendar's estimate of one call (slot held)
    booked_ahead_seconds: float  # how far ahead Director's capacity is booked
    tickets: int  # deferred requests holding a booked turn
    shift_seconds: float  # how far the booked turns moved back because Director fell behind
    slot_timeouts: int  # calls refused after waiting twice the queue timeout for a slot


@dataclass(frozen=True)
class Admitted:
    pass


@dataclass(frozen=True)
class Deferred:
    retry_after: float  # seconds until the booked turn


Verdict = Admitted | Deferred


@dataclass
class Request:
    """An admitted request's use of Director: the calls it booked and the slot time its calls
    held (grant to answer), over every call it made, booked or not."""

    booked: int
    slot_seconds: float = 0.0
    calls: int = 0
    failed: bool = False
    finished: bool = False
    asked: bool = False  # its first call has asked for a slot


@dataclass
class Admissions:
    """Admitted requests that have not finished, and what a finished request cost per call it
    booked: the calendar's measure of a call (see above).

    In the queue in front of Director (`ahead`) a request counts from its first call's asking
    for a slot until it ends, with what it booked less what its calls have held so far, in
    booked calls at the calendar's price: `started` - `spent_seconds` / price, summed over
    those requests (one that held more than it booked makes up for one that held less)."""

    outstanding: int = 0  # booked calls of admitted requests not finished
    started: int = 0  # booked calls of requests that asked for a slot and have not finished
    spent_seconds: float = 0.0  # slot seconds those requests' answered calls held

    def admit(self, calls: int) -> Request:
        request = Request(booked=max(calls, 1))
        self.outstanding += request.booked
        return request

    def asking(self, request: Request) -> None:
        """A call of `request` asks for a slot: from now on the request is in the queue."""
        if request.asked or request.finished:
            return
        request.asked = True
        self.started += request.booked

    def spent(self, request: Request, seconds: float, *, ok: bool) -> None:
        """One call of `request` held its slot `seconds`, from grant to answer."""
        held = max(seconds, 0.0)
        request.calls += 1
        request.slot_seconds += held
        request.failed |= not ok
        if request.asked and not request.finished:
            self.spent_seconds += held

    def ahead(self, price: float) -> float:
        """Booked calls still to be served of the requests in the queue, `price` the slot
        seconds of a booked call (the calendar's latency)."""
        if self.started <= 0:
            return 0.0
        return max(0.0, self.started - self.spent_seconds / max(price, 1e-9))

    def finish(self, request: Request) -> float | None:
        """The request is over (answered or given up): slot seconds per booked call, the
        calendar's sample; None when it tells nothing about a call's cost (no call made, one
        failed: a failing Director's timeouts are no pace) or it was finished before."""
        if request.finished:
            return None
        request.finished = True
        self.outstanding -= request.booked
        if request.asked:
            self.started -= request.booked
            self.spent_seconds -= request.slot_seconds
            if self.started <= 0:
                self.started, self.spent_seconds = 0, 0.0  # no rounding left behind
        if request.calls == 0 or request.failed:
            return None
        return request.slot_seconds / request.booked


@dataclass
class _Ticket:
    turn: float  # when the booked capacity starts, before the calendar's `shift`
    expires: float  # likewise


@dataclass
class Calendar:
    capacity: int
    max_wait: float
    # slot seconds per booked call (see above): a first guess, replaced by measurements
    latency: float = 0.1
    ticket_grace: float = 60.0  # how late after its turn a ticket is still honoured
    smoothing: float = 0.2  # weight of a new latency measurement (EWMA)
    max_latency: float = 30.0  # a hung call must not push bookings into the next hour
    booked_until: float = 0.0
    shift: float = 0.0  # added to every ticket's turn: how late Director is against the bookings
    recent_calls: int = 32  # the fastest of this many recent calls spaces the turns far ahead
    _tickets: dict[str, _Ticket] = field(default_factory=dict)
    _recent: deque[float] = field(default_factory=deque)

    def seconds_per_call(self) -> float:
        return self.latency / max(self.capacity, 1)

    def seconds_per_call_ahead(self) -> float:
        """The pace of turns far ahead: the fastest recent call, never slower than average."""
        fastest = min(self._recent, default=self.latency)
        return min(fastest, self.latency) / max(self.capacity, 1)

    def book(
        self,
        key: str,
        *,
        calls: int,
        now: float,
        queued_calls: float = 0,
        not_before: float | None = None,
    ) -> Verdict:
        """Admit a request of `calls` Director calls for `key` now, or tell it when to return.

        `queued_calls` is what really waits for a slot at this moment: the calendar never
        believes Director to be freer than the queue in front of it shows. `not_before` is set
        while Director is down (the breaker is open): nobody is admitted, everybody gets a turn
        after the next probe, so that when Director is back the fleet is already spread over
        the time it needs, instead of returning at once or after its backoff has grown long."""
        ticket = self._tickets.get(key)
        if ticket is not None:
            turn = ticket.turn + self.shift
            if now > ticket.expires + self.shift:
                self._drop(key)
            elif turn - now > self.max_wait or (not_before is not None and turn > now):
                # Not its turn yet (or Director is still down and its turn still ahead): the
                # same turn again, nothing booked twice, its place in the fleet kept.
                return Deferred(retry_after=turn - now)
            else:
                behind = queued_calls * self.seconds_per_call() - self.max_wait
                if not_before is None and behind > 0:
                    # Director is behind the calendar (its latency grew after the turns were
                    # booked, or another replica shares it): admitted now, it would wait
                    # longer than promised, perhaps past the agent's timeout. Its turn and
                    # every later one move back by what the queue is late; places are kept.
                    late = now + behind - turn
                    if late > 0:
                        self.shift += late
                        self.booked_until += late
                    return Deferred(retry_after=ticket.turn + self.shift - now)
                self._drop(key)  # its capacity was booked when it was deferred
                if not_before is None:
                    return Admitted()
        # Whether it may queue now is judged at the average (the queue must not outlast
        # `max_wait`); where its booking ends, which is where the next deferred turn starts, at
        # the pace ahead (see above), admitted or not.
        pace = self.seconds_per_call_ahead()
        turn = max(self.booked_until, now + queued_calls * pace)
        if not_before is None and self._admissible(now, queued_calls):
            self.booked_until = turn + calls * pace
            return Admitted()
        if not_before is not None:
            turn = max(turn, not_before)
        wait = turn - now
        self.booked_until = turn + calls * pace
        self._tickets[key] = _Ticket(
            turn=turn - self.shift, expires=turn + self.ticket_grace - self.shift
        )
        if len(self._tickets) > 4 * 1024 and len(self._tickets) % 1024 == 0:
            self._expire(now)
        return Deferred(retry_after=wait)

    def _admissible(self, now: float, queued_calls: float) -> bool:
        turn = max(self.booked_until, now + queued_calls * self.seconds_per_call())
        return turn - now <= self.max_wait

    def cancel(self, key: str) -> None:
        """The request will not need its booking (e.g. refused later for another reason)."""
        self._drop(key)

    def _drop(self, key: str) -> None:
        self._tickets.pop(key, None)
        if not self._tickets:
            self.shift = 0.0  # no turn left to keep in order: the next herd starts afresh

    def observe(self, seconds: float) -> None:
        """A booked call cost `seconds` of slot time (`Admissions.finish`; a call outside any
        request, its own): the estimate follows what really happens."""
        sample = min(max(seconds, 0.0), self.max_latency)
        self.latency += self.smoothing * (sample - self.latency)
        self._recent.append(sample)
        if len(self._recent) > self.recent_calls:
            self._recent.popleft()

    def tickets(self) -> int:
        return len(self._tickets)

    def _expire(self, now: float) -> None:
        for key in [k for k, t in self._tickets.items() if now > t.expires + self.shift]:
            self._drop(key)
