"""Persistent calls (MPI-4's MPI_Allreduce_init and kin): a call's plan and buffers bound once.

`Communicator.persistent(collective, x, out, ...)` validates the call and finds its plan as any call does; each
`run()` is then the call itself: when the plan runs on the shared-memory plan runner and nothing is in flight it
starts the runner directly (Plan.bind_inline, bound once where the buffers fix it, then Plan.start_inline),
skipping the method's argument handling, the plan look-up and the buffer checks of a fresh call (about a third of
an 8-byte allreduce's cost on one host). Anything else takes the plan's own run (MPI's own collective, messages, a
call in flight: the queue), so a persistent call behaves as the collective's method would with the same
arguments: same algorithm, same agreement, same errors.

A communicator that drops plans (its plan cache is full, `check` changed, closing) bumps its `generation`; a
persistent call made before then validates and plans again on its next run, so it never runs a plan the
communicator no longer keeps (its agreement could differ from the peers' fresh calls) and the statistics count
every call.
"""

from __future__ import annotations

from collections.abc import Callable

from . import calls
from .calls import check_timeout


class PersistentCall:
    """One bound call (see the module docstring). `run(timeout=None)` (or calling it) is the blocking call and
    returns what the collective's method returns; `start()` issues it asynchronously and returns its Work."""

    COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "alltoall", "broadcast", "reduce")
    __slots__ = ("collective", "_comm", "_prepare", "_plan", "_x", "_out", "_timeout", "_inline", "_binding",
                 "_generation", "_quick")

    def __init__(self, comm, collective: str, prepare: Callable[[], tuple]) -> None:
        self.collective = collective
        self._comm = comm
        self._prepare = prepare
        self._bind()

    def _bind(self) -> None:
        """Validate and plan (raises the call's error before any communication)."""
        plan, x, out, timeout = self._prepare()
        self._plan, self._x, self._out, self._timeout = plan, x, out, timeout
        # on the plan runner when nothing is in flight (else plan.run: the queue, or a copy of a strided x)
        self._inline = plan.inline and calls.buffers_fit(x, out, plan.mode, plan.out_count)
        self._binding = plan.bind_inline(x, out) if self._inline and plan.fixed_binding(out) else None
        self._generation = self._comm.generation
        self._quick = None  # Plan.quick_state once a run started the C runner on the fixed binding

    def run(self, timeout: float | None = None):
        """The call, blocking (timeout: this run's, else the one given when the call was made)."""
        timeout = self._timeout if timeout is None else check_timeout(timeout)
        comm = self._comm
        if self._generation != comm.generation:
            self._bind()
        plan = comm._last = self._plan
        if self._inline and plan.ctx.fast:
            quick = self._quick
            # the runner still holds this call's pointers (no other call started it since) over the same windows
            if quick is not None and quick[0].owner is self and quick[0].generation == quick[2].generation:
                return plan.restart(quick, self._x, self._out, timeout)
            binding = self._binding
            res, work, source = binding or plan.bind_inline(self._x, self._out)
            result = plan.start_inline(self._x, self._out, res, work, source, timeout)
            if binding is not None:
                self._quick = plan.quick_state(self, res)
            return result
        return plan.run(self._x, self._out, timeout)

    __call__ = run

    def start(self, timeout: float | None = None):
        """The call, issued asynchronously: its Work (wait() returns what run() would)."""
        timeout = self._timeout if timeout is None else check_timeout(timeout)
        comm = self._comm
        if self._generation != comm.generation:
            self._bind()
        comm._last = self._plan
        return self._plan.submit(self._x, self._out, True, timeout)

    @property
    def algorithm(self) -> str:
        """The algorithm the call runs (auto's choice, or the one asked for)."""
        return self._plan.choice.algorithm

    def __repr__(self) -> str:
        x = self._x
        return f"<collectives.PersistentCall {self.collective} via {self.algorithm} on {x.dtype}[{x.size}]>"


__all__ = ["PersistentCall"]
