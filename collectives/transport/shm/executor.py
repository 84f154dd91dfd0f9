"""Shared-memory execution of schedules: ranks on one host read their peers' windows directly.

The same schedule the message executor runs (transport/messages.py) runs here without MPI messages. Every rank
keeps its node state in a work buffer (usually the caller's output: receives land there, no copy-out) and
exposes in its shared window (arena.py) a *mirror* of the ranges its peers read; a SEND of the schedule only
says which peer reads which range of this rank's window in which round. A receive of [a, b) from node q is a
direct read of q's window range, landed as `collectives.execution.land_receives` lands it (a store is one copy,
a run of reduce-receives into one range is ONE fused reduction over the local value and every sender's range,
operands in source-node order), so results are bitwise the emulator's. What the window holds and what each
round waits for is decided once per schedule and rank (`plan.ShmPlan`), lowered once to instructions
(`program.compile_plan`) and executed by the C plan runner or its Python interpreter (program.py).

Used when every rank of the communicator shares this host and every node of the schedule is a rank (switch
nodes, emulated on ranks or run by daemons, take the message path).
"""

from __future__ import annotations

import numpy as np

from ...schedule import Schedule
from . import program as _program
from .arena import Arena
from .plan import ShmPlan, direct_messages

# a wait that does not pass within this many polls returns to the caller's waiter (which checks the deadline):
# ~1024 yields, or ~25 us of pauses when every rank has a core
POLLS = 1024
# calls whose window part is at most this many bytes get windows twice that size (double-buffered)
DOUBLE_BUFFER_MAX = 8 << 20


def eligible(schedule: Schedule, arena: Arena | None) -> bool:
    """Can `schedule` run over this arena (every node a rank, the arena's ranks are the schedule's)?"""
    return arena is not None and schedule.num_nodes == schedule.world_size and arena.size == schedule.world_size \
        and schedule.world_size > 1


class ShmExecutor:
    """One call signature's program over the arena: `start(work, source, seq)` begins a call (the C runner or
    the interpreter, compiled once per input mode: `source` given = lazy input read where it lies; `out`, with
    place_io's output range) and runs it as far as it goes; `resume()` continues. Statuses as program.Runner's."""

    folds_agreement = True  # the call agreement rides on the program's waits (csrc/plan.h)

    def __init__(self, arena: Arena, schedule: Schedule, dtype: np.dtype, op: str, signature: int, check: bool,
                 oversubscribed: bool) -> None:
        self.arena = arena
        self.dtype = np.dtype(dtype)
        direct = direct_messages(schedule, self.dtype.itemsize, arena.single_copy_min)
        self.splan = ShmPlan.build(schedule, arena.rank, direct)
        self.op = op
        self.signature = signature
        self.check = check
        self.yield_cpu = int(oversubscribed)
        self.need = schedule.work_size * self.dtype.itemsize  # window bytes every rank needs (same on all)
        # what the window should hold: two calls' worth up to DOUBLE_BUFFER_MAX, so that a rank may write its next
        # call while its peers still read this one (csrc/plan.h, double-buffered windows)
        self.want = 2 * self.need if self.need <= DOUBLE_BUFFER_MAX else self.need
        self.kernel = _program.c_kernel(self.dtype, op, self.need)
        self._programs: dict[bool, _program.Program] = {}
        self._engines: dict[bool, _program.Runner | _program.Interpreter] = {}
        self.engine: _program.Runner | _program.Interpreter | None = None  # the call in flight
        # where a lazy input lies in the node's state and which part of it is the caller's output (place_io)
        self.source_range: tuple[int, int] | None = None
        self.out_range: tuple[int, int] | None = None
        self.out_direct = False

    def place_io(self, source_range: tuple[int, int] | None, out_range: tuple[int, int] | None,
                 out_direct: bool) -> bool:
        """Let the programs read the input where it lies, as elements `source_range` of the node's state, and
        keep elements `out_range` of it in the caller's output (`start(..., out=)`: throughout with
        `out_direct`, else copied there at the end), so a call's binding copies nothing. False (and nothing
        changed) where the schedule reads outside its input before writing it."""
        try:
            program = _program.compile_plan(self.splan, self.dtype.itemsize, True, source_range, out_range,
                                            out_direct)
        except _program.UnplacedInput:
            return False
        self.source_range, self.out_range, self.out_direct = source_range, out_range, out_direct
        self._programs, self._engines = {True: program}, {}
        return True

    @property
    def native(self) -> bool:
        """The C plan runner executes this plan (else the Python interpreter of the same program)."""
        return self.kernel is not None

    def _new_engine(self, lazy: bool):
        """The engine of this input mode over the arena's current windows (start() keeps it until they change)."""
        program = self._programs.get(lazy)
        if program is None:
            program = self._programs[lazy] = _program.compile_plan(
                self.splan, self.dtype.itemsize, lazy, self.source_range if lazy else None, self.out_range,
                self.out_direct)
        if self.kernel is not None:
            engine = _program.Runner(program, self.arena, self.kernel, self.signature, self.check)
        else:
            engine = _program.Interpreter(program, self.arena, self.dtype, self.op, self.signature, self.check)
        self._engines[lazy] = engine
        return engine

    def start(self, work: np.ndarray, source: np.ndarray | None, seq: int, polls: int = POLLS,
              out: np.ndarray | None = None) -> int:
        lazy = source is not None
        engine = self._engines.get(lazy)
        if engine is None or engine.generation != self.arena.generation:
            engine = self._new_engine(lazy)
        self.engine = engine
        return engine.start(work, source, seq, polls, self.yield_cpu, out)

    def resume(self, polls: int = POLLS) -> int:
        """Continue the call; `polls` = 0: return at the first wait that has not passed (Work.test())."""
        return self.engine.resume(polls, self.yield_cpu)

    # -- what a waiter reports --------------------------------------------------------------------------
    @property
    def events(self) -> int:
        return self.engine.events if self.engine is not None else 0

    def where(self) -> tuple[int | None, int | None, tuple[int, ...], int]:
        """(round, op index, awaited peers, last completed round) of the call in flight."""
        e = self.engine
        if e is None:
            return None, None, (), -1
        program = e.program
        peers = (e.waiting,) if e.waiting >= 0 else ()
        return program.round_at(e.ip), None, peers, program.last_completed(e.ip)


__all__ = ["POLLS", "ShmExecutor", "eligible"]
