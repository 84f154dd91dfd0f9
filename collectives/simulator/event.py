"""The event simulator: discrete-event execution of every node's explicit program (`expand`).

Messages are the matched send/receive pairs of the programs (the k-th send from a to b in round r meets the
k-th receive at b from a in round r). Each node walks its rounds in order; entering a round posts its messages,
and a message starts once both its ends have entered its round (rounds of different nodes are otherwise
independent: data dependencies only, no global barrier). Messages that start at the same time start in the
order their senders post them.

Links are shared fairly (processor sharing): a message streams cut-through over its whole path at the least,
over its links, of the link's effective bandwidth (model.py) divided by the messages streaming over that link
at that moment, and every start or end of a message re-divides the links it uses. Its last byte leaves the
sender when its bytes are streamed and lands after the path's latency. A node's round ends when its sends have
left and its receives have landed, plus (or overlapped with: model.py) the reduction of what it received, and
the node then enters its next round: that is how pieces pipeline. The analytic model shares a link among the
round's messages the same way, which is why the two agree; here the sharing also follows messages of
different rounds that meet on a link, and no link ever carries more than its bandwidth (checked: busy time
<= elapsed time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ScheduleError
from ..schedule.expand import expand
from ..schedule.ops import OpKind
from . import event_loop
from .model import CostRules


@dataclass
class Messages:
    src: np.ndarray
    dst: np.ndarray
    round: np.ndarray
    nbytes: np.ndarray
    reduce: np.ndarray  # the receiver reduces (RECV_REDUCE)
    position: np.ndarray  # the send's place among its sender's operations of the round (0 = posted first)


def sort_by_pair(major: np.ndarray, minor: np.ndarray, size: int) -> np.ndarray:
    """np.lexsort((minor, major)): a stable sort of the one key major * size + minor (several times faster than
    lexsort on millions of rows) where 0 <= minor < size, major >= 0 and the key fits, else lexsort."""
    if major.size == 0:
        return np.zeros(0, np.int64)
    if (min(int(major.min()), int(minor.min())) >= 0 and int(minor.max()) < size
            and (int(major.max()) + 1) * size < 1 << 62):
        return np.argsort(major * size + minor, kind="stable")
    return np.lexsort((minor, major))


def match_messages(schedule, itemsize: int) -> Messages:
    """Pair every send with its receive; raise ScheduleError naming the first unmatched operation."""
    ops = expand(schedule)
    send = ops.kind == int(OpKind.SEND)
    s_idx, r_idx = np.flatnonzero(send), np.flatnonzero(~send)
    # sends by (sender, receiver, round, program order), receives by (sender, receiver, round, program order)
    if len(ops) and np.all((ops.node[1:] != ops.node[:-1]) | (ops.round[1:] >= ops.round[:-1])):
        # the table's rows run in program order, rounds never decreasing within a node (Schedule.program):
        # a stable sort by the pair keeps (round, program order) within it
        n = int(max(ops.node.max(), ops.peer.max())) + 1
        s_idx = s_idx[sort_by_pair(ops.node[s_idx], ops.peer[s_idx], n)]
        r_idx = r_idx[sort_by_pair(ops.peer[r_idx], ops.node[r_idx], n)]
    else:
        s_idx = s_idx[np.lexsort((ops.index[s_idx], ops.round[s_idx], ops.peer[s_idx], ops.node[s_idx]))]
        r_idx = r_idx[np.lexsort((ops.index[r_idx], ops.round[r_idx], ops.node[r_idx], ops.peer[r_idx]))]
    if s_idx.size != r_idx.size or not (
            np.array_equal(ops.node[s_idx], ops.peer[r_idx]) and np.array_equal(ops.peer[s_idx], ops.node[r_idx])
            and np.array_equal(ops.round[s_idx], ops.round[r_idx])):
        n = min(s_idx.size, r_idx.size)
        bad = np.flatnonzero((ops.node[s_idx[:n]] != ops.peer[r_idx[:n]]) | (ops.peer[s_idx[:n]] != ops.node[r_idx[:n]])
                             | (ops.round[s_idx[:n]] != ops.round[r_idx[:n]]))
        i = int(bad[0]) if bad.size else n
        row = s_idx[i] if i < s_idx.size else r_idx[i]
        raise ScheduleError(f"unmatched message: node {int(ops.node[row])} round {int(ops.round[row])} peer "
                            f"{int(ops.peer[row])} ({s_idx.size} sends, {r_idx.size} receives)",
                            node=int(ops.node[row]), round=int(ops.round[row]))
    length = ops.stop - ops.start
    if not np.array_equal(length[s_idx], length[r_idx]):
        i = int(np.flatnonzero(length[s_idx] != length[r_idx])[0])
        raise ScheduleError(f"message sizes disagree: node {int(ops.node[s_idx[i]])} sends {int(length[s_idx[i]])} "
                            f"elements to node {int(ops.peer[s_idx[i]])}, which expects {int(length[r_idx[i]])}",
                            node=int(ops.node[s_idx[i]]), round=int(ops.round[s_idx[i]]))
    # position of each op in its node's round: its program index less that of the round's first op
    first = np.r_[True, (ops.node[1:] != ops.node[:-1]) | (ops.round[1:] != ops.round[:-1])] if len(ops) else \
        np.zeros(0, bool)
    start_of = np.maximum.accumulate(np.where(first, np.arange(len(ops)), 0)) if len(ops) else np.zeros(0, np.int64)
    position = (np.arange(len(ops)) - start_of)[s_idx]
    return Messages(ops.node[s_idx], ops.peer[s_idx], ops.round[s_idx], length[s_idx].astype(np.float64) * itemsize,
                    ops.kind[r_idx] == int(OpKind.RECV_REDUCE), position.astype(np.int64))


@dataclass
class EventRun:
    time: float
    phase_end: np.ndarray  # per phase: latest round end of any node in it
    busy: np.ndarray  # per link: seconds held
    tier_bytes: np.ndarray
    reduce_time: np.ndarray  # per node: seconds spent reducing
    num_messages: int
    critical: list  # per round: (resource key, seconds) of its slowest message (as analytic.evaluate keys)
    timeline: dict | None = None  # with run(..., timeline=True): every message's and round's times (trace.py)


@dataclass
class Prepared:
    """What an event run needs of a schedule on a topology whatever NCCL's protocol (which changes only the hops'
    bandwidths): the matched messages, their paths, the (node, round) slots, and the messages renumbered in
    round order for the loop (see `_execute`). The engine prepares a schedule once for the protocols it tries."""

    msg: Messages
    links: np.ndarray  # (M, H) link ids of each message's path, -1 padded
    hlat: np.ndarray  # (M, H) each hop's latency
    slot_ptr: np.ndarray  # slot k holds the messages slot_msg[slot_ptr[k]:slot_ptr[k + 1]]
    slot_msg: np.ndarray
    slot_node: np.ndarray
    slot_round: np.ndarray
    slot_red_bytes: np.ndarray  # bytes each slot's node reduces
    num_nodes: int
    tier_bytes: np.ndarray
    order: np.ndarray  # the loop's message f is message order[f]
    renumber: np.ndarray  # message i is the loop's message renumber[i]
    key: np.ndarray  # the loop's start order at equal times: position << POSITION_SHIFT | message id
    slot_order: np.ndarray  # the loop's slot s is slot slot_order[s] (round-major)
    slot_renumber: np.ndarray  # slot k is the loop's slot slot_renumber[k]
    loop_ptr: np.ndarray  # the loop's slots: loop messages loop_msg[loop_ptr[s]:loop_ptr[s + 1]]
    loop_msg: np.ndarray
    first_slot: np.ndarray  # per node: its first loop slot (-1: none)
    next_slot: np.ndarray  # per loop slot: the same node's next loop slot (-1: none)


def prepare(schedule, rules: CostRules) -> Prepared:
    """The protocol-independent part of `run` (it depends on the schedule, the topology and the item size)."""
    msg = match_messages(schedule, rules.itemsize)
    topo = rules.topology
    M = msg.src.size
    if M >= event_loop.MAX_MESSAGES or (M and int(msg.position.max()) >= event_loop.MAX_POSITION):
        raise ValueError(f"the event simulator runs fewer than {event_loop.MAX_MESSAGES} messages, each posted "
                         f"among fewer than {event_loop.MAX_POSITION} of its round; this schedule has {M} "
                         "messages: use mode='analytic'")
    links = topo.path_links(msg.src, msg.dst) if M else np.zeros((0, 1), np.int64)
    # (node, round) slots: each message appears in its sender's and its receiver's slot
    node = np.concatenate((msg.src, msg.dst))
    rnd = np.concatenate((msg.round, msg.round))
    mid = np.concatenate((np.arange(M), np.arange(M)))
    red_bytes = np.concatenate((np.zeros(M), np.where(msg.reduce, msg.nbytes, 0.0)))
    rounds = int(rnd.max()) + 1 if rnd.size else 1
    order = sort_by_pair(node, rnd, rounds)
    node, rnd, mid, red_bytes = node[order], rnd[order], mid[order], red_bytes[order]
    new = np.r_[True, (node[1:] != node[:-1]) | (rnd[1:] != rnd[:-1])] if node.size else np.zeros(0, bool)
    starts = np.flatnonzero(new)
    slot_node = node[starts]
    num_nodes = max(schedule.num_nodes, topo.num_nodes)
    slot_ptr, slot_msg, slot_round = np.r_[starts, node.size].astype(np.int64), mid.astype(np.int64), rnd[starts]
    # the loop's numbering of messages and slots: round order, then node (see _execute)
    loop_order = sort_by_pair(msg.round, msg.src, num_nodes)
    renumber = _inverse(loop_order)
    slot_order = sort_by_pair(slot_round, slot_node, num_nodes)
    slot_renumber = _inverse(slot_order)
    sizes = np.diff(slot_ptr)[slot_order]
    loop_ptr = np.r_[0, np.cumsum(sizes)].astype(np.int64)
    at = np.repeat(slot_ptr[:-1][slot_order] - loop_ptr[:-1], sizes) + np.arange(int(loop_ptr[-1]))
    same_node = np.r_[slot_node[1:] == slot_node[:-1], False] if slot_node.size else np.zeros(0, bool)
    next_slot = np.full(slot_node.size, -1, np.int64)
    next_slot[slot_renumber[same_node]] = slot_renumber[np.flatnonzero(same_node) + 1]
    first_slot = np.full(num_nodes, -1, np.int64)
    firsts = np.flatnonzero(~np.r_[False, same_node[:-1]]) if slot_node.size else np.zeros(0, np.int64)
    first_slot[slot_node[firsts]] = slot_renumber[firsts]
    return Prepared(
        msg, links, rules.path_latency(links), slot_ptr, slot_msg, slot_node, slot_round,
        np.add.reduceat(red_bytes, starts) if starts.size else np.zeros(0), num_nodes,
        rules.tier_counts(links, msg.nbytes), loop_order, renumber,
        (msg.position[loop_order] << event_loop.POSITION_SHIFT) | loop_order, slot_order, slot_renumber, loop_ptr,
        renumber[slot_msg[at]], first_slot, next_slot)


def _inverse(permutation: np.ndarray) -> np.ndarray:
    out = np.empty(permutation.size, np.int64)
    out[permutation] = np.arange(permutation.size)
    return out


def run(schedule, rules: CostRules, timeline: bool = False, prepared: Prepared | None = None) -> EventRun:
    """Execute `schedule` event by event on `rules.topology` (`timeline`: keep every message's and every
    round's times, for a trace). `prepared`: `prepare(schedule, rules)`, if the caller has it already."""
    pre = prepare(schedule, rules) if prepared is None else prepared
    msg, links, hlat = pre.msg, pre.links, pre.hlat
    M = msg.src.size
    bw, factor = rules.hop_bandwidth(msg.src[:, None], msg.dst[:, None], links)
    hser = np.where(links >= 0, msg.nbytes[:, None] / bw, 0.0)
    hbw = np.where(links >= 0, bw, np.inf)
    slot_red = pre.slot_red_bytes / rules.reduce_rate(pre.slot_node)
    done, busy, queued, started, finished, entered = _execute(pre, hbw, slot_red, rules.topology.num_links,
                                                              rules.overlap_reduce)
    slot_node, slot_round = pre.slot_node, pre.slot_round
    if (done < 0).any():
        k = int(np.flatnonzero(done < 0)[0])
        raise ScheduleError(f"deadlock: node {int(slot_node[k])} never completes round {int(slot_round[k])}",
                            node=int(slot_node[k]), round=int(slot_round[k]))
    total = float(done.max()) if done.size else 0.0
    bounds = np.cumsum([ph.num_rounds for ph in schedule.phases])
    phase_of = np.searchsorted(bounds, slot_round, side="right")
    phase_end = np.zeros(len(schedule.phases))
    if done.size:
        np.maximum.at(phase_end, phase_of, done)
    num_nodes = pre.num_nodes
    reduce_time = np.bincount(slot_node, weights=slot_red, minlength=num_nodes) if slot_node.size else \
        np.zeros(num_nodes)
    critical = _critical(msg, links, hser, hlat, queued, bw, factor, rules, slot_node, slot_round, slot_red)
    line = None
    if timeline:
        line = dict(src=msg.src, dst=msg.dst, round=msg.round, nbytes=msg.nbytes, start=started, sent=finished,
                    arrival=finished + hlat.sum(axis=1), first_link=links[:, 0] if M else np.zeros(0, np.int64),
                    last_link=links[np.arange(M), np.maximum((links >= 0).sum(axis=1) - 1, 0)] if M else
                    np.zeros(0, np.int64), slot_node=slot_node, slot_round=slot_round, slot_start=entered,
                    slot_end=done, phase_bounds=bounds)
    return EventRun(total, phase_end, busy, pre.tier_bytes.copy(), reduce_time, M, critical, line)


def _execute(pre: Prepared, hbw: np.ndarray, slot_red: np.ndarray, num_links: int, overlap: bool):
    """event_loop.run over the messages and slots renumbered in round order (then by node), so the loop's
    per-message and per-slot state is read nearly sequentially (in the matching's node-major order a ring's
    consecutive events touch rows thousands apart); the start order at equal times keeps the messages' own
    ids, so the result is the same to the bit. Outputs come back in the messages' and slots' order."""
    msg, order, renumber = pre.msg, pre.order, pre.renumber
    done, busy, queued, started, finished, entered = event_loop.run(
        pre.num_nodes, msg.src[order], msg.dst[order], pre.key, pre.links[order], hbw[order],
        pre.hlat.sum(axis=1)[order], msg.nbytes[order], pre.loop_ptr, pre.loop_msg, slot_red[pre.slot_order],
        pre.first_slot, pre.next_slot, num_links, overlap)
    keep = pre.slot_renumber
    return done[keep], busy, queued[renumber], started[renumber], finished[renumber], entered[keep]


def _critical(msg, links, hser, hlat, queued, bw, factor, rules, slot_node, slot_round, slot_red) -> list:
    """Per round, what its slowest message waited for (the analytic simulator's attribution, per message)."""
    M = msg.src.size
    if M == 0:
        return []
    hop = np.argmax(hser, axis=1)
    rows = np.arange(M)
    ser, lat = hser[rows, hop], hlat.sum(axis=1)
    link = links[rows, hop]
    fac = factor[rows, hop]
    slot = np.searchsorted(slot_node * (int(slot_round.max()) + 1) + slot_round,
                           msg.dst * (int(slot_round.max()) + 1) + msg.round)
    red = slot_red[slot]
    if rules.overlap_reduce:  # streamed: the reduction shows only where it is slower than the transfer
        red = np.where(red > ser + queued, red, 0.0)
        dur = queued + lat + np.maximum(ser, red)
    else:
        dur = queued + ser + lat + red
    order = np.lexsort((-dur, msg.round))
    first = order[np.r_[True, msg.round[order][1:] != msg.round[order][:-1]]]
    out = []
    for f in first.tolist():
        parts = (float(red[f]), float(ser[f] + queued[f]), float(lat[f]))
        if parts[0] >= parts[1] and parts[0] >= parts[2]:
            key = ("reduce", int(msg.dst[f]), 1.0)
        elif parts[1] >= parts[2]:
            key = ("link", int(link[f]), float(fac[f]), int(msg.src[f]), int(msg.dst[f]))
        else:
            key = ("latency",)
        out.append((key, float(dur[f])))
    return out


def estimate_messages(schedule) -> int:
    """An upper bound on the messages `run` would expand, without expanding (for mode="auto")."""
    return sum(ph.num_rounds * int((ph.groups >= 0).sum()) for ph in schedule.phases)


__all__ = ["EventRun", "Messages", "Prepared", "estimate_messages", "match_messages", "prepare", "run"]
