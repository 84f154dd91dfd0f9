"""Explicit phases: a communication pattern given as every node's list of operations.

Builders write peers and chunks as functions of the member index; an imported program (an MSCCL-IR file) or a
hand-written test case is instead a list of operations per node. `explicit_phase` turns such lists into an
ordinary `Phase`, so every executor runs it unchanged: its one round pattern looks the operations up in
tables, one *lane* per position of an operation within a (node, round), each lane of one kind. The tables hold
lanes x rounds x nodes entries, which is what an explicit program is; builders that scale use slot functions.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .ops import OpKind
from .phase import Phase, Round, Slot


class ExplicitOp(NamedTuple):
    """In `round`, exchange chunks [chunk, chunk + nchunks) with node `peer` (itself: a local copy or reduction),
    whose end of the message starts at its chunk `remote`."""

    round: int
    kind: OpKind
    peer: int
    chunk: int
    nchunks: int
    remote: int


def explicit_phase(name: str, ops: Sequence[Sequence[ExplicitOp]], chunks) -> Phase:
    """One phase over nodes 0..len(ops)-1 (one group; member m is node m) whose program for node m is ops[m],
    stably sorted by round: within a round the given order is the program order."""
    num = len(ops)
    per_node = [sorted(node_ops, key=lambda o: o.round) for node_ops in ops]
    rounds = 1 + max((o.round for node_ops in per_node for o in node_ops), default=-1)
    if any(o.round < 0 for node_ops in per_node for o in node_ops):
        raise ValueError(f"explicit phase {name!r}: rounds must be >= 0")
    kinds: list[OpKind] = []
    lanes_of: dict[OpKind, list[int]] = {k: [] for k in OpKind}
    placed: list[tuple[int, int, int, ExplicitOp]] = []  # (lane, round, node, op)
    for node, node_ops in enumerate(per_node):
        prev, last_round = -1, -1
        for op in node_ops:
            if op.round != last_round:
                prev, last_round = -1, op.round
            candidates = lanes_of[op.kind]
            i = bisect_right(candidates, prev)
            if i == len(candidates):  # no lane of this kind after the previous op: open one at the end
                lane = len(kinds)
                kinds.append(OpKind(op.kind))
                candidates.append(lane)
            else:
                lane = candidates[i]
            placed.append((lane, op.round, node, op))
            prev = lane
    shape = (len(kinds), max(rounds, 1), max(num, 1))
    peer = np.full(shape, -1, dtype=np.int32)
    chunk = np.zeros(shape, dtype=np.int32)
    nchunks = np.zeros(shape, dtype=np.int32)
    remote = np.zeros(shape, dtype=np.int32)
    for lane, rnd, node, op in placed:
        peer[lane, rnd, node] = op.peer
        chunk[lane, rnd, node] = op.chunk
        nchunks[lane, rnd, node] = op.nchunks
        remote[lane, rnd, node] = op.remote

    def slots(m, it):
        return [Slot(kind, peer[lane, it, m], chunk[lane, it, m], nchunks[lane, it, m], remote[lane, it, m])
                for lane, kind in enumerate(kinds)]

    digest = hashlib.blake2b(digest_size=16)
    digest.update(repr((shape, [int(k) for k in kinds])).encode())
    for table in (peer, chunk, nchunks, remote):
        digest.update(table.tobytes())
    members = np.arange(num, dtype=np.int64)[None, :]
    return Phase(name, members, chunks, [Round(slots, repeats=rounds, uniform=False, name=name,
                                               content=digest.hexdigest())])
