"""Calls in flight: the queue of a communicator, the `Work` handles of asynchronous calls, and bounded waits.

Calls on one communicator complete in the order they were issued. Each issued call is a *launch* of its plan
(plans.py) in the queue; only the head is started (one call at a time owns the windows and scratch), and
progress is made whenever the caller enters the communicator: a blocking call, `Work.wait()`, `Work.test()`,
or issuing another call. No progress thread: MPI is only ever called from the user's thread. A thread that waits
on one communicator also advances the calls it left in flight on its other communicators (as MPI progresses every
communicator): a rank waiting on B while its asynchronous call on A is what a peer waits for cannot deadlock.

Every wait is bounded (COLLECTIVES_TIMEOUT, per communicator and per call): a call that does not complete in
time raises CollectiveTimeoutError naming the collective, its number, the round and the peers it awaits.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable

from ..errors import CallMismatchError, CollectivesError, CollectiveTimeoutError, PeerFailedError
from .calls import check_timeout

SPIN_SECONDS = 0.002  # poll flat out this long after the last progress, then yield the CPU between polls
NAP_AFTER_SECONDS = 0.1  # idle this long (a late peer), then sleep between polls (up to 1 ms)


def poll_until(req, deadline: float | None) -> bool:
    """Poll `req` until it completes (True) or the monotonic `deadline` passes (False)."""
    nap = 0.0
    while not req.Test():
        if deadline is not None and time.monotonic() > deadline:
            return False
        nap = min(1e-3, nap * 2 or 1e-5)
        time.sleep(nap)
    return True


def wait_until(advance: Callable[[], bool], events: Callable[[], int], deadline: float | None,
               describe: Callable[[], BaseException], oversubscribed: bool) -> None:
    """Call `advance()` until it returns True, raising `describe()` once `deadline` (monotonic) passes.

    MPICH moves shared-memory data inside progress calls, so the waiter polls flat out while things move
    (`events()` changes). Without progress for SPIN_SECONDS (or at once with more ranks than cores) it yields the
    CPU on every poll: the peer it waits for may be waiting for a core. Sleeping would be worse: two napping
    peers delay each other by a nap each, so naps start only after NAP_AFTER_SECONDS of idling (a late peer).
    """
    last_events, last_progress, nap = events(), time.monotonic(), 0.0
    while not advance():
        now = time.monotonic()
        seen = events()
        if seen != last_events:
            last_events, last_progress, nap = seen, now, 0.0
        idle = now - last_progress
        if idle > NAP_AFTER_SECONDS:
            nap = min(1e-3, nap * 2 or 2e-5)
            time.sleep(nap)
        elif oversubscribed or idle > SPIN_SECONDS:
            os.sched_yield()
        if deadline is not None and now > deadline:
            raise describe()


def ranks_text(ranks) -> str:
    ranks = list(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def _text(exc: BaseException) -> str:
    get = getattr(exc, "Get_error_string", None)  # an MPI error says more through its error string
    return get() if get is not None else str(exc)


class Work:
    """Handle of an `async_op=True` call: `wait()` returns the output, `test()` polls (and makes progress)."""

    def __init__(self, queue: CallQueue, launch) -> None:
        self._queue = queue
        self._launch = launch

    def wait(self, timeout: float | None = None):
        """Block until done (at most `timeout` s, default the communicator's) and return the output."""
        if timeout is not None:
            timeout = check_timeout(timeout, "wait(timeout=)")
        self._queue.wait(self._launch, timeout)
        return self._launch.result

    def test(self) -> bool:
        """True once complete; advances this and earlier calls without blocking."""
        if not self._launch.done:
            self._queue.progress(blocking=False)
        return self._launch.done

    is_completed = test

    @property
    def seq(self) -> int:
        return self._launch.seq

    @property
    def algorithm(self) -> str:
        return self._launch.plan.choice.algorithm

    @property
    def reason(self) -> str:
        return self._launch.plan.choice.reason

    def __repr__(self) -> str:
        state = "done" if self._launch.done else "pending"
        return f"<Work #{self.seq} {self._launch.plan.collective} {self.algorithm} {state}>"


_in_flight: weakref.WeakSet = weakref.WeakSet()  # queues with calls in flight, every communicator of the process


def advance_others(queue) -> None:
    """Advance this thread's calls in flight on communicators other than `queue`'s, while it waits on that one
    (their errors stay theirs: a failure is recorded on that communicator, raised when its own caller waits)."""
    me = threading.get_ident()
    for other in list(_in_flight):
        if other is not queue and other.thread == me and other.launches:
            try:
                other.progress(blocking=False)
            except Exception:  # noqa: BLE001 - recorded on `other` (ctx.failure / the launch's error)
                pass



class CallQueue:
    """The communicator's calls in issue order; `ctx` (context.py) holds what a failure report needs."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.launches: deque = deque()
        self.completed = 0
        self.thread = 0  # the thread that issued the last call (only it advances this queue from another's wait)

    def __bool__(self) -> bool:
        return bool(self.launches)

    def submit(self, launch, async_op: bool, timeout: float | None):
        self.launches.append(launch)
        self.thread = threading.get_ident()
        _in_flight.add(self)
        self.ctx.fast = False
        if async_op:
            self.progress(blocking=False)
            return Work(self, launch)
        self.wait(launch, timeout)
        return launch.result

    def progress(self, blocking: bool = True) -> None:
        """Advance queued calls in issue order as far as possible without blocking. A mismatch fails that call on
        every rank (its handle re-raises) and the queue moves on; an MPI error (a dead peer) fails the
        communicator with PeerFailedError naming the peers."""
        while self.launches:
            head = self.launches[0]
            try:
                if not head.advance(blocking):
                    return
            except CallMismatchError as exc:
                self.ctx.note_mismatch(exc)
                head.error = exc
            except self.ctx.runtime.failure as exc:
                raise self.peer_failed(head, exc) from exc
            except CollectivesError as exc:  # the full check found different results
                head.error = exc
            except Exception as exc:
                # a local error after the call was issued (peers may already be in it): later calls could no
                # longer match, so the communicator fails; the error is raised as it is
                self.ctx.fail(exc)
                self.cancel_all()
                raise
            head.done = True
            self.completed += 1
            self.launches.popleft()
        _in_flight.discard(self)
        self.ctx.fast = self.ctx.ok

    def events(self) -> int:
        return self.completed * 1_000_003 + (self.launches[0].events if self.launches else 0)

    def wait(self, launch, timeout: float | None) -> None:
        if launch.done:
            if launch.error is not None:
                raise launch.error
            return
        ctx = self.ctx
        ctx.check_open()
        limit = ctx.timeout if timeout is None else timeout
        deadline = None if limit is None else time.monotonic() + limit

        def advance() -> bool:
            self.progress()
            if not launch.done and len(_in_flight) > 1:
                advance_others(self)
            return launch.done

        try:
            wait_until(advance, self.events, deadline, lambda: self.timeout_error(launch, limit),
                       ctx.host.oversubscribed)
        except CollectiveTimeoutError as exc:
            ctx.fail(exc)
            self.cancel_all()
            raise
        if launch.error is not None:
            raise launch.error

    def cancel_all(self) -> None:
        for launch in self.launches:
            launch.cancel()

    def peer_failed(self, head, exc: BaseException) -> PeerFailedError:
        peers = head.where()[2]
        labels = self.ctx.peer_labels(peers) if peers else "a peer (the MPI error names no rank; the call was " \
            "in its agreement or MPI's own collective)"
        err = PeerFailedError(
            f"rank {self.ctx.rank}: {head.plan.collective} #{head.seq} (algorithm {head.plan.choice.algorithm}) "
            f"failed: the runtime reported an error while communicating with {labels}: {_text(exc)}. The peer "
            "has probably died; this communicator is unusable", collective=head.plan.collective, seq=head.seq,
            peers=peers)
        self.ctx.fail(err)
        self.cancel_all()
        return err

    def timeout_error(self, waited, limit: float) -> CollectiveTimeoutError:
        ctx = self.ctx
        head = self.launches[0] if self.launches else waited
        rnd, index, peers, last = head.where()
        stage = head.stage
        if stage != "running":
            others = tuple(r for r in range(ctx.size) if r != ctx.rank)
            peers = peers or others
            labels = ctx.peer_labels(peers) if len(peers) == 1 else \
                f"any of {ranks_text(peers)} (the check is collective: it cannot tell which)"
            where = (f" in its {stage} (before any data moved: a peer has not issued call #{head.seq} — it may be "
                     "dead, stuck, have raised a local error, or have skipped a call)")
        else:
            labels = ctx.peer_labels(peers) or "none known"
            where = "" if rnd is None else f" in round {rnd}, first unfinished op {index} (last completed op {last})"
        extra = "" if head is waited else \
            f"; the awaited call #{waited.seq} ({waited.plan.collective}) queues behind it"
        collective, algorithm = head.plan.collective, head.plan.choice.algorithm
        return CollectiveTimeoutError(
            f"rank {ctx.rank}: {collective} #{head.seq} (algorithm {algorithm}) did not complete within {limit} s"
            f"{where}; awaiting {labels}{extra}. A peer may be dead, stuck, or have called a different collective; "
            f"set COLLECTIVES_TIMEOUT or timeout= to wait longer (sequence number #{head.seq} on this communicator)",
            collective=collective, algorithm=algorithm, seq=head.seq, round=rnd, op_index=index, peers=peers,
            last_completed=last, timeout=limit)


__all__ = ["CallQueue", "Work", "ranks_text", "wait_until"]
