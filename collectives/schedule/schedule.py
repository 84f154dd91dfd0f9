"""The `Schedule`: one algorithm's complete plan, built once and consumed by every executor."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ScheduleError
from . import collective as contract
from .chunks import ChunkTable
from .ops import OpKind, Program
from .phase import Phase
from .regions import Regions

_MAX, _MIN = np.maximum.reduce, np.minimum.reduce


def _int64(value, shape: tuple[int, ...]) -> np.ndarray:
    """A slot field (an int or an integer array) as an int64 array of `shape` (what phase.evaluate_slot gives,
    without marking it read-only: program() only reads it and builds new arrays from it)."""
    if type(value) is int or isinstance(value, np.integer):
        out = np.empty(shape, np.int64)
        out.fill(value)
        return out
    a = np.asarray(value, dtype=np.int64)
    if a.shape == shape:
        return a
    return np.broadcast_to(a, shape)


@dataclass
class Schedule:
    """Phases of rounds over `num_nodes` nodes: ranks 0..world_size-1, then switch nodes (if any).

    `program(node)` expands one node's operations on demand; only `expand` (every node's program in one table,
    which the verifier, the emulator and the event simulator read) keeps its table on a schedule of up to
    expand.KEEP_MAX_OPS operations, so a schedule is not modified once built.
    `notes` records decisions a user should see (for example why in-network reduction fell back).
    `regions` declares a work-buffer layout beyond the contract's (see regions.py), `counts` is an alltoallv's
    p x p matrix, and `op_origin(node, index)` names where op `index` of a node's program came from (an imported
    MSCCL file's GPU, threadblock and step), for error messages.
    """

    algorithm: str
    collective: str
    world_size: int
    count: int
    phases: list[Phase]
    num_nodes: int = -1
    root: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    node_labels: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    topology: Any = None
    regions: Regions | None = None
    counts: np.ndarray | None = None
    op_origin: Callable[[int, int], str | None] | None = field(default=None, repr=False)
    _expansion: Any = field(default=None, init=False, repr=False, compare=False)  # expand.py keeps its table here

    def __post_init__(self) -> None:
        contract.check_shape(self.collective, self.world_size, self.count, self.root, self.counts)
        if self.counts is not None:
            self.counts = contract.check_counts(self.counts, self.world_size)
        if self.num_nodes < 0:
            self.num_nodes = self.world_size
        if self.num_nodes < self.world_size:
            raise ValueError("num_nodes counts ranks and switch nodes, so it cannot be below world_size")
        if self.regions is not None:
            self._check_regions()

    def _check_regions(self) -> None:
        r = self.regions
        if not isinstance(r, Regions):
            raise TypeError(f"regions must be a collectives.schedule.Regions, got {type(r).__name__}")
        # count is every rank's input size (alltoallv: the largest); output_count the largest output
        for name, start, size in (("input", r.input, self.count), ("output", r.output, self.output_count)):
            if start is not None and start + size > r.size:
                raise ValueError(f"{self.algorithm}: the {name} region [{start}, {start + size}) does not fit the "
                                 f"declared work buffer of {r.size} elements")
        default = contract.work_size(self.collective, self.world_size, self.count, self.counts)
        if (r.input is None or r.output is None) and r.size < default:
            raise ValueError(f"{self.algorithm}: a work buffer of {r.size} elements cannot hold the contract's "
                             f"{default}-element layout its input/output placement keeps")

    # -- the collective's contract -------------------------------------------------------------------
    @property
    def work_size(self) -> int:
        """Elements of every node's work buffer."""
        if self.regions is not None:
            return self.regions.size
        return contract.work_size(self.collective, self.world_size, self.count, self.counts)

    @property
    def output_count(self) -> int:
        """Elements of each rank's output (alltoallv: the largest; see `output_count_of`)."""
        return contract.output_count(self.collective, self.world_size, self.count, None, self.counts)

    def input_count(self, rank: int) -> int:
        """Elements of rank's input array."""
        return contract.input_count(self.collective, self.world_size, self.count, rank, self.counts)

    def output_count_of(self, rank: int) -> int:
        """Elements of rank's output array."""
        return contract.output_count(self.collective, self.world_size, self.count, rank, self.counts)

    def input_range(self, rank: int) -> tuple[int, int] | None:
        """Where rank's input is placed in its work buffer before the first round (None: not read)."""
        if rank >= self.world_size:
            return None
        rng = contract.input_range(self.collective, self.world_size, self.count, rank, self.root, self.counts)
        if rng is None or self.regions is None or self.regions.input is None:
            return rng
        return self.regions.input, self.regions.input + rng[1] - rng[0]

    def output_range(self, rank: int) -> tuple[int, int] | None:
        """Where rank's output is read from its work buffer after the last round (None: it has none)."""
        if rank >= self.world_size:
            return None
        rng = contract.output_range(self.collective, self.world_size, self.count, rank, self.root, self.counts)
        if rng is None or self.regions is None or self.regions.output is None:
            return rng
        return self.regions.output, self.regions.output + rng[1] - rng[0]

    def output_blocks(self, rank: int) -> list[contract.OutputBlock]:
        """What rank's output must hold (offsets relative to its output range)."""
        if rank >= self.world_size:
            return []
        return contract.output_blocks(self.collective, self.world_size, self.count, rank, self.root, self.counts)

    def origin(self, node: int, index: int) -> str | None:
        """Where op `index` of node's program came from, if the schedule knows (an imported file's step)."""
        return None if self.op_origin is None else self.op_origin(node, index)

    @property
    def num_rounds(self) -> int:
        return sum(p.num_rounds for p in self.phases)

    def is_switch(self, node: int) -> bool:
        return node >= self.world_size

    def label(self, node: int) -> str:
        return self.node_labels.get(node, f"rank {node}" if node < self.world_size else f"switch node {node}")

    def phase_rounds(self) -> list[tuple[Phase, int]]:
        """Each phase with the global index of its first round."""
        out, base = [], 0
        for phase in self.phases:
            out.append((phase, base))
            base += phase.num_rounds
        return out

    # -- per-node expansion --------------------------------------------------------------------------
    def program(self, node: int) -> Program:
        """This node's operations, in execution order; cost is linear in its own operation count."""
        if not (0 <= node < self.num_nodes):
            raise ValueError(f"node must be in [0, {self.num_nodes}), got {node}")
        cols: list[tuple[np.ndarray, ...]] = []
        base = busy_lanes = 0
        for phase in self.phases:
            where = phase.locate(node)
            if where is None:
                base += phase.num_rounds
                continue
            g, m = where
            members = phase.groups[g]
            per_member = not isinstance(phase.chunks, ChunkTable)
            for rnd in phase.rounds:
                if rnd.repeats == 0:
                    continue
                if rnd.window is None:
                    its = np.arange(rnd.repeats, dtype=np.int64)
                else:
                    lo, hi = rnd.window(m)
                    its = np.arange(max(int(lo), 0), min(int(hi), rnd.repeats), dtype=np.int64)
                    if its.size == 0:
                        base += rnd.repeats
                        continue
                lanes = []  # (order, kind, iterations, peer members, first chunk, chunks, remote chunk or None)
                shape = its.shape
                for order, slot in enumerate(rnd.slots(m, its)):
                    # the hot loop of every expansion (hundreds of thousands of slots per test run): one max
                    # says whether the lane is busy at all and whether its peers exist, one min whether it needs
                    # masking; idle lanes allocate nothing more
                    peer = _int64(slot.peer, shape)
                    top = int(_MAX(peer)) if peer.size else -1
                    if top < 0:
                        continue
                    if top >= members.size:
                        it = int(its[np.argmax(peer)])
                        raise ScheduleError(
                            f"node {node}: phase {phase.name!r}, round {base + it}, slot {order} names peer member "
                            f"{top} but its group has members 0..{members.size - 1}", node=node, round=base + it)
                    every = int(_MIN(peer)) >= 0  # then the lane needs no masking
                    chunk, nchunks = _int64(slot.chunk, shape), _int64(slot.nchunks, shape)
                    rchunk = None if slot.remote is None else _int64(slot.remote, shape)
                    if rchunk is None and per_member:
                        rchunk = chunk  # the same chunk id, in the peer's row of a per-member table
                    lane_its = its
                    if not every:
                        active = peer >= 0
                        lane_its, peer, chunk, nchunks = its[active], peer[active], chunk[active], nchunks[active]
                        rchunk = None if rchunk is None else rchunk[active]
                    lanes.append((order, int(slot.kind), lane_its, peer, chunk, nchunks, rchunk))
                if lanes:
                    cols.append(self._lane_columns(phase, g, m, members, base, lanes))
                    busy_lanes += len(lanes)
                base += rnd.repeats
        if not cols:
            return Program.empty(node)
        if busy_lanes == 1:  # one busy lane: its columns are new arrays, in round order already
            return Program(node, *cols[0][:1], *cols[0][2:])
        rnd_, order_, kind, peer, start, stop, remote = (np.concatenate(c) for c in zip(*cols, strict=True))
        idx = np.lexsort((order_, rnd_))
        return Program(node, rnd_[idx], kind[idx], peer[idx], start[idx], stop[idx], remote[idx])

    @staticmethod
    def _lane_columns(phase: Phase, g: int, m: int, members: np.ndarray, base: int, lanes: list) -> tuple:
        """Program columns of one round pattern's active lanes, with one chunk-table lookup for all of them."""
        if len(lanes) == 1:  # most round patterns of a node have one busy lane: no concatenation
            order_, kind_, its, peer_m, lo, n, rlo = lanes[0]
            size = its.shape[0]
            start, stop = (np.asarray(v, np.int64) for v in phase.chunks.elements(g, lo, lo + n, member=m))
            if rlo is None:
                remote = start.copy()
            else:
                remote = np.array(phase.chunks.elements(g, rlo, rlo + n, member=peer_m)[0], np.int64)
            return (base + its, np.full(size, order_, np.int64), np.full(size, kind_, np.int8), members[peer_m],
                    start, stop, remote)
        sizes = [len(x[2]) for x in lanes]
        its, peer_m, lo, n = (np.concatenate([x[i] for x in lanes]) for i in (2, 3, 4, 5))
        start, stop = (np.asarray(v, np.int64) for v in phase.chunks.elements(g, lo, lo + n, member=m))
        remote = start.copy()
        moved = [x[6] is not None for x in lanes]
        if any(moved):
            sel = np.repeat(np.array(moved), sizes)
            rlo = np.concatenate([x[6] for x in lanes if x[6] is not None])
            remote[sel] = np.asarray(phase.chunks.elements(g, rlo, rlo + n[sel], member=peer_m[sel])[0], np.int64)
        order = np.repeat(np.array([x[0] for x in lanes], np.int64), sizes)
        kind = np.repeat(np.array([x[1] for x in lanes], np.int8), sizes)
        return base + its, order, kind, members[peer_m], start, stop, remote

    def describe(self) -> str:
        lines = [f"{self.algorithm} {self.collective}: world_size={self.world_size} count={self.count} "
                 f"nodes={self.num_nodes} rounds={self.num_rounds}"]
        if self.regions is not None:
            lines.append(f"  regions: {self.regions.describe()}")
        for phase, base in self.phase_rounds():
            lines.append(f"  phase {phase.name!r}: rounds {base}..{base + phase.num_rounds - 1}, "
                         f"{phase.groups.shape[0]} group(s) of {phase.group_size}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


__all__ = ["Schedule", "OpKind"]
