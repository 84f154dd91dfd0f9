"""Phases, rounds and slots: an algorithm's communication pattern as functions of the member index.

A phase runs the same pattern side by side in several *groups* of nodes (every NVLink domain at once, every
rail at once, or one group holding all ranks). Within a group, nodes are *members* 0..M-1. A phase is a list of
rounds; a `Round` is one pattern repeated `repeats` times, and its `slots(m, it)` function says, for member `m`
at iteration `it`, which messages it sends and receives. The function must work on Python ints and on numpy
arrays alike (broadcasting m against it):

* called with one member and `it = np.arange(repeats)`, it yields that member's whole part of the phase
  (how `Schedule.program(node)` builds one node's program in time linear in its own operations);
* called with `m = np.arange(M)` and one iteration, it yields the whole round at once (how the analytic
  simulator costs 331,776 ranks without expanding every program).

Each `Slot` is one lane: a kind (send, receive-store, receive-reduce), a peer member index (-1 where the slot
is idle for that member and iteration), a range of chunks [chunk, chunk + nchunks) of the phase's chunk table
and, when the message lands at (or comes from) a different place at the peer, `remote`: the peer's first chunk
(default: the same chunk; the peer's element range comes from the table's row for the peer). A member may name
itself as the peer: a send to itself and a receive from itself in one round are a local copy or reduction.
Both ends of every message must describe it: the verifier proves they agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .chunks import ChunkTable
from .ops import OpKind


@dataclass(frozen=True)
class Slot:
    kind: OpKind
    peer: object  # int or integer array: member index of the peer, -1 = idle
    chunk: object  # int or integer array: first chunk
    nchunks: object = 1  # int or integer array: number of consecutive chunks
    remote: object = None  # int or integer array: the peer's first chunk; None = the same as `chunk`


def send(peer, chunk, nchunks=1, remote=None) -> Slot:
    """Send chunks [chunk, chunk + nchunks) to member `peer` (landing at its chunk `remote`, default `chunk`)."""
    return Slot(OpKind.SEND, peer, chunk, nchunks, remote)


def recv(peer, chunk, nchunks=1, remote=None) -> Slot:
    """Receive into chunks [chunk, chunk + nchunks) from member `peer` (read at its chunk `remote`)."""
    return Slot(OpKind.RECV, peer, chunk, nchunks, remote)


def recv_reduce(peer, chunk, nchunks=1, remote=None) -> Slot:
    """Receive from member `peer` (read at its chunk `remote`) and reduce into chunks [chunk, chunk + nchunks)."""
    return Slot(OpKind.RECV_REDUCE, peer, chunk, nchunks, remote)


SlotFunction = Callable[[object, object], Sequence[Slot]]


@dataclass(frozen=True)
class Round:
    """One round pattern, repeated `repeats` times (iteration `it` runs in phase round `it`).

    `uniform` promises that every iteration moves equally sized chunks over the same pattern of peers up to
    relabelling, so a simulator may cost iteration 0 and multiply (ring steps are uniform; the fill and drain
    of a pipelined tree are not).
    """

    slots: SlotFunction
    repeats: int = 1
    uniform: bool = False
    name: str = ""
    # Optional: window(m) -> (first, stop) iterations in which member m (an int) can be active. Lets
    # program(node) skip the iterations of a long pattern where the node idles (a chain member works in
    # O(chunks) of its O(p) rounds), so a program costs time linear in the node's own operations.
    window: Callable[[int], tuple[int, int]] | None = None
    # Optional: a digest of the pattern when the slots look it up in data (explicit phases). Caches that key a
    # schedule by its description (algorithm, shapes, round names) add it, so two imported programs of one
    # name and shape are never taken for one another.
    content: str = ""


@dataclass
class Phase:
    """A set of groups running the same rounds over their own chunk table.

    `groups` is a (G, M) array of node ids (-1 pads a missing member); a node belongs to at most one group of
    a phase. `chunks` gives each group its element range and chunk count.
    """

    name: str
    groups: np.ndarray
    chunks: ChunkTable
    rounds: list[Round]
    _where: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.groups = np.atleast_2d(np.asarray(self.groups, dtype=np.int64))
        for r in self.rounds:
            if r.repeats < 0:
                raise ValueError(f"phase {self.name!r}: a round cannot repeat {r.repeats} times")

    @property
    def num_rounds(self) -> int:
        return sum(r.repeats for r in self.rounds)

    @property
    def group_size(self) -> int:
        return int(self.groups.shape[1])

    def locate(self, node: int) -> tuple[int, int] | None:
        """(group, member) of `node` in this phase, or None if it takes no part."""
        if not self._where:
            flat = self.groups.ravel()
            valid = flat >= 0
            idx = np.flatnonzero(valid)
            order = np.argsort(flat[valid], kind="stable")
            sorted_nodes = flat[valid][order]
            # duplicates are neighbours once sorted (np.unique costs ~10x more here at 331,776 nodes)
            if np.any(sorted_nodes[1:] == sorted_nodes[:-1]):
                raise ValueError(f"phase {self.name!r}: a node appears in more than one group slot")
            self._where["nodes"] = flat[valid]
            self._where["index"] = idx
            self._where["sorted_nodes"] = sorted_nodes
            self._where["sorted_index"] = idx[order]
        sn = self._where["sorted_nodes"]
        pos = int(np.searchsorted(sn, node))
        if pos >= sn.size or sn[pos] != node:
            return None
        g, m = divmod(int(self._where["sorted_index"][pos]), self.group_size)
        return g, m


def _broadcast(value, shape: tuple[int, ...]) -> np.ndarray:
    """`value` (an int or an integer array) as an int64 array of `shape`, read-only. Program expansion calls this
    a million times per test run with small arrays, so the common cases skip np.broadcast_to's generic path:
    a Python int becomes a filled array, an int64 array of the right shape is returned as a read-only view."""
    if type(value) is int or isinstance(value, np.integer):
        out = np.full(shape, value, np.int64)
    else:
        a = np.asarray(value, dtype=np.int64)
        if a.shape == shape:
            out = a.view()
        elif a.ndim == 0:
            out = np.full(shape, a, np.int64)
        else:
            return np.broadcast_to(a, shape)
    out.flags.writeable = False
    return out


def evaluate_peer(slot: Slot, shape: tuple[int, ...]) -> np.ndarray:
    """A slot's peer broadcast to `shape` (int64, read-only): whether the lane is busy at all, before the rest."""
    return _broadcast(slot.peer, shape)


def evaluate_slot(slot: Slot, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Broadcast a slot's peer, chunk and nchunks to `shape` as int64 arrays (read-only)."""
    return _broadcast(slot.peer, shape), _broadcast(slot.chunk, shape), _broadcast(slot.nchunks, shape)


def evaluate_remote(slot: Slot, shape: tuple[int, ...]) -> np.ndarray | None:
    """A slot's remote chunk broadcast to `shape` (int64, read-only), or None when it is the slot's own chunk."""
    if slot.remote is None:
        return None
    return _broadcast(slot.remote, shape)
