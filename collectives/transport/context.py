"""What a communicator's plans share: the MPI communicator, the host facts, the arena, settings, the call
counter, statistics, and the failure state (a failed communicator takes no more calls and lets the process
exit without MPI_Finalize, which blocks forever on a dead peer).
"""

from __future__ import annotations

import atexit
import sys
import weakref

from .. import environment
from ..errors import CallMismatchError, CommunicatorClosedError
from .host import Host
from .progress import CallQueue
from .scratch import ScratchPool


class Context:
    """One communicator's shared state (plans hold a reference; nothing here is a module global)."""

    def __init__(self, runtime, host: Host, arena, world, *, check: str, timeout: float | None,
                 deterministic: bool, accumulate: str | None, domains: list[list[int]], topology=None) -> None:
        self.runtime = runtime  # runtime.py: MPI, or torch's store and gloo
        self.p2p = runtime.duplicate(framed=True)  # point-to-point messages (p2p.py): user tags never meet the schedules'
        self.rank = runtime.rank
        self.size = runtime.size
        self.host = host
        self.arena = arena  # shm.arena.Arena, or None when the ranks do not all share this host
        self.world = world  # daemon.World when this communicator owns switch daemons, else None
        self.check = check
        self.timeout = timeout
        self.deterministic = deterministic
        self.accumulate = accumulate
        self.seq = 0  # calls issued on this communicator (the same on every rank of matching calls)
        self.stats = {"calls": 0, "native_calls": 0, "bytes_sent": 0, "bytes_received": 0,
                      "switch_bytes_sent": 0, "switch_bytes_received": 0}
        self.scratch = ScratchPool()
        self.queue = CallQueue(self)
        self.domains = domains
        self._topology = topology
        self.failure: BaseException | None = None
        self.closed = False
        self.ok = True  # neither failed nor closed
        self.fast = True  # ok, and no call in flight: a blocking call may bypass the queue (kept by CallQueue)
        self.pending_orders: list = []  # orders to switch daemons still being sent (MPI requests)
        # MPI's own collective as a persistent request (executors.NativeExecutor): the live request (None: none,
        # False: this MPI has none) and the (plan, input, output) of the last call that could have used one
        self.native_request = None
        self.native_last = None
        self.size_checked: set[int] = set()  # check="off": the size digests whose first call agreed (plans.py)

    @property
    def topology(self):
        """The topology hierarchical algorithms get: the one passed to init, else built from the domains."""
        if self._topology is None:
            from .domains import topology_for
            self._topology = topology_for(self.domains)
        return self._topology

    @property
    def daemons(self) -> int:
        """Switch daemons serving this communicator (0: switch nodes run on the ranks)."""
        w = self.world
        return len(w.daemon_procs) if w is not None and w.serving else 0

    def check_open(self) -> None:
        if self.failure is not None:
            raise CommunicatorClosedError(f"this communicator failed earlier ({self.failure}); create a new one "
                                          "with collectives.init()") from self.failure
        if self.closed:
            raise CommunicatorClosedError("this communicator was closed; create a new one with collectives.init()")

    def note_mismatch(self, exc: CallMismatchError) -> None:
        """A mismatch leaves the communicator usable unless the ranks' call sequences went out of step."""
        if "call" in exc.fields:
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        """The communicator is broken: release the switch daemons, and make sure this process can exit."""
        if self.failure is not None:
            return
        self.failure = exc
        self.ok = self.fast = False
        if self.world is not None and self.world.serving:
            from . import daemon  # MPI: only a communicator with switch daemons gets here

            daemon.abort_daemons(self.world, f"app rank {self.rank}: {exc}")
        global _failed
        _failed = True

    def peer_labels(self, peers) -> str:
        out = []
        w = self.world
        for n in peers:
            if n < self.size:
                out.append(f"rank {n}")
            elif w is not None and w.serving and w.daemon_procs:
                d = w.daemon_procs[(n - self.size) % len(w.daemon_procs)]
                out.append(f"switch node {n} (switch daemon, world rank {d})")
            else:
                out.append(f"switch node {n} (leader emulation on rank {(n - self.size) % self.size})")
        return ", ".join(out)


class _OpenCommunicators:
    """Open communicators in creation order: closing is collective, so every rank closes them at exit in the order
    it created them (the same order on every rank, as creation is collective too)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}

    def add(self, comm) -> None:
        key = id(comm)
        self._refs[key] = weakref.ref(comm, lambda _, k=key: self._refs.pop(k, None))

    def discard(self, comm) -> None:
        self._refs.pop(id(comm), None)

    def __iter__(self):
        return iter([c for c in (r() for r in list(self._refs.values())) if c is not None])


live = _OpenCommunicators()  # closed at exit
_failed = False  # a communicator failed (timeout or dead peer): skip MPI_Finalize at exit


@atexit.register
def _close_all() -> None:
    """At exit, finish and close live communicators (this also stops switch daemons).

    If a communicator failed (a peer timed out or died), MPI_Finalize would block forever on the dead peer
    (MPICH), so the process ends here without it: stdio is flushed and the exit status is 1
    (COLLECTIVES_EXIT_ON_FAILURE=0 keeps the normal MPI_Finalize).
    """
    for comm in list(live):
        try:
            comm.close(timeout=min(comm.timeout or 10.0, 10.0))
        except Exception:  # noqa: BLE001 - exiting anyway; never hang or mask the real error
            pass
    if _failed and environment.get("COLLECTIVES_EXIT_ON_FAILURE"):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        import os
        os._exit(1)


__all__ = ["Context", "live"]
