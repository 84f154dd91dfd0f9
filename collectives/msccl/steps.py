"""A schedule's messages as MSCCL steps: buffers, chunk unit, staged reductions (the writer's first half).

Buffers. A schedule on the contract's logical vector (allreduce, allgather, reduce_scatter, broadcast, reduce)
is an in-place program: the vector is MSCCL's input buffer (its output for allgather, which NCCL places at
recvbuff + rank * count in place), anything beyond it scratch. Out of place (`inplace=False`) the vector lives
in scratch, with a copy of the input into it first and of the output out of it last (NCCL's send buffer is the
caller's and stays untouched). A schedule with input and output regions (alltoall) maps its input region to i,
its output region to o and the rest to scratch; equal regions make it in-place.

Chunks. The file counts in chunks of count x multiplier / nchunksperloop elements; the writer takes the largest
unit dividing every boundary the schedule uses at its count. A message of MAX_COUNT chunks or more is several
steps; a message crossing a buffer edge (at either end) is one step per buffer.

Stages. Step order follows the IR's rounds: stage (r, 0) holds round r's messages. A round in which several
receives land in one range as one fused reduction (`collectives.execution.land_receives`: operands ordered by
source node) is staged the way MSCCL programs reduce from several peers: each operand is received (or copied)
into a scratch slot in stage (r, 0), and stage (r, 1) folds the slots into the range with a copy and a run of
local reductions in one threadblock (the executor fuses consecutive `re` steps), in the same operand order, so
the result is bitwise the IR's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..schedule import ALLTOALL, OpKind, Schedule
from ..schedule.collective import work_size as contract_work_size
from .fileformat import MAX_COUNT, MAX_OFFSET


@dataclass
class MStep:
    """One MSCCL step on `node` in `stage` (chunks as (buffer, chunk) pairs)."""

    node: int
    stage: tuple[int, int]  # (IR round, 0 for its messages / 1 for its staged reductions' folds)
    phase: int  # 0: a send (reads at the stage's start), 1: a step that writes
    order: tuple  # program order within the stage
    type: str
    peer_send: int = -1
    peer_recv: int = -1
    src: tuple[str, int] = ("i", -1)
    dst: tuple[str, int] = ("o", -1)
    cnt: int = 0
    reads: tuple[str, int, int] | None = None  # (buffer, chunk, n) read, not a reduction's accumulator
    writes: tuple[str, int, int] | None = None
    pair: MStep | None = None  # a receive's send
    channel: int = 0
    tb: int = -1
    pos: int = -1  # position among its threadblock's steps (nops not counted)
    index: int = -1  # position in its threadblock, nops counted: what deps refer to
    deps: list[MStep] = field(default_factory=list)
    hasdep: bool = False

    def key(self) -> tuple:
        return self.stage, self.phase, self.order


class Buffers:
    """Work-buffer positions -> (MSCCL buffer, element offset), per node (see the module docstring)."""

    def __init__(self, s: Schedule, inplace: bool | None) -> None:
        p = s.world_size
        regions = s.regions
        vector_mode = s.collective not in ALLTOALL and (regions is None or (regions.input is None
                                                                             and regions.output is None))
        self.copies = False
        self.intervals: list[list[tuple[int, int, str, int]]] = []  # per node: (start, stop, buffer, offset)
        self.in_size, self.out_size = s.count, s.output_count
        if vector_mode:
            vector = contract_work_size(s.collective, p, s.count)
            self.inplace = True if inplace is None else bool(inplace)
            if self.inplace:
                buf = "o" if s.collective == "allgather" else "i"
                ivs = [(0, vector, buf, 0), (vector, s.work_size, "s", 0)]
                self.scratch = s.work_size - vector
            else:
                self.copies = True
                ivs = [(0, s.work_size, "s", 0)]
                self.scratch = s.work_size
            self.intervals = [ivs] * p
            return
        ins = [s.input_range(r) for r in range(p)]
        outs = [s.output_range(r) for r in range(p)]
        same = all(a == b for a, b in zip(ins, outs, strict=True) if a is not None and b is not None)
        if inplace is not None and bool(inplace) != same:
            raise ValueError(f"{s.algorithm}: its input and output regions {'coincide' if same else 'differ'}, so it "
                             f"is an {'in-place' if same else 'out-of-place'} program; write it with inplace={same}")
        self.inplace = same
        self.scratch = 0
        for r in range(p):
            taken = sorted({rng for rng in (ins[r], outs[r]) if rng is not None and rng[1] > rng[0]})
            ivs = []
            if ins[r] is not None:
                ivs.append((ins[r][0], ins[r][1], "i", 0))
            if outs[r] is not None and outs[r] != ins[r]:
                ivs.append((outs[r][0], outs[r][1], "o", 0))
            pos, off = 0, 0
            for a, b in [*taken, (s.work_size, s.work_size)]:
                if a > pos:
                    ivs.append((pos, a, "s", off))
                    off += a - pos
                pos = max(pos, b)
            self.scratch = max(self.scratch, off)
            self.intervals.append(sorted(ivs))

    def edges(self, node: int) -> np.ndarray:
        return np.unique(np.array([x for a, b, _, _ in self.intervals[node] for x in (a, b)], dtype=np.int64))

    def locate(self, node: int, start: int, stop: int) -> tuple[str, int]:
        for a, b, buf, off in self.intervals[node]:
            if a <= start and stop <= b and (start < b or start == stop):
                return buf, off + start - a
        raise AssertionError(f"range [{start}, {stop}) of node {node} crosses buffers")  # pragma: no cover


def multiplier(collective: str, p: int) -> int:
    """The executor's sizeMultiplier in the library's count terms: chunks split count x this."""
    return p if collective == "allgather" else 1


def _runs(t, recv_rows: list[int]) -> list[list[int]]:
    """A node's receives of one round, in program order, as land_receives fuses them: a run starts at any
    receive and goes on while the next is a reduce-receive into the same range."""
    runs: list[list[int]] = []
    for r in recv_rows:
        last = runs[-1][-1] if runs else None
        if last is not None and int(t.kind[r]) == int(OpKind.RECV_REDUCE) and t.start[r] == t.start[last] \
                and t.stop[r] == t.stop[last]:
            runs[-1].append(r)
        else:
            runs.append([r])
    return runs


def build_steps(s: Schedule, t, pairs, bufs: Buffers) -> tuple[list[MStep], int, int]:
    """(steps, chunk unit in elements, scratch chunks) of schedule `s` (expanded as `t`, messages `pairs`)."""
    send_rows, recv_rows = pairs
    sender = dict(zip(recv_rows.tolist(), send_rows.tolist(), strict=True))
    by_node_round: dict[tuple[int, int], list[int]] = {}
    for rr in sorted(recv_rows.tolist()):  # rows are node-major program order
        by_node_round.setdefault((int(t.node[rr]), int(t.round[rr])), []).append(rr)
    runs = [run for rows in by_node_round.values() for run in _runs(t, rows)]
    for (node, rnd), rows in by_node_round.items():
        spans = sorted({(int(t.start[r]), int(t.stop[r])) for r in rows if t.stop[r] > t.start[r]})
        for (a0, b0), (a1, b1) in zip(spans[:-1], spans[1:], strict=True):
            if a1 < b0:
                raise ValueError(f"{s.algorithm}: node {node}, round {rnd} writes [{a0}, {b0}) and [{a1}, {b1}), which "
                                 "overlap: MSCCL steps land one after another, so write the schedule with them in "
                                 "different rounds")
    # cut every run's messages at every buffer edge of the receiver and of any of its senders
    cut_runs = []
    for run in runs:
        b0 = int(t.start[run[0]])
        n = int(t.stop[run[0]] - b0)
        cuts = {0, n}
        for rr in run:
            sr = sender[rr]
            for node, base in ((int(t.node[rr]), b0), (int(t.node[sr]), int(t.start[sr]))):
                e = bufs.edges(node)
                cuts.update((e[(e > base) & (e < base + n)] - base).tolist())
        cuts = sorted(cuts)
        spans = list(zip(cuts[:-1], cuts[1:], strict=True)) or [(0, 0)]
        cut_runs.append((run, spans))
    marks = [s.count * multiplier(s.collective, s.world_size), s.count, s.output_count, bufs.scratch]
    for node in range(s.world_size):
        marks += bufs.edges(node).tolist()
    for run, spans in cut_runs:
        for rr in run:
            for lo, hi in spans:
                marks += [int(t.start[rr]) + lo, int(t.start[sender[rr]]) + lo, hi - lo]
    unit = 0
    for m in marks:
        unit = math.gcd(unit, int(m))
    unit = max(unit, 1)
    staging = _Staging(bufs.scratch // unit)
    steps: list[MStep] = []
    shift = 1 if bufs.copies else 0
    for run, spans in cut_runs:
        for lo, hi in spans:
            n = (hi - lo) // unit
            for k0 in range(0, max(n, 1), MAX_COUNT - 1):
                cnt = min(MAX_COUNT - 1, n - k0) if n else 0
                _run_steps(s, t, run, sender, bufs, unit, lo // unit + k0, cnt, shift, staging, steps)
    if bufs.copies:
        _copies(s, t, bufs, unit, steps)
    if not bufs.inplace:
        written = next((x for x in steps if x.writes is not None and x.writes[0] == "i"), None)
        if written is not None:
            raise ValueError(f"{s.algorithm}: node {written.node} writes into its input region in round "
                             f"{written.stage[0] - shift}; an out-of-place MSCCL program must leave the caller's send "
                             "buffer untouched")
    for x in steps:
        for buf, off in (x.src, x.dst):
            if off > MAX_OFFSET:
                raise ValueError(f"{s.algorithm}: chunk offset {off} in buffer {buf!r} exceeds the executor's "
                                 f"{MAX_OFFSET} (int16 offsets); write at a smaller count (fewer chunks)")
    return steps, unit, bufs.scratch // unit + staging.size


class _Staging:
    """Scratch slots for staged reductions, after the schedule's own scratch; reused from round to round."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.size = 0
        self.used: dict[tuple[int, tuple[int, int]], int] = {}

    def slot(self, node: int, stage: tuple[int, int], cnt: int) -> int:
        key = (node, stage)
        at = self.used.get(key, 0)
        self.used[key] = at + cnt
        self.size = max(self.size, at + cnt)
        return self.base + at


def _run_steps(s: Schedule, t, run: list[int], sender: dict[int, int], bufs: Buffers, unit: int, c0: int, cnt: int,
               shift: int, staging: _Staging, steps: list[MStep]) -> None:
    """Steps of chunks [c0, c0 + cnt) (relative to the receives' ranges) of one fused run of receives."""
    node, rnd = int(t.node[run[0]]), int(t.round[run[0]]) + shift
    stage, fold = (rnd, 0), (rnd, 1)
    target = bufs.locate(node, int(t.start[run[0]]) + c0 * unit, int(t.start[run[0]]) + (c0 + cnt) * unit)
    dst = (target[0], target[1] // unit)
    staged = len(run) > 1
    operands = []  # (source node, where the operand lands)
    local = None
    for i, rr in enumerate(run):
        sr = sender[rr]
        a_node = int(t.node[sr])
        a0 = int(t.start[sr]) + c0 * unit
        loc = bufs.locate(a_node, a0, a0 + cnt * unit)
        src = (loc[0], loc[1] // unit)
        reduce = int(t.kind[rr]) == int(OpKind.RECV_REDUCE)
        to = ("s", staging.slot(node, fold, cnt)) if staged else dst
        order = (int(t.index[rr]), c0)
        if a_node == node:
            kind = "cpy" if staged or not reduce else "re"
            steps.append(MStep(node, stage, 1, order, kind, src=src, dst=to, cnt=cnt, reads=(*src, cnt),
                               writes=(*to, cnt)))
        else:
            send = MStep(a_node, stage, 0, (int(t.index[sr]), c0), "s", peer_send=node, src=src, dst=to, cnt=cnt,
                         reads=(*src, cnt))
            kind = "r" if staged or not reduce else "rrc"
            steps += [send, MStep(node, stage, 1, order, kind, peer_recv=a_node, src=to if kind == "rrc" else src,
                                  dst=to, cnt=cnt, writes=(*to, cnt), pair=send)]
        operands.append((a_node, to))
        if i == 0 and staged and reduce:  # the run reduces into the local value: stage that value too
            local = ("s", staging.slot(node, fold, cnt))
            steps.append(MStep(node, stage, 1, (int(t.index[rr]), c0, -1), "cpy", src=dst, dst=local, cnt=cnt,
                               reads=(*dst, cnt), writes=(*local, cnt)))
    if not staged:
        return
    # land_receives' operand order: the payloads, then the local value as this node's, stably by source node
    if local is not None:
        operands.append((node, local))
    operands.sort(key=lambda item: item[0])
    for i, (_, slot) in enumerate(operands):
        steps.append(MStep(node, fold, 1, (int(t.index[run[0]]), c0, i), "cpy" if i == 0 else "re", src=slot, dst=dst,
                           cnt=cnt, reads=(*slot, cnt), writes=(*dst, cnt)))


def _copies(s: Schedule, t, bufs: Buffers, unit: int, steps: list[MStep]) -> None:
    """Out of place on the logical vector: copy each input into it first and each output out of it last."""
    last = int(t.round.max(initial=-1)) + 2
    for r in range(s.world_size):
        for rng, buf, rnd in ((s.input_range(r), "i", 0), (s.output_range(r), "o", last)):
            if rng is None or rng[1] == rng[0]:
                continue
            vec = bufs.locate(r, rng[0], rng[1])
            n = (rng[1] - rng[0]) // unit
            here, there = (buf, 0), (vec[0], vec[1] // unit)
            src, dst = (here, there) if buf == "i" else (there, here)
            for k0 in range(0, n, MAX_COUNT - 1):
                cnt = min(MAX_COUNT - 1, n - k0)
                sc, dc = (src[0], src[1] + k0), (dst[0], dst[1] + k0)
                steps.append(MStep(r, (rnd, 0), 1, (-1, k0), "cpy", src=sc, dst=dc, cnt=cnt, reads=(*sc, cnt),
                                   writes=(*dc, cnt)))
