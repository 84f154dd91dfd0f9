"""A rank's shared-memory plan lowered to ONE instruction stream, and the two things that execute it.

`compile_plan` turns a `plan.ShmPlan` into the plan runner's instruction words (csrc/plan.h): per round the
waits on peers' counters, the landings (a copy, or one fused REDUCE over the operands sorted by source node,
the local value counting as the node's own: exactly `collectives.execution.land_receives`), the mirror and
input copies, and the counter publications; CHECK_ALL before END completes the call agreement (plan.h).

Two executors of the same words, with the same counters, so calls run by either interleave freely on one arena:
* `Runner`: csrc/plan.c through cffi, the whole call in one C call (it returns only at a wait that does not
  pass within its polls, so the caller can check its deadline);
* `Interpreter`: the same words in Python, numpy copies and `kernels.reduce_into` (used without the C
  extension, for dtypes or thread splits the C kernels do not serve, and with COLLECTIVES_SHM_C=0).

Buffers are numbered: WORK (the node's state, usually the caller's output), SOURCE (the caller's input while
the node's value still lives there: lazy input; it may hold only a part of the node's state, e.g. an allgather's
own block), OUT (the caller's output where the result is a part of WORK: copied there at the end), then
WINDOW + q for rank q's shared window. Offsets in WORK, OUT and the windows are the schedule's; in SOURCE they
are shifted by where the input starts, so the binding of a call copies nothing in Python.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

import numpy as np

from ... import environment, kernels
from ...kernels._dtypes import OP_CODES
from ...kernels._parallel import MIN_SLICE_BYTES
from ...schedule import OpKind
from . import arena as _arena

try:
    from collectives._ckernels import ffi, lib
except ImportError:  # no C extension: the interpreter runs every program
    ffi = lib = None

WORK, SOURCE, OUT, WINDOW = 0, 1, 2, 3
END, WAIT_DONE, WAIT_READ, COPY, REDUCE, PUBLISH, SET_READ, CHECK_ALL, PEER_READ = range(9)
DONE, WAITING, MISMATCH, PEER_READ_FAILED = 0, 1, -4, -5  # csrc/plan.h: enum coll_plan_status
NAP_NS = 20_000  # asked for; Linux adds up to its 50 us default timer slack, so a nap lasts ~20-70 us


def c_enabled() -> bool:
    """The C plan runner may execute programs (the extension loaded, COLLECTIVES_SHM_C on)."""
    return lib is not None and environment.get("COLLECTIVES_SHM_C")


def c_kernel(dtype: np.dtype, op: str, nbytes: int) -> tuple[int, int, int] | None:
    """(kind, dtype code, op code) for the C runner, or None when its reductions would not be the ones
    `reduce_into` makes (no C kernel for the dtype, or `reduce_into` would split the call over threads)."""
    if not c_enabled() or op not in OP_CODES:
        return None
    if kernels.get_threads() > 1 and nbytes >= 2 * MIN_SLICE_BYTES:
        return None
    found = kernels.c_kernel(dtype)
    return None if found is None else (found[0], found[1], OP_CODES[op])


@dataclass
class Program:
    """Instruction words and, for error reports, which schedule round each word belongs to."""

    code: np.ndarray  # int64 words
    round_starts: list[int]  # word index where each round's instructions begin
    rounds: list[int]  # the schedule round of each entry of round_starts
    steps: int = 0  # counter steps of a call (every counter ends it at base + steps)
    window_bytes: int = 0  # the part of every rank's window the call uses: [0, window_bytes)
    # where peers' PEER_READs find the node state: (buffer, bytes before its start where element 0 of the state
    # would lie): WORK, or a lazy input that holds the state from its element src_lo on
    origin: tuple[int, int] = (WORK, 0)

    def half_bytes(self, capacity: int) -> int:
        """The byte offset of window half 1 when the call fits in half of windows of `capacity` bytes (it then
        uses half seq & 1: csrc/plan.h, double-buffered windows), else 0 (the whole window)."""
        half = capacity // 2
        return half if 0 < self.window_bytes <= half else 0

    def round_at(self, ip: int) -> int | None:
        i = bisect.bisect_right(self.round_starts, ip) - 1
        return self.rounds[i] if i >= 0 and self.rounds[i] >= 0 else None

    def last_completed(self, ip: int) -> int:
        i = bisect.bisect_right(self.round_starts, ip) - 1
        return self.rounds[i - 1] if i >= 1 else -1


class UnplacedInput(ValueError):
    """The program would read the node's input outside the range SOURCE holds (the schedule reads a range before
    writing it that is not its input): the caller places the input in WORK instead."""


def compile_plan(splan, itemsize: int, lazy: bool, source_range: tuple[int, int] | None = None,
                 out_range: tuple[int, int] | None = None, out_direct: bool = False) -> Program:
    """The program for `splan` (a plan.ShmPlan) with elements of `itemsize` bytes.

    `lazy`: the node's input is read from SOURCE until written (out-of-place call), else it is already in WORK.
    `source_range`: the elements [lo, hi) of the node's state that SOURCE holds (its element 0 is element lo;
    default the whole state); ranges outside it that no round writes keep what WORK held. `out_range`: the
    elements of the node's state that are the caller's output, OUT (None: the whole state, WORK itself): with
    `out_direct` they live in OUT throughout (every access to them goes there), else they are copied from WORK
    to OUT once the call is agreed (the output may then be the input: an in-place alltoall). Raises
    UnplacedInput where a read of the input falls outside `source_range`."""
    words: list[int] = []
    origin = SOURCE if lazy else WORK
    src_lo, src_hi = source_range if source_range is not None else (0, splan.work_size)
    out_lo, out_hi = out_range if out_range is not None else (0, splan.work_size)
    cuts = (out_lo, out_hi) if out_direct and out_range is not None else ()

    def at(buf: int, lo: int, hi: int) -> tuple[int, int]:
        """(buffer, byte offset) of elements [lo, hi) of buffer buf in the schedule's numbering (a piece on one
        side of the output range's ends)."""
        if buf == WORK and cuts and out_lo <= lo and hi <= out_hi:
            return OUT, (lo - out_lo) * itemsize
        if buf == SOURCE and (lo < src_lo or hi > src_hi):
            raise UnplacedInput(f"rank {splan.node} reads input elements [{lo}, {hi}) outside [{src_lo}, {src_hi})")
        return buf, (lo - src_lo if buf == SOURCE else lo) * itemsize

    def pieces(lo: int, hi: int) -> list[tuple[int, int]]:
        """[lo, hi) cut where the output range begins and ends (a piece of WORK lies in OUT or outside it)."""
        points = [lo, *(c for c in cuts if lo < c < hi), hi]
        return list(zip(points[:-1], points[1:], strict=True))

    def copy(dst: int, dlo: int, src: int, slo: int, n: int) -> None:
        """COPY of n elements from element slo of buffer src to element dlo of buffer dst."""
        if WORK not in (dst, src):
            words.extend((COPY, *at(dst, dlo, dlo + n), *at(src, slo, slo + n), n * itemsize))
            return
        if dst == src:  # a rank's message to itself, in place (not lazy: nothing of WORK lies in OUT then)
            words.extend((COPY, dst, dlo * itemsize, src, slo * itemsize, n * itemsize))
            return
        work_lo = dlo if dst == WORK else slo
        for lo, hi in pieces(work_lo, work_lo + n):
            d = at(dst, dlo + lo - work_lo, dlo + hi - work_lo)
            s_ = at(src, slo + lo - work_lo, slo + hi - work_lo)
            words.extend((COPY, *d, *s_, (hi - lo) * itemsize))

    def copy_range(dst: int, src: int, lo: int, hi: int) -> None:
        """COPY of elements [lo, hi) of buffer src to the same elements of buffer dst (nothing when empty)."""
        if hi > lo:
            copy(dst, lo, src, lo, hi - lo)

    mine = WINDOW + splan.node
    if lazy:  # single-copy messages are read from SOURCE: they must lie in it
        for lo, hi in splan.direct_ranges:
            at(SOURCE, lo, hi)
    if splan.writes_window:
        # nobody still reads this half of the window for an earlier call (offset 0: csrc/plan.h, `reuse`)
        for q in range(splan.world_size):
            if q != splan.node:
                words.extend((WAIT_READ, q, 0))
        for lo, hi in splan.copy_in:
            copy_range(mine, origin, lo, hi)
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
                        copy_range(WORK, SOURCE, lo, hi)
            # a peer's end of the message is [o.remote, o.remote + length) of its window (its own range: the
            # position invariant makes it [a, b), alltoall and imported schedules need not)
            if g[0].kind == OpKind.RECV and len(g) == 1:
                o = g[0]
                if (r.k, o.peer, splan.node, o.remote) in splan.direct and o.peer == splan.node:
                    copy(WORK, a, origin, o.remote, b - a)  # its own unchanged range: where it lies
                elif (r.k, o.peer, splan.node, o.remote) in splan.direct:  # the sender's memory (PEER_READ)
                    for lo, hi in pieces(a, b):
                        words.extend((PEER_READ, *at(WORK, lo, hi), o.peer, (o.remote + lo - a) * itemsize,
                                      (hi - lo) * itemsize))
                elif b > a:
                    copy(WORK, a, WINDOW + o.peer, o.remote, b - a)
                continue
            operands = [(o.peer, WINDOW + o.peer, o.remote) for o in g]
            if g[0].kind == OpKind.RECV_REDUCE:
                operands.append((splan.node, local, a))
            operands.sort(key=lambda item: item[0])  # stable, as land_receives
            # REDUCE into elements [lo, hi) of WORK of the operands in source-node order (elementwise, so the
            # pieces of a range cut at the output's ends reduce each element exactly as the whole range would)
            for lo, hi in pieces(a, b):
                words.extend((REDUCE, *at(WORK, lo, hi), hi - lo, len(operands)))
                for _, buf, first in operands:
                    words.extend(at(buf, first + lo - a, first + hi - a))
        if r.mirror:
            words.extend((SET_READ, 1 + r.k + 1))  # this round's reads are over
            for q, off in r.mirror_waits:
                words.extend((WAIT_READ, q, off))
            for lo, hi in r.mirror:
                copy_range(mine, WORK, lo, hi)
        if lazy:
            for lo, hi, unwritten in r.copy_next_parts:
                copy_range(mine, SOURCE if unwritten else WORK, lo, hi)
        else:
            for lo, hi in r.copy_next:
                copy_range(mine, WORK, lo, hi)
        words.extend((PUBLISH, r.advance_to))
    round_starts.append(len(words))
    rounds.append(-1)
    if lazy:  # what no round wrote is still the input: needed where the caller sees it (the output range)
        for lo, hi in splan.never_written:
            copy_range(WORK, SOURCE, max(lo, src_lo, out_lo), min(hi, src_hi, out_hi))
    for q in splan.readers:  # they read this rank's memory: it stays as it is until they are done
        words.extend((WAIT_READ, q, splan.total))
    words.append(CHECK_ALL)
    if out_range is not None and not out_direct and out_hi > out_lo:
        # after the agreement: a mismatched call leaves the caller's output alone
        words.extend((COPY, OUT, 0, WORK, out_lo * itemsize, (out_hi - out_lo) * itemsize))
    words.append(END)
    return Program(np.array(words, dtype=np.int64), round_starts, rounds, splan.total,
                   splan.work_size * itemsize, (SOURCE, src_lo * itemsize) if lazy else (WORK, 0))


def peer_read_error(q: int, errno_: int) -> RuntimeError:
    import os

    return RuntimeError(f"reading rank {q}'s memory for a single-copy message failed: {os.strerror(errno_)} "
                        f"(errno {errno_}); set COLLECTIVES_SHM_SINGLE_COPY=0 to send every message through the "
                        "shared windows")


class Runner:
    """A Program executed by the C plan runner, one call at a time: `start(work, source, seq, polls, yield_cpu)`
    starts a call and `resume(polls, yield_cpu)` continues it; both return DONE, WAITING (a wait did not pass
    within `polls` polls: `waiting` is the peer awaited) or MISMATCH (the ranks run different calls: `waiting`
    is the peer, `poisoned` whether it only passed the news on). Reused call after call: its C state and pointer
    arrays are built once, so a call costs two pointer stores and one C call."""

    __slots__ = ("program", "call", "buffers", "keep", "generation", "half", "owner", "_work", "_source", "_out")

    def __init__(self, program: Program, arena: _arena.Arena, kernel: tuple[int, int, int], signature: int,
                 check: bool) -> None:
        self.program = program
        self.generation = arena.generation  # the data windows the buffer array points into
        self.buffers = arena.c_buffers()
        code = ffi.cast("int64_t *", ffi.from_buffer(program.code))
        checked = ffi.new("unsigned char[]", arena.size)
        call = self.call = ffi.new("struct coll_plan_call *")
        call.code = code
        call.buffers = self.buffers
        call.ctrl = arena.c_ctrl()
        call.checked = checked
        call.me, call.nranks = arena.rank, arena.size
        call.kind, call.dtype, call.op = kernel
        call.signature = signature
        call.check = int(check)
        call.waiting = -1
        call.nap_after_ns = environment.get("COLLECTIVES_NAP_AFTER_US") * 1000
        call.nap_ns = NAP_NS
        call.steps = program.steps
        call.half_bytes = program.half_bytes(arena.capacity)
        call.first_window = WINDOW
        call.origin_buf, call.origin_shift = program.origin
        self.half = kernel[0] == 1  # 16-bit floats: ml_dtypes arrays need a uint16 view for from_buffer
        self.keep = (program, code, checked)  # cffi does not keep what struct fields point to alive
        # the arrays the buffer pointers were last taken from (held, so their memory stays valid): a call on the
        # same arrays as the last one reuses the pointers
        self._work = self._source = self._out = None
        # the plan whose fixed binding the pointers are (plans.Plan.run restarts the runner on them directly,
        # setting call.seq and calling coll_plan_run itself); every start() clears it
        self.owner = None

    def start(self, work: np.ndarray, source: np.ndarray | None, seq: int, polls: int, yield_cpu: int,
              out: np.ndarray | None = None) -> int:
        """Start call `seq` on contiguous `work` (and `source`, the lazy input, and `out`, the output a program
        with an output range writes; any shape) and run it as far as it goes; the counters' base is read in C
        when the call starts."""
        self.owner = None
        buffers = self.buffers
        if work is not self._work:
            self._work = work
            buffers[0] = ffi.from_buffer(work.view(np.uint16) if self.half else work)
        if source is not self._source:
            self._source = source
            buffers[1] = ffi.from_buffer(source.view(np.uint16) if self.half else source) \
                if source is not None else ffi.NULL
        if out is not self._out:
            self._out = out
            buffers[2] = ffi.from_buffer(out.view(np.uint16) if self.half else out) if out is not None else ffi.NULL
        call = self.call
        call.seq = seq
        rc = lib.coll_plan_run(call, polls, yield_cpu, 1)
        return rc if rc >= MISMATCH else self.status(rc)

    def resume(self, polls: int, yield_cpu: int) -> int:
        return self.status(lib.coll_plan_run(self.call, polls, yield_cpu, 0))

    def status(self, rc: int) -> int:
        """A status of coll_plan_run: DONE, WAITING or MISMATCH as they are; RuntimeError for a runner error."""
        if rc >= MISMATCH:
            return rc
        if rc == PEER_READ_FAILED:
            raise peer_read_error(self.call.waiting, self.call.error)
        raise RuntimeError(f"shared-memory plan runner failed ({rc}) at word {self.call.ip}: a bug in collectives "
                           "(set COLLECTIVES_SHM_C=0 to use the Python interpreter of the same program)")

    @property
    def ip(self) -> int:
        return self.call.ip

    @property
    def waiting(self) -> int:
        return self.call.waiting

    @property
    def poisoned(self) -> bool:
        return bool(self.call.poisoned)

    @property
    def events(self) -> int:
        return self.call.events


class Interpreter:
    """The same Program executed in Python (see the module docstring): numpy copies between byte views,
    `kernels.reduce_into` on typed views, counters and signature slots through the arena. Same interface and
    statuses as `Runner`."""

    def __init__(self, program: Program, arena: _arena.Arena, dtype: np.dtype, op: str, signature: int,
                 check: bool) -> None:
        self.program = program
        self.arena = arena
        self.dtype = np.dtype(dtype)
        self.op = op
        self.signature = signature
        self.check = check
        self.generation = arena.generation
        self.ip = 0
        self.base = 0
        self.reuse = 0
        self.seq = 0
        self.waiting = -1
        self.poisoned = False
        self.events = 0
        self.checked: list[bool] = []
        self.buffers: list[np.ndarray] = []

    def start(self, work: np.ndarray, source: np.ndarray | None, seq: int, polls: int, yield_cpu: int,
              out: np.ndarray | None = None) -> int:
        a = self.arena
        self.base = a.counter(a.rank, _arena.DONE)
        # the window part this call writes and the readers it waits for first (as csrc/plan.c's restart)
        half = self.program.half_bytes(a.capacity)
        shift, self.reuse = a.reserve(seq, half, self.base + self.program.steps)
        flat = work.reshape(-1).view(np.uint8)
        self.buffers = [flat, (source if source is not None else work).reshape(-1).view(np.uint8),
                        out.reshape(-1).view(np.uint8) if out is not None else flat,
                        *(v[shift:] for v in a.views)]
        self.ip, self.seq, self.events, self.waiting, self.poisoned = 0, seq, 0, -1, False
        self.checked = [q == a.rank for q in range(a.size)]
        buf, shift = self.program.origin
        a.ctrl[a.rank][_arena.ORIGIN] = self.buffers[buf].ctypes.data - shift  # published by the next release
        if self.check:
            a.sign(seq, self.signature)
        return self.resume(polls, yield_cpu)

    def _peer_state(self, q: int) -> int:
        """-1: mismatch (waiting/poisoned set), else 0; marks q checked once it started the same call (after which
        only its poison word can tell of a mismatch found elsewhere)."""
        if not self.check:
            return 0
        state = self.arena.compare(q, self.seq, self.signature)
        if self.checked[q]:
            if state == _arena.POISONED:
                self.waiting, self.poisoned = q, True
                return -1
            return 0
        if state == _arena.MATCH:
            self.checked[q] = True
            return 0
        if state < 0:
            self.waiting, self.poisoned = q, state == _arena.POISONED
            return -1
        return 0

    def _wait(self, q: int, which: int, target: int, checked_wait: bool, polls: int, yield_cpu: int) -> int:
        a = self.arena
        for i in range(polls + 1):
            if a.counter(q, which) >= target:
                return -1 if checked_wait and self._peer_state(q) else 1
            if checked_wait and self._peer_state(q):
                return -1
            if yield_cpu and i < polls:
                time.sleep(0)
        return 0

    def _stop(self, status: int) -> int:
        if status == MISMATCH:
            self.arena.poison(self.seq)
        return status

    def resume(self, polls: int, yield_cpu: int) -> int:
        code, a, bufs, base = self.program.code, self.arena, self.buffers, self.base
        while True:
            i = self.ip
            w = code[i]
            if w == END:
                self.waiting = -1
                return DONE
            if w in (WAIT_DONE, WAIT_READ):
                q, off = int(code[i + 1]), int(code[i + 2])
                which = _arena.DONE if w == WAIT_DONE else _arena.READ
                target = self.reuse if off == 0 and w == WAIT_READ else base + off
                rc = self._wait(q, which, target, off > 0, polls, yield_cpu)
                if rc < 0:
                    return self._stop(MISMATCH)
                if rc == 0:
                    self.waiting = q
                    return WAITING
                self.events += 1
                self.ip = i + 3
            elif w == CHECK_ALL:
                for q in range(a.size):
                    if not self.check or self.checked[q]:
                        continue
                    if self._peer_state(q):
                        return self._stop(MISMATCH)
                    if not self.checked[q]:
                        self.waiting = q
                        return WAITING
                self.ip = i + 1
            elif w == COPY:
                d, doff, s, soff, n = (int(v) for v in code[i + 1:i + 6])
                bufs[d][doff:doff + n] = bufs[s][soff:soff + n]
                self.ip = i + 6
            elif w == REDUCE:
                d, doff, count, n = (int(v) for v in code[i + 1:i + 5])
                nbytes, dt = count * self.dtype.itemsize, self.dtype
                operands = [bufs[b][off:off + nbytes].view(dt)
                            for b, off in zip(code[i + 5:i + 5 + 2 * n:2].tolist(), code[i + 6:i + 6 + 2 * n:2].tolist(),
                                              strict=True)]
                a.fence()
                kernels.reduce_into(bufs[d][doff:doff + nbytes].view(dt), operands, self.op)
                self.ip = i + 5 + 2 * n
            elif w == PEER_READ:
                d, doff, q, soff, n = (int(v) for v in code[i + 1:i + 6])
                c = a.ctrl[q]
                rc = lib.coll_peer_read(int(c[_arena.PID]), ffi.from_buffer(bufs[d][doff:doff + n]),
                                        int(c[_arena.ORIGIN]) + soff, n)
                if rc != 0:
                    raise peer_read_error(q, rc)
                self.ip = i + 6
            elif w == PUBLISH:
                a.publish(base + int(code[i + 1]))
                self.events += 1
                self.ip = i + 2
            elif w == SET_READ:
                a.publish(base + int(code[i + 1]), read_only=True)
                self.ip = i + 2
            else:
                raise RuntimeError(f"shared-memory program: bad instruction {int(w)} at word {i}")


__all__ = ["DONE", "Interpreter", "MISMATCH", "Program", "Runner", "UnplacedInput", "WAITING", "c_enabled",
           "c_kernel", "compile_plan"]
