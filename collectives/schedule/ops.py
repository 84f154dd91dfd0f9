"""Operations of one node's program, and the columnar `Program` that holds them.

Every message has two ends and each end knows both ranges: `start`/`stop` are this node's elements (read by a
send, written by a receive) and `remote` is the first element at the peer (written by the peer's receive, or
read by the peer's send). Most schedules keep the *position invariant* (element i of every node's work buffer
stands for element i of the collective's logical vector, so `remote == start`); a message may also land at a
different offset than it is read from (an alltoall moves input block d of rank s into output block s of rank
d; an imported MSCCL program copies between its input, output and scratch buffers). Knowing the peer's range
without matching programs lets an executor read a peer's memory directly (the shared-memory transport reads a
peer's window at `[remote, remote + length)`). The verifier proves both ends of every message agree.

A node may message itself: a send to itself and a receive from itself in the same round are a local copy
(RECV) or a local reduction (RECV_REDUCE), matched in program order per (node, node) pair like any message.

Round semantics, shared by every executor: all operations of one round read the state the node had when the
round began; their writes (stored or reduced receives) land when the round ends, in program order. Several
reduce-receives into one range in one round are therefore one fused reduction, applied in program order.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np


class OpKind(enum.IntEnum):
    SEND = 0
    RECV = 1  # receive and store (overwrite)
    RECV_REDUCE = 2  # receive and reduce into the local range with the collective's op


_KINDS = {kind.value: kind for kind in OpKind}  # _KINDS[k] is OpKind(k)


class Op(NamedTuple):
    """One operation: in `round`, exchange elements [start, stop) with node `peer`, whose end of the message
    starts at its element `remote` (equal to `start` under the position invariant)."""

    round: int
    kind: OpKind
    peer: int
    start: int
    stop: int
    remote: int

    @property
    def length(self) -> int:
        return self.stop - self.start

    @property
    def remote_stop(self) -> int:
        return self.remote + self.stop - self.start

    def describe(self) -> str:
        verb = {OpKind.SEND: "send to", OpKind.RECV: "recv from", OpKind.RECV_REDUCE: "recv+reduce from"}
        where = "" if self.remote == self.start else f" (its [{self.remote}, {self.remote_stop}))"
        return (f"round {self.round}: {verb[self.kind]} node {self.peer} elements [{self.start}, {self.stop})"
                + where)


class Program:
    """A node's ordered operations, stored as numpy columns (sorted by round, then by slot order).

    Columnar storage keeps a 663,550-operation ring program at a few megabytes and lets the verifier and
    simulators process many programs with array operations; iterating yields `Op` tuples. `remote` defaults to
    `start` (position-invariant messages).
    """

    __slots__ = ("node", "round", "kind", "peer", "start", "stop", "remote")

    def __init__(self, node: int, round: np.ndarray, kind: np.ndarray, peer: np.ndarray,
                 start: np.ndarray, stop: np.ndarray, remote: np.ndarray | None = None) -> None:
        self.node = node
        self.round = round
        self.kind = kind
        self.peer = peer
        self.start = start
        self.stop = stop
        self.remote = start if remote is None else remote

    @classmethod
    def empty(cls, node: int) -> Program:
        z = np.zeros(0, dtype=np.int64)
        return cls(node, z, z.astype(np.int8), z, z, z, z)

    def __len__(self) -> int:
        return int(self.round.shape[0])

    def __getitem__(self, index: int) -> Op:
        return Op(int(self.round[index]), OpKind(int(self.kind[index])), int(self.peer[index]),
                  int(self.start[index]), int(self.stop[index]), int(self.remote[index]))

    def __iter__(self) -> Iterator[Op]:
        kinds = _KINDS  # OpKind(k) without the enum's lookup machinery (a million ops per test run)
        for r, k, p, a, b, q in zip(self.round.tolist(), self.kind.tolist(), self.peer.tolist(),
                                    self.start.tolist(), self.stop.tolist(), self.remote.tolist(), strict=True):
            yield Op(r, kinds[k], p, a, b, q)

    def rounds(self) -> Iterator[tuple[int, list[tuple[int, Op]]]]:
        """Yield (round, [(op index, op), ...]) for each round in which this node has operations."""
        if len(self) == 0:
            return
        bounds = np.flatnonzero(np.diff(self.round)) + 1
        starts = np.concatenate(([0], bounds))
        stops = np.concatenate((bounds, [len(self)]))
        ops = list(self)
        for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
            yield ops[a].round, [(i, ops[i]) for i in range(a, b)]

    def __repr__(self) -> str:
        return f"Program(node={self.node}, ops={len(self)})"
