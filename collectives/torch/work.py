"""Asynchronous calls of the backend: torch `Work` handles over the library's own handles, and who drives them.

The library has no progress thread: a call in flight advances only while a thread is inside its communicator
(a blocking call, `Work.wait()`, `Work.test()`). torch, though, waits on futures from C++ (DDP's reducer waits for
its bucket futures at the end of backward; a comm hook's `then` chain must fire with nobody waiting in Python).
So a Work whose future has been handed out is watched by one `Driver` thread, which polls it (and so makes the
library progress) until it completes, then completes the future; callbacks run on that thread.

Every entry into the library goes through `LOCK`: the library is entered by one thread at a time (the caller's
or the driver's). A blocking call holds it for the whole call, as long as no other group has a call in flight; with
one in flight (on another communicator, whose progress a peer may need before it can join this call) the call is
issued asynchronously and polled with the lock released between polls, while the driver keeps the other group
moving.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import CollectiveTimeoutError

LOCK = threading.Lock()
NAP_MAX = 1e-3  # the driver's longest sleep between polls while a watched call makes no progress


class _Pending:
    """Calls in flight per communicator (id): a blocking call elsewhere must not hold LOCK while they wait."""

    def __init__(self) -> None:
        self.count: dict[int, int] = {}  # changed in place, never rebound (direct.py holds it)

    def add(self, key: int) -> None:
        self.count[key] = self.count.get(key, 0) + 1

    def remove(self, key: int) -> None:
        left = self.count[key] - 1
        if left:
            self.count[key] = left
        else:
            del self.count[key]

    def elsewhere(self, key: int) -> bool:
        """Another communicator than `key` has calls in flight."""
        count = self.count
        return bool(count) and (len(count) > 1 or key not in count)


PENDING = _Pending()


def seconds(timeout, default: float | None) -> float | None:
    """A torch timeout (timedelta; zero or negative means none given) in seconds, else `default`."""
    if timeout is None:
        return default
    if isinstance(timeout, timedelta):
        s = timeout.total_seconds()
    else:
        s = float(timeout)
    return s if s > 0 else default


class CollectivesWork(dist._Work):
    """One torch call in flight: the library handles it issued, what to do once they complete (copy staged
    outputs back), and the output tensors (`result()`, the future's value: what DDP expects)."""

    def __init__(self, group, what: str, handles: list, finish=None, result=None, source=None) -> None:
        super().__init__()
        self._group = group
        self._key = id(group.comm)
        self._what = what
        self._handles = handles
        self._finish = finish
        self._result = [] if result is None else result
        self._source = source  # a receive: the handle that knows where the message came from
        self._timeout = group.timeout
        self._issued = time.monotonic()
        self._done = False
        self._error: BaseException | None = None
        self._future: torch.futures.Future | None = None
        self._future_owed = False  # the future exists but has not been completed yet
        PENDING.add(self._key)

    # -- completion (every state change happens under LOCK; the future is completed outside it) ---------------
    def _complete(self, error: BaseException | None) -> None:
        """Under LOCK: mark done (once), run the finishing copies; returns nothing, the caller settles the future."""
        if error is None and self._finish is not None:
            try:
                self._finish()
            except Exception as exc:  # noqa: BLE001 - e.g. a copy into an output that was resized meanwhile
                error = exc
        self._done = True
        self._error = error
        self._handles = []
        self._finish = None
        PENDING.remove(self._key)

    def _settle(self) -> None:
        """Outside LOCK: complete the future if it was handed out before the call completed (runs callbacks)."""
        fut = self._future
        if self._future_owed and fut is not None:
            self._future_owed = False
            if self._error is None:
                fut.set_result(self._result)
            else:
                fut.set_exception(self._error)

    def _poll(self) -> bool:
        """Advance without blocking; True once complete. Past the group's timeout the call fails with the library's
        report (the communicator is then unusable, as after any timeout)."""
        if self._done:
            return True
        with LOCK:
            if self._done:
                return True
            try:
                if all(h.test() for h in self._handles):
                    self._complete(None)
                elif self._timeout is not None and time.monotonic() - self._issued > self._timeout:
                    self._complete(self._expire())
            except Exception as exc:  # noqa: BLE001 - the call's failure goes to its waiters and its future
                self._complete(exc)
            owed = self._done and self._future_owed
        if owed:
            self._settle()
        return self._done

    def _expire(self) -> BaseException:
        """The library's own timeout report for the first unfinished handle, stated for the whole wait."""
        limit = self._timeout
        for h in self._handles:
            try:
                h.wait(timeout=1e-3)  # already late: the library names the stuck call, round and peers
            except CollectiveTimeoutError as exc:
                return CollectiveTimeoutError(
                    f"backend 'collectives': {self._what} did not complete within {limit} s of being issued (driven "
                    f"in the background for its future); the library reports: {exc}", collective=exc.collective,
                    algorithm=exc.algorithm, seq=exc.seq, round=exc.round, op_index=exc.op_index, peers=exc.peers,
                    last_completed=exc.last_completed, timeout=limit)
            except Exception as exc:  # noqa: BLE001
                return exc
        return CollectiveTimeoutError(f"backend 'collectives': {self._what} did not complete within {limit} s",
                                      timeout=limit)

    # -- torch's Work interface -----------------------------------------------------------------------------
    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until complete (at most `timeout`, default the group's) and raise the call's error, if any."""
        if not self._done:
            limit = seconds(timeout, self._timeout)
            if PENDING.elsewhere(self._key):
                self._wait_polling(limit)
            else:
                with LOCK:
                    if not self._done:
                        deadline = None if limit is None else time.monotonic() + limit
                        try:
                            for h in self._handles:
                                h.wait(None if deadline is None else max(deadline - time.monotonic(), 1e-3))
                            self._complete(None)
                        except Exception as exc:  # noqa: BLE001
                            self._complete(exc)
                self._settle()
        if self._error is not None:
            raise self._error
        return True

    def _wait_polling(self, limit: float | None) -> None:
        deadline = None if limit is None else time.monotonic() + limit
        nap = 0.0
        while not self._poll():
            if deadline is not None and time.monotonic() > deadline:
                with LOCK:
                    if not self._done:
                        self._complete(self._expire())
                self._settle()
                return
            nap = min(NAP_MAX, nap * 2 or 1e-6)
            time.sleep(nap)

    def is_completed(self) -> bool:
        return self._poll()

    def is_success(self) -> bool:
        return self._poll() and self._error is None

    def exception(self) -> BaseException | None:
        self._poll()
        return self._error

    def result(self) -> list:
        return self._result

    def get_future(self) -> torch.futures.Future:
        """A future completed with the output tensors when the call completes (or with its error); until then the
        driver thread polls the call, so the future completes even if nobody waits on this Work."""
        if self._future is None:
            fut = torch.futures.Future()
            with LOCK:
                self._future = fut
                self._future_owed = True
                done = self._done
            if done:
                self._settle()
            else:
                DRIVER.watch(self)
        return self._future

    def synchronize(self) -> None:
        pass

    def _source_rank(self) -> int:
        """A receive from any source: the group rank the message came from (torch's recv asks after wait())."""
        if self._source is None:
            raise ValueError("source rank: this Work is not a receive")
        self.wait()
        return int(self._source.source)

    source_rank = _source_rank

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else "done" if self._done else "pending"
        return f"<collectives Work {self._what} {state}>"


class CompletedWork(dist._Work):
    """A call that completed as it was issued (a world of one, an empty batch): its result or error."""

    def __init__(self, result=None, error: BaseException | None = None) -> None:
        super().__init__()
        self._result = [] if result is None else result
        self._error = error

    def wait(self, timeout: timedelta | None = None) -> bool:  # noqa: ARG002 - already complete
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future:
        fut = torch.futures.Future()
        if self._error is None:
            fut.set_result(self._result)
        else:
            fut.set_exception(self._error)
        return fut

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list:
        return self._result

    def synchronize(self) -> None:
        pass


class GroupWork(CompletedWork):
    """Several Works as one (the `_coalescing_manager`'s, and coalesced calls issued as several library calls)."""

    def __init__(self, works: list, result=None) -> None:
        super().__init__(result)
        self._works = works

    def wait(self, timeout: timedelta | None = None) -> bool:
        for w in self._works:
            w.wait(timeout)
        return True

    def get_future(self) -> torch.futures.Future:
        futures = [w.get_future() for w in self._works]
        if not futures:
            return super().get_future()
        result = self._result

        def joined(fut):
            for f in fut.value():
                f.value()  # raises the first member's error
            return result
        return torch.futures.collect_all(futures).then(joined)

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def is_success(self) -> bool:
        return all(w.is_success() for w in self._works)

    def exception(self) -> BaseException | None:
        for w in self._works:
            exc = w.exception()
            if exc is not None:
                return exc
        return None


class Driver:
    """The thread that completes handed-out futures nobody waits on (see the module docstring). It sleeps on a
    condition while nothing is watched; while something is, it polls, napping up to NAP_MAX between polls that
    find no progress."""

    def __init__(self) -> None:
        self._watched: list[CollectivesWork] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, work: CollectivesWork) -> None:
        with self._cv:
            self._watched.append(work)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="collectives-torch-driver", daemon=True)
                self._thread.start()
            self._cv.notify()

    @property
    def watching(self) -> int:
        return len(self._watched)

    def _run(self) -> None:
        nap = 0.0
        while True:
            with self._cv:
                while not self._watched:
                    self._cv.wait()
                    nap = 0.0
                watched = list(self._watched)
            finished = [w for w in watched if w._poll()]
            if finished:
                with self._cv:
                    self._watched = [w for w in self._watched if not w._done]
                nap = 0.0
            else:
                nap = min(NAP_MAX, nap * 2 or 2e-5)
                time.sleep(nap)


DRIVER = Driver()

__all__ = ["DRIVER", "LOCK", "PENDING", "CollectivesWork", "CompletedWork", "Driver", "GroupWork", "seconds"]
