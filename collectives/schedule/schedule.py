"""The `Schedule`: one algorithm's complete plan, built once and consumed by every executor."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ScheduleError
from . import collective as contract
from .ops import OpKind, Program
from .phase import Phase, evaluate_slot


@dataclass
class Schedule:
    """Phases of rounds over `num_nodes` nodes: ranks 0..world_size-1, then switch nodes (if any).

    `program(node)` expands one node's operations on demand; nothing here holds every node's program.
    `notes` records decisions a user should see (for example why in-network reduction fell back).
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

    def __post_init__(self) -> None:
        contract.check_shape(self.collective, self.world_size, self.count, self.root)
        if self.num_nodes < 0:
            self.num_nodes = self.world_size
        if self.num_nodes < self.world_size:
            raise ValueError("num_nodes counts ranks and switch nodes, so it cannot be below world_size")

    # -- the collective's contract -------------------------------------------------------------------
    @property
    def work_size(self) -> int:
        return contract.work_size(self.collective, self.world_size, self.count)

    @property
    def output_count(self) -> int:
        return contract.output_count(self.collective, self.world_size, self.count)

    def input_range(self, rank: int) -> tuple[int, int] | None:
        if rank >= self.world_size:
            return None
        return contract.input_range(self.collective, self.world_size, self.count, rank, self.root)

    def output_range(self, rank: int) -> tuple[int, int] | None:
        if rank >= self.world_size:
            return None
        return contract.output_range(self.collective, self.world_size, self.count, rank, self.root)

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
        base = 0
        for phase in self.phases:
            where = phase.locate(node)
            if where is None:
                base += phase.num_rounds
                continue
            g, m = where
            members = phase.groups[g]
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
                for order, slot in enumerate(rnd.slots(m, its)):
                    peer, chunk, nchunks = evaluate_slot(slot, its.shape)
                    active = peer >= 0
                    if not active.any():
                        continue
                    peer_m, lo = peer[active], chunk[active]
                    if int(peer_m.max()) >= members.size:
                        it = int(its[active][np.argmax(peer_m)])
                        raise ScheduleError(
                            f"node {node}: phase {phase.name!r}, round {base + it}, slot {order} names peer member "
                            f"{int(peer_m.max())} but its group has members 0..{members.size - 1}",
                            node=node, round=base + it)
                    start, stop = phase.chunks.elements(g, lo, lo + nchunks[active])
                    n = peer_m.size
                    cols.append((base + its[active], np.full(n, order, np.int64), np.full(n, int(slot.kind), np.int8),
                                 members[peer_m], np.asarray(start, np.int64), np.asarray(stop, np.int64)))
                base += rnd.repeats
        if not cols:
            return Program.empty(node)
        rnd_, order_, kind, peer, start, stop = (np.concatenate(c) for c in zip(*cols, strict=True))
        idx = np.lexsort((order_, rnd_))
        return Program(node, rnd_[idx], kind[idx], peer[idx], start[idx], stop[idx])

    def describe(self) -> str:
        lines = [f"{self.algorithm} {self.collective}: world_size={self.world_size} count={self.count} "
                 f"nodes={self.num_nodes} rounds={self.num_rounds}"]
        for phase, base in self.phase_rounds():
            lines.append(f"  phase {phase.name!r}: rounds {base}..{base + phase.num_rounds - 1}, "
                         f"{phase.groups.shape[0]} group(s) of {phase.group_size}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


__all__ = ["Schedule", "OpKind"]
