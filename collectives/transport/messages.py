"""Run a schedule's programs over MPI: the distributed twin of collectives/emulator.py.

Setup apart from running: `ProcPlan` (built once per schedule and placement, cached) turns the programs of the
nodes one process hosts into rounds of message descriptors, with scratch offsets, tag slots and landing groups
precomputed; `Execution` only posts requests and lands receives.

Round semantics (collectives/schedule/ops.py) on a real network:
* every send of a round reads the round-start state, so sends are posted straight from the work buffer and no
  receive may land in a range that a still-unfinished send of the same node reads;
* receives arrive in scratch and land through `collectives.execution.land_receives`, the one function the
  emulator uses too, in *landing groups*: the same fused runs land_receives forms (a store or a reduce-receive
  followed by reduce-receives into the same range). A group lands as soon as its messages have arrived, every
  earlier group of the round overlapping its range has landed and every send overlapping it has completed;
  groups over disjoint ranges commute, so the result is bitwise the emulator's while later chunks are still
  in flight (the reduction of one chunk overlaps the transfer of the next).
* zero-length messages are skipped at both ends (both know the range is empty), and a zero-length range lands
  nothing.

Tags: tag = (seq mod S) * L*L + sender slot * L + receiver slot, where seq is the call's sequence number on the
communicator and L the placement's slots (see placement.py). Messages of one node pair are posted in program
order at both ends, and MPI matches same-tag messages between two processes in posting order, so rounds need
no tag bits; seq keeps consecutive collectives apart even when a process runs ahead of its peers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..execution import land_receives
from ..schedule import Op, OpKind, Schedule
from .placement import Placement


@dataclass
class _Group:
    """One landing group: receives [first, last] of the round (indices into NodeRound.recvs)."""

    recvs: list[int]
    start: int
    stop: int
    sends: list[int]  # sends of the same node whose range overlaps: wait for them before landing
    after: list[int]  # earlier groups of the round whose range overlaps: land them first


@dataclass
class _NodeRound:
    node: int
    work_key: int  # index of the node among the process's hosted nodes
    sends: list[tuple[int, int, int, int, int, int]]  # (peer proc, tag pair, start, stop, op index, peer node)
    recvs: list[tuple[Op, int, int, int, int]]  # (op, peer proc, tag pair, scratch offset, op index)
    groups: list[_Group]


@dataclass
class ProcPlan:
    """The rounds one process executes for one schedule (all its hosted nodes, merged by global round)."""

    schedule: Schedule
    placement: Placement
    proc: int
    nodes: list[int]
    steps: list[tuple[int, list[_NodeRound]]]
    scratch_elements: int
    sent_elements: dict[int, int]  # per hosted node
    received_elements: dict[int, int]
    _scratch: dict = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, schedule: Schedule, placement: Placement, proc: int) -> ProcPlan:
        nodes = placement.hosted(proc)
        L = placement.slots
        by_round: dict[int, list[_NodeRound]] = {}
        sent = {n: 0 for n in nodes}
        received = {n: 0 for n in nodes}
        for key, node in enumerate(nodes):
            my_slot = placement.slot(node)
            for rnd, ops in schedule.program(node).rounds():
                sends, recvs = [], []
                for index, o in ops:
                    if o.stop <= o.start:
                        continue  # zero-length: both ends skip it
                    peer_proc, peer_slot = placement.proc(o.peer), placement.slot(o.peer)
                    if o.kind == OpKind.SEND:
                        sends.append((peer_proc, my_slot * L + peer_slot, o.start, o.stop, index, o.peer))
                        sent[node] += o.length
                    else:
                        recvs.append((o, peer_proc, peer_slot * L + my_slot, 0, index))
                        received[node] += o.length
                if sends or recvs:
                    by_round.setdefault(rnd, []).append(_NodeRound(node, key, sends, recvs, _groups(sends, recvs)))
        scratch = 0
        for entries in by_round.values():
            offset = 0
            for nr in entries:
                for i, (o, peer, pair, _, index) in enumerate(nr.recvs):
                    nr.recvs[i] = (o, peer, pair, offset, index)
                    offset += o.length
            scratch = max(scratch, offset)
        steps = sorted(by_round.items())
        return cls(schedule, placement, proc, nodes, steps, scratch, sent, received)

    def scratch(self, dtype: np.dtype) -> np.ndarray:
        """Receive scratch for one round (reused: a communicator runs one collective at a time)."""
        buf = self._scratch.get(dtype)
        if buf is None:
            buf = self._scratch[dtype] = np.empty(self.scratch_elements, dtype=dtype)
        return buf


def _groups(sends: list, recvs: list) -> list[_Group]:
    """Split a round's receives into land_receives' fused runs and record what each must wait for."""
    groups: list[_Group] = []
    i = 0
    while i < len(recvs):
        first = recvs[i][0]
        j = i + 1
        while j < len(recvs) and recvs[j][0].kind == OpKind.RECV_REDUCE and recvs[j][0].start == first.start \
                and recvs[j][0].stop == first.stop:
            j += 1
        a, b = first.start, first.stop
        overlapping_sends = [k for k, s in enumerate(sends) if s[2] < b and a < s[3]]
        after = [g for g, grp in enumerate(groups) if grp.start < b and a < grp.stop]
        groups.append(_Group(list(range(i, j)), a, b, overlapping_sends, after))
        i = j
    return groups


def tag_base(seq: int, slots: int, tag_ub: int) -> int:
    """First tag of call `seq` whose placement has `slots` slots (see the module docstring)."""
    return (seq % ((tag_ub + 1) // (slots * slots))) * slots * slots


class Execution:
    """One collective in flight on one process: `advance()` does what it can without blocking.

    `works[k]` is the work buffer of plan.nodes[k] (rank nodes: the caller's; switch nodes: zeros).
    """

    def __init__(self, plan: ProcPlan, runtime, works: list[np.ndarray], kernel_op: str, seq: int,
                 tag_base: int) -> None:
        self.plan = plan
        self.runtime = runtime
        self.works = works
        self.bytes = [w.view(np.uint8) for w in works]
        self.itemsize = works[0].dtype.itemsize if works else 1
        self.kernel_op = kernel_op
        self.seq = seq
        self.tag_base = tag_base
        self.step = 0
        self.posted = False
        self.last_completed = -1
        self.scratch = plan.scratch(works[0].dtype) if works and plan.scratch_elements else None
        self._reqs: list = []
        self.events = 0  # completed requests so far: lets a waiter tell progress from idling

    @property
    def done(self) -> bool:
        return self.step >= len(self.plan.steps)

    def _post(self) -> None:
        """Post every receive, then every send, of the current round (receives first: fewer unexpected messages)."""
        _, entries = self.plan.steps[self.step]
        isz, tag0 = self.itemsize, self.tag_base
        recv_reqs, send_reqs = [], []
        payloads = []
        for nr in entries:
            got = []
            for o, peer, pair, off, _ in nr.recvs:
                view = self.scratch[off:off + o.length]
                got.append(view)
                recv_reqs.append(self.runtime.irecv(view.view(np.uint8), peer, tag0 + pair))
            payloads.append(got)
        for nr in entries:
            src = self.bytes[nr.work_key]
            for peer, pair, a, b, _, _ in nr.sends:
                send_reqs.append(self.runtime.isend(src[a * isz:b * isz], peer, tag0 + pair))
        self._payloads = payloads
        self._reqs = recv_reqs + send_reqs
        self._nrecv = len(recv_reqs)
        # per entry: completion flags of its recvs and sends, and landed flags of its groups
        self._recv_done = [[False] * len(nr.recvs) for nr in entries]
        self._send_done = [[False] * len(nr.sends) for nr in entries]
        self._landed = [[False] * len(nr.groups) for nr in entries]
        self._index = []  # request index -> (entry, is_send, k)
        for e, nr in enumerate(entries):
            self._index += [(e, False, k) for k in range(len(nr.recvs))]
        for e, nr in enumerate(entries):
            self._index += [(e, True, k) for k in range(len(nr.sends))]
        self._left = sum(len(nr.groups) for nr in entries) + sum(len(nr.sends) for nr in entries)
        self.posted = True

    def _land_ready(self) -> None:
        _, entries = self.plan.steps[self.step]
        for e, nr in enumerate(entries):
            landed, rdone, sdone = self._landed[e], self._recv_done[e], self._send_done[e]
            for g, grp in enumerate(nr.groups):
                if landed[g]:
                    continue
                if all(rdone[k] for k in grp.recvs) and all(sdone[k] for k in grp.sends) \
                        and all(landed[h] for h in grp.after):
                    land_receives(self.works[nr.work_key],
                                  [(nr.recvs[k][0], self._payloads[e][k]) for k in grp.recvs], self.kernel_op,
                                  nr.node)
                    landed[g] = True
                    self._left -= 1

    def advance(self) -> bool:
        """Make progress without blocking; True once the whole program has run."""
        while not self.done:
            if not self.posted:
                self._post()
            if self._reqs:
                finished = self.runtime.testsome(self._reqs)
                if finished:
                    self.events += len(finished)
                    for i in finished:
                        e, is_send, k = self._index[i]
                        if is_send:
                            self._send_done[e][k] = True
                            self._left -= 1
                        else:
                            self._recv_done[e][k] = True
                    self._land_ready()
            if self._left:
                return False
            self._finish_round()
        return True

    def _finish_round(self) -> None:
        _, entries = self.plan.steps[self.step]
        self.last_completed = max([self.last_completed] + [s[4] for nr in entries for s in nr.sends]
                                  + [r[4] for nr in entries for r in nr.recvs])
        self.step += 1
        self.posted = False
        self._reqs = []

    def stuck(self) -> tuple[int | None, int | None, tuple[int, ...]]:
        """(round, first unfinished op index, awaited peers) for a timeout message."""
        if self.done or not self.posted:
            return None, None, ()
        rnd, entries = self.plan.steps[self.step]
        peers, first = set(), None
        for e, nr in enumerate(entries):
            for k, (o, _, _, _, index) in enumerate(nr.recvs):
                if not self._recv_done[e][k]:
                    peers.add(o.peer)
                    first = index if first is None else min(first, index)
            for k, (_, _, _, _, index, node) in enumerate(nr.sends):
                if not self._send_done[e][k]:
                    peers.add(node)
                    first = index if first is None else min(first, index)
        return rnd, first, tuple(sorted(peers))

    def cancel(self) -> None:
        for r in self._reqs:
            if r is not None and r:  # None or an inactive MPI request: nothing to cancel
                try:
                    r.Cancel()
                except Exception:  # noqa: BLE001 - a request of a failed peer: nothing more to do
                    pass


__all__ = ["Execution", "ProcPlan", "tag_base"]
