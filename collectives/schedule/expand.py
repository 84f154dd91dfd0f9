"""Expand every node's program into one columnar table (for executors that see the whole schedule)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .schedule import Schedule

_COLUMNS = ("node", "index", "round", "kind", "peer", "start", "stop", "remote")


@dataclass
class OpTable:
    """All operations of all nodes: one row per op, sorted by (node, program order)."""

    node: np.ndarray
    index: np.ndarray  # index of the op in its node's program
    round: np.ndarray
    kind: np.ndarray
    peer: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    remote: np.ndarray  # the peer's first element of the message
    origin: Callable[[int, int], str | None] | None = field(default=None, repr=False)  # Schedule.origin

    def __len__(self) -> int:
        return int(self.node.shape[0])

    def take(self, rows: np.ndarray) -> OpTable:
        return OpTable(*(getattr(self, f)[rows] for f in _COLUMNS), origin=self.origin)


def expand(schedule: Schedule) -> OpTable:
    progs = [schedule.program(n) for n in range(schedule.num_nodes)]
    sizes = np.array([len(p) for p in progs], dtype=np.int64)
    node = np.repeat(np.arange(schedule.num_nodes, dtype=np.int64), sizes)
    index = np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    cat = lambda f, dt: (np.concatenate([getattr(p, f) for p in progs]).astype(dt) if progs  # noqa: E731
                         else np.zeros(0, dt))
    return OpTable(node, index, cat("round", np.int64), cat("kind", np.int8), cat("peer", np.int64),
                   cat("start", np.int64), cat("stop", np.int64), cat("remote", np.int64),
                   origin=schedule.origin if schedule.op_origin is not None else None)
