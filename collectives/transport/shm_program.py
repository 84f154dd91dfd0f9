"""A rank's shared-memory plan as one C program: the plan runner (csrc/plan.c) executes a whole call without
returning to Python between rounds.

`compile_plan` turns a `shm_plan.ShmPlan` (rounds with their waits, landings, mirror and input copies) into the
runner's instruction words, doing exactly what `ShmExecution._run_rounds` does in Python, in the same order:
the same counters with the same values (so calls run by either path interleave freely on one arena), the same
copies, and every landing through the same fused kernel call as `collectives.execution.land_receives` (operands
sorted by source node, the local value counting as the node's own), so results are bitwise those of the Python
path and of the emulator. Why: a round's Python work is a few microseconds, and with more ranks than cores
every microsecond a rank spends is taken from a peer sharing its core (docs/performance-mpi.md measures a
small allreduce at 4 ranks on 2 cores).

Buffers are numbered for the runner: WORK (the node's state, the caller's output), SOURCE (the caller's input
while the node's value still lives there: lazy input), then WINDOW + q for rank q's shared window.
The runner serves a call when the C extension is loaded, the C kernels are the backend `reduce_into` uses for
the dtype, and the reductions are single-threaded (`kernels.get_threads() == 1` or the buffer too small to be
split), so its kernel calls are the ones `reduce_into` would make.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

import numpy as np

from .. import environment, kernels
from ..kernels._dtypes import OP_CODES
from ..kernels._parallel import MIN_SLICE_BYTES
from ..schedule import OpKind

try:
    from collectives._ckernels import ffi, lib
except ImportError:  # no C extension: the Python path runs every plan
    ffi = lib = None

WORK, SOURCE, WINDOW = 0, 1, 2
END, WAIT_DONE, WAIT_READ, COPY, REDUCE, PUBLISH, SET_READ = range(7)


def _nap_after_ns() -> int:
    """With more ranks than cores the runner's waits yield the CPU between polls, and a wait that has lasted this
    long sleeps NAP_NS per poll instead (csrc/plan.c, wait_for, says why). 1 ms: over the whole of a call up to
    ~1 MiB on 4 ranks of 2 cores, so small calls never sleep, and under the ~3 ms after which yielding waiters
    measurably slowed their core-mates (docs/benchmarks.md). COLLECTIVES_NAP_AFTER_US=0 keeps waits yielding."""
    return environment.get("COLLECTIVES_NAP_AFTER_US") * 1000


NAP_AFTER_NS = _nap_after_ns()
NAP_NS = 20_000  # asked for; Linux adds up to its 50 us default timer slack, so a nap lasts ~20-70 us


def _set_wait_policy(call) -> None:
    call.nap_after_ns = NAP_AFTER_NS
    call.nap_ns = NAP_NS


def enabled() -> bool:
    return lib is not None and environment.get("COLLECTIVES_SHM_C")


def kernel_for(dtype: np.dtype, op: str, nbytes: int) -> tuple[int, int, int] | None:
    """(kind, dtype code, op code) for the runner, or None when the call must take the Python path."""
    if not enabled() or op not in OP_CODES:
        return None
    if kernels.get_threads() > 1 and nbytes >= 2 * MIN_SLICE_BYTES:
        return None  # reduce_into would split this over threads
    found = kernels.c_kernel(dtype)
    return None if found is None else (found[0], found[1], OP_CODES[op])


@dataclass
class Program:
    """Instruction words and, for error reports, which schedule round each word belongs to."""

    code: np.ndarray  # int64 words
    round_starts: list[int]  # word index where each round's instructions begin
    rounds: list[int]  # the schedule round of each entry of round_starts
    pointer: object  # the code as an `int64_t *` (kept with the array it points into)

    def round_at(self, ip: int) -> int | None:
        i = bisect.bisect_right(self.round_starts, ip) - 1
        return self.rounds[i] if i >= 0 and self.rounds[i] >= 0 else None

    def last_completed(self, ip: int) -> int:
        i = bisect.bisect_right(self.round_starts, ip) - 1
        return self.rounds[i - 1] if i >= 1 else -1


def _copy_words(dst: int, src: int, lo: int, hi: int, itemsize: int) -> tuple[int, ...]:
    """COPY of elements [lo, hi) from buffer src to the same range of buffer dst (nothing when empty)."""
    return (COPY, dst, lo * itemsize, src, lo * itemsize, (hi - lo) * itemsize) if hi > lo else ()


def _reduce_words(dst: int, sources: list[int], lo: int, hi: int, itemsize: int) -> list[int]:
    """REDUCE of elements [lo, hi) of every source buffer, in the order given, into the same range of dst."""
    words = [REDUCE, dst, lo * itemsize, hi - lo, len(sources)]
    for b in sources:
        words.extend((b, lo * itemsize))
    return words


def compile_plan(splan, itemsize: int, lazy: bool) -> Program:
    """The runner's program for `splan` (a shm_plan.ShmPlan) with elements of `itemsize` bytes. `lazy`: the node's
    input is read from SOURCE until written (out-of-place call), else it is already in WORK."""
    words: list[int] = []
    origin = SOURCE if lazy else WORK

    def copy(dst: int, src: int, lo: int, hi: int) -> None:
        words.extend(_copy_words(dst, src, lo, hi, itemsize))

    mine = WINDOW + splan.node
    if splan.writes_window:
        # nobody still reads this rank's window for the previous call
        for q in range(splan.world_size):
            if q != splan.node:
                words.extend((WAIT_READ, q, 0))
        for lo, hi in splan.copy_in:
            copy(mine, origin, lo, hi)
    words.extend((PUBLISH, splan.start_offset))
    round_starts, rounds = [], []
    for r in splan.rounds:
        round_starts.append(len(words))
        rounds.append(r.k)
        for q, off in r.data_waits:
            words.extend((WAIT_DONE, q, off))
        for g, fresh in zip(r.groups, r.fresh, strict=True):
            a, b = g[0].start, g[0].stop
            local = WORK
            if lazy and fresh:
                if len(fresh) == 1 and fresh[0] == (a, b):
                    local = SOURCE  # the node's value of the whole target is still the input
                else:
                    for lo, hi in fresh:
                        copy(WORK, SOURCE, lo, hi)
            if g[0].kind == OpKind.RECV and len(g) == 1:
                copy(WORK, WINDOW + g[0].peer, a, b)
                continue
            operands = [(o.peer, WINDOW + o.peer) for o in g]
            if g[0].kind == OpKind.RECV_REDUCE:
                operands.append((splan.node, local))
            operands.sort(key=lambda item: item[0])  # stable, as land_receives
            words.extend(_reduce_words(WORK, [buf for _, buf in operands], a, b, itemsize))
        if r.mirror:
            words.extend((SET_READ, 1 + r.k + 1))  # this round's reads are over
            for q, off in r.mirror_waits:
                words.extend((WAIT_READ, q, off))
            for lo, hi in r.mirror:
                copy(mine, WORK, lo, hi)
        if lazy:
            for lo, hi, unwritten in r.copy_next_parts:
                copy(mine, SOURCE if unwritten else WORK, lo, hi)
        else:
            for lo, hi in r.copy_next:
                copy(mine, WORK, lo, hi)
        words.extend((PUBLISH, r.advance_to))
    round_starts.append(len(words))
    rounds.append(-1)
    if lazy:
        for lo, hi in splan.never_written:
            copy(WORK, SOURCE, lo, hi)
    words.append(END)
    code = np.array(words, dtype=np.int64)
    return Program(code, round_starts, rounds, ffi.cast("int64_t *", ffi.from_buffer(code)))


class Runner:
    """A Program's progress through one call at a time: `run(work, source, polls, yield_cpu)` starts a call and
    `step(polls, yield_cpu)` continues it; both return True once it is done, False when a wait did not pass
    within `polls` polls (`waiting` is the peer awaited, `ip` where the program stopped). A runner is reused
    call after call (the communicator's shortcut keeps one per (count, dtype, op)): its C call state and
    pointer arrays are built once, so a call costs two pointer stores and one C call."""

    __slots__ = ("program", "call", "buffers", "keep", "windows", "half")

    def __init__(self, program: Program, arena, kernel: tuple[int, int, int]) -> None:
        self.program = program
        self.windows = arena.views  # the windows the buffer array points into (replaced when the arena grows)
        self.buffers = arena.c_buffers()
        done, read = arena.c_counters()
        call = self.call = ffi.new("struct coll_plan_call *")
        call.code = program.pointer
        call.buffers = self.buffers
        call.done = done
        call.read = read
        call.me = arena.rank
        call.kind, call.dtype, call.op = kernel
        call.waiting = -1
        _set_wait_policy(call)
        self.half = kernel[0] == 1  # 16-bit floats: ml_dtypes arrays need a uint16 view for from_buffer
        self.keep = (program, done, read)  # cffi does not keep what struct fields point to alive

    def run(self, work: np.ndarray, source: np.ndarray | None, polls: int, yield_cpu: int) -> bool:
        """Start a call on contiguous `work` (and `source`, the lazy input) and run it as far as it goes.
        The arrays outlive the call (the caller holds them), so their memory stays valid after the
        from_buffer objects are dropped; the counters' base is read in C when the call starts."""
        buffers = self.buffers
        if self.half:
            work = work.view(np.uint16)
            source = source.view(np.uint16) if source is not None else None
        w = buffers[0] = ffi.from_buffer(work)
        buffers[1] = ffi.from_buffer(source) if source is not None else w
        rc = lib.coll_plan_run(self.call, polls, yield_cpu, 1)
        return rc == 0 or self._failed(rc)

    def step(self, polls: int, yield_cpu: int) -> bool:
        rc = lib.coll_plan_run(self.call, polls, yield_cpu, 0)
        return rc == 0 or self._failed(rc)

    def _failed(self, rc: int) -> bool:
        if rc == 1:
            return False
        raise RuntimeError(f"shared-memory plan runner failed ({rc}) at word {self.call.ip}: a bug in collectives "
                           "(set COLLECTIVES_SHM_C=0 to use the Python executor)")

    @property
    def ip(self) -> int:
        return self.call.ip

    @property
    def waiting(self) -> int:
        return self.call.waiting

    @property
    def events(self) -> int:
        return self.call.events


class StraightLine:
    """A fixed program over fixed buffers, run in one C call: `collectives calibrate` times the runner's own
    COPY and REDUCE instructions with it (what a call of the runner pays per piece, without Python's per-call
    cost in between). `steps` are ("copy", dst, src, lo, hi) or ("reduce", dst, [srcs], lo, hi), buffers by
    index and ranges in elements of `itemsize` bytes, and, given `counters` (each rank's int64 counter in a
    shared window, this rank's at index `me`), ("publish", k) and ("wait", rank, k): set this rank's counter to
    its value at the start of the pass + k, wait until `rank`'s reaches that. Every rank must run the same
    number of passes (the counters advance in step)."""

    def __init__(self, steps, buffers: list[np.ndarray], itemsize: int, kernel: tuple[int, int, int],
                 counters: list[np.ndarray] | None = None, me: int = 0) -> None:
        words: list[int] = []
        for kind, *args in steps:
            if kind == "copy":
                words.extend(_copy_words(*args, itemsize))
            elif kind == "reduce":
                words.extend(_reduce_words(*args, itemsize))
            elif kind == "publish" and counters is not None:
                words.extend((PUBLISH, args[0]))
            elif kind == "wait" and counters is not None:
                words.extend((WAIT_DONE, args[0], args[1]))
            else:
                raise ValueError(f"straight-line step {kind!r} is not copy/reduce (or publish/wait with counters)")
        words.append(END)
        self.code = np.array(words, np.int64)
        self.counters = counters if counters is not None else [np.zeros(1, np.int64)]
        self.keep = [ffi.from_buffer(b.view(np.uint8)) for b in buffers]
        self.pointers = ffi.new("char *[]", self.keep)
        counter = ffi.new("int64_t *[]", [ffi.cast("int64_t *", ffi.from_buffer(c)) for c in self.counters])
        call = self.call = ffi.new("struct coll_plan_call *")
        call.code = ffi.cast("int64_t *", ffi.from_buffer(self.code))
        call.buffers = self.pointers
        call.done = call.read = counter
        call.me = me
        call.kind, call.dtype, call.op = kernel
        _set_wait_policy(call)
        self.keep.append(counter)
        self.waits = counters is not None

    def __call__(self, polls: int = 1024, yield_cpu: int = 0, timeout: float = 60.0) -> None:
        rc = lib.coll_plan_run(self.call, polls if self.waits else 0, yield_cpu, 1)
        deadline = None
        while rc == 1:  # a wait did not pass within the polls: poll on (bounded: a missing peer must not hang)
            deadline = deadline or time.monotonic() + timeout
            if time.monotonic() > deadline:
                raise RuntimeError(f"straight-line program: rank {self.call.waiting} did not publish in {timeout} s")
            rc = lib.coll_plan_run(self.call, polls, yield_cpu, 0)
        if rc != 0:
            raise RuntimeError(f"straight-line program failed ({rc})")


__all__ = ["Program", "Runner", "StraightLine", "compile_plan", "enabled", "kernel_for"]
