"""Expand every node's program into one columnar table (for executors that see the whole schedule)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .ops import OpKind, Program
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


KEEP_MAX_OPS = 1 << 18  # a schedule keeps its expansion up to this many operations (~15 MB)


def expand(schedule: Schedule) -> OpTable:
    """Every node's program in one table (read-only arrays). The verifier, the emulator and the event simulator
    all expand the schedule they are given, so a schedule keeps its table (up to KEEP_MAX_OPS operations) for
    the next of them: a schedule is built once and not modified (its phases, their groups, chunk tables and
    rounds are compared by identity, so replacing any of them expands anew)."""
    shape = _shape(schedule)
    kept = schedule._expansion
    if kept is not None and kept[0][0] == shape[0] and len(kept[0][1]) == len(shape[1]) and all(
            a is b for a, b in zip(kept[0][1], shape[1], strict=True)):
        return kept[1]
    progs = [schedule.program(n) for n in range(schedule.num_nodes)]
    sizes = np.array([len(p) for p in progs], dtype=np.int64)
    node = np.repeat(np.arange(schedule.num_nodes, dtype=np.int64), sizes)
    index = np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    cat = lambda f, dt: (np.concatenate([getattr(p, f) for p in progs]).astype(dt, copy=False) if progs  # noqa: E731
                         else np.zeros(0, dt))
    table = OpTable(node, index, cat("round", np.int64), cat("kind", np.int8), cat("peer", np.int64),
                    cat("start", np.int64), cat("stop", np.int64), cat("remote", np.int64),
                    origin=schedule.origin if schedule.op_origin is not None else None)
    for f in _COLUMNS:
        getattr(table, f).flags.writeable = False  # shared by every caller
    schedule._expansion = (shape, table) if len(table) <= KEEP_MAX_OPS else None
    return table


def _shape(schedule: Schedule) -> tuple[tuple, tuple]:
    """What a schedule's programs are made of: its sizes, and its parts as objects (kept alive with the table,
    so comparing them by identity is sound)."""
    parts: list = [schedule.phases, schedule.op_origin]
    sizes = [schedule.num_nodes, schedule.world_size, schedule.count, len(schedule.phases)]
    for ph in schedule.phases:
        parts += [ph, ph.groups, ph.chunks, ph.rounds, *ph.rounds]
        sizes.append(len(ph.rounds))
    return tuple(sizes), tuple(parts)


def node_programs(schedule: Schedule) -> list[Program]:
    """Every node's program, sliced from `expand`'s table (what [schedule.program(n) for each node] gives)."""
    t = expand(schedule)
    bounds = np.searchsorted(t.node, np.arange(schedule.num_nodes + 1)).tolist()
    return [Program(n, t.round[a:b], t.kind[a:b], t.peer[a:b], t.start[a:b], t.stop[a:b], t.remote[a:b])
            for n, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))]


def pair_sequence(src: np.ndarray, dst: np.ndarray, rnd: np.ndarray | None, order: np.ndarray) -> np.ndarray:
    """Position of each message among those with the same (src, dst[, round]), in program order."""
    keys = (order, dst, src) if rnd is None else (order, rnd, dst, src)
    idx = np.lexsort(keys)
    same = np.ones(idx.size, dtype=bool)
    if idx.size:
        same[0] = False
        same[1:] = (src[idx][1:] == src[idx][:-1]) & (dst[idx][1:] == dst[idx][:-1])
        if rnd is not None:
            same[1:] &= rnd[idx][1:] == rnd[idx][:-1]
    group_start = np.maximum.accumulate(np.where(~same, np.arange(idx.size), 0))
    seq = np.empty(idx.size, dtype=np.int64)
    seq[idx] = np.arange(idx.size) - group_start
    return seq


def pair_messages(t: OpTable, same_round: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
    """Rows of sends and of their receives, aligned: the k-th send from a to b (in a round, with same_round)
    meets the k-th receive at b from a, as MPI matches messages. None if some message has no partner."""
    is_send = t.kind == OpKind.SEND
    srows, rrows = np.flatnonzero(is_send), np.flatnonzero(~is_send)
    s_src, s_dst = t.node[srows], t.peer[srows]
    r_src, r_dst = t.peer[rrows], t.node[rrows]
    s_rnd = t.round[srows] if same_round else None
    r_rnd = t.round[rrows] if same_round else None
    s_seq = pair_sequence(s_src, s_dst, s_rnd, srows)  # global row order is node-major program order
    r_seq = pair_sequence(r_src, r_dst, r_rnd, rrows)
    zero_s, zero_r = np.zeros_like(s_src), np.zeros_like(r_src)
    skey = np.lexsort((s_seq, s_rnd if same_round else zero_s, s_dst, s_src))
    rkey = np.lexsort((r_seq, r_rnd if same_round else zero_r, r_dst, r_src))
    if srows.size != rrows.size:
        return None
    a = np.stack([s_src[skey], s_dst[skey], s_seq[skey]] + ([s_rnd[skey]] if same_round else []))
    b = np.stack([r_src[rkey], r_dst[rkey], r_seq[rkey]] + ([r_rnd[rkey]] if same_round else []))
    if not np.array_equal(a, b):
        return None
    return srows[skey], rrows[rkey]
