"""The event simulator: discrete-event execution of every node's explicit program (`expand`).

Messages are the matched send/receive pairs of the programs (the k-th send from a to b in round r meets the
k-th receive at b from a in round r). Each node walks its rounds in order; entering a round posts its messages,
and a message starts once its sender has entered its round and its receiver the round that frees its credit
(`CostRules.credit`: the message's own round without a runtime, rendezvous; up to NCCL_STEPS rounds earlier
under NCCL's runtime), so its bytes may land before the receiver reaches their round (rounds of different nodes
are otherwise independent: data dependencies only, no global barrier). Messages that start at the same time
start in the order their senders post them.

Links serve rounds in order and share within one (processor sharing): a message streams cut-through over its
whole path at the least, over its links, of the link's effective bandwidth (model.py) divided by the messages
of the earliest round streaming over that link at that moment, or not at all while a message of an earlier
round holds one of its links; every start or end of a message re-divides the links it uses. Its last byte leaves the
sender when its bytes are streamed and lands after the path's latency. A node's round ends when its sends have
left and its receives have landed, plus (or overlapped with: model.py) the reduction of what it received, and
the node then enters its next round: that is how pieces pipeline. The analytic model shares a link among the
round's messages the same way, which is why the two agree (sharing.py: over time where they start apart);
here the order also follows every message of different rounds that meet on a link (an early sender's message
waits for the link; the analytic model keeps only each link's latest earlier round), and no link ever carries
more than its bandwidth (checked: busy time <= elapsed time).
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


def match_messages(schedule, itemsize: int) -> Messages:
    """Pair every send with its receive; raise ScheduleError naming the first unmatched operation."""
    ops = expand(schedule)
    send = ops.kind == int(OpKind.SEND)
    s_idx, r_idx = np.flatnonzero(send), np.flatnonzero(~send)
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


def run(schedule, rules: CostRules, timeline: bool = False) -> EventRun:
    """Execute `schedule` event by event on `rules.topology` (`timeline`: keep every message's and every
    round's times, for a trace)."""
    msg = match_messages(schedule, rules.itemsize)
    topo = rules.topology
    M = msg.src.size
    if M >= event_loop.MAX_MESSAGES or (M and int(msg.position.max()) >= event_loop.MAX_POSITION):
        raise ValueError(f"the event simulator runs fewer than {event_loop.MAX_MESSAGES} messages, each posted "
                         f"among fewer than {event_loop.MAX_POSITION} of its round; this schedule has {M} "
                         "messages: use mode='analytic'")
    links = topo.path_links(msg.src, msg.dst) if M else np.zeros((0, 1), np.int64)
    bw, _ = rules.hop_bandwidth(msg.src[:, None], msg.dst[:, None], links)
    hser = np.where(links >= 0, msg.nbytes[:, None] / bw, 0.0)
    hlat = rules.path_latency(links)
    hbw = np.where(links >= 0, bw, np.inf)
    # (node, round) slots: each message appears in its sender's and its receiver's slot
    node = np.concatenate((msg.src, msg.dst))
    rnd = np.concatenate((msg.round, msg.round))
    mid = np.concatenate((np.arange(M), np.arange(M)))
    red_bytes = np.concatenate((np.zeros(M), np.where(msg.reduce, msg.nbytes, 0.0)))
    order = np.lexsort((rnd, node))
    node, rnd, mid, red_bytes = node[order], rnd[order], mid[order], red_bytes[order]
    new = np.r_[True, (node[1:] != node[:-1]) | (rnd[1:] != rnd[:-1])] if node.size else np.zeros(0, bool)
    starts = np.flatnonzero(new)
    slot_ptr = np.r_[starts, node.size].astype(np.int64)
    slot_node, slot_round = node[starts], rnd[starts]
    slot_red = (np.add.reduceat(red_bytes, starts) if starts.size else np.zeros(0)) / rules.reduce_rate(slot_node)
    num_nodes = max(schedule.num_nodes, topo.num_nodes)
    node_first = np.searchsorted(slot_node, np.arange(num_nodes), side="left").astype(np.int64)
    node_last = np.searchsorted(slot_node, np.arange(num_nodes), side="right").astype(np.int64)
    # each message's slot at its sender and at its receiver
    width = int(msg.round.max()) + 1 if M else 1
    slot_key = slot_node * width + slot_round
    ks = np.searchsorted(slot_key, msg.src * width + msg.round).astype(np.int64)
    kd = np.searchsorted(slot_key, msg.dst * width + msg.round).astype(np.int64)
    # the receiver's slot whose entry frees the message's credit: its first round after round - credit_slots
    kw = np.searchsorted(slot_key, msg.dst * width + np.maximum(msg.round - rules.credit(msg.nbytes) + 1, 0))
    credit_msg = np.argsort(kw, kind="stable").astype(np.int64)
    credit_ptr = np.searchsorted(kw[credit_msg], np.arange(slot_ptr.size)).astype(np.int64)
    mkey = (msg.position << event_loop.POSITION_SHIFT) | np.arange(M, dtype=np.int64)
    done, busy, queued, started, finished, entered = event_loop.run(
        num_nodes, msg.src, msg.dst, mkey, msg.round.astype(np.int64), ks, kd, links, hbw, hlat.sum(axis=1),
        msg.nbytes, slot_ptr, mid.astype(np.int64), slot_red, node_first, node_last, topo.num_links,
        rules.overlap_reduce, credit_ptr, credit_msg)
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
    reduce_time = np.bincount(slot_node, weights=slot_red, minlength=num_nodes) if starts.size else np.zeros(num_nodes)
    critical = _critical(msg, links, hser, hlat, queued, bw, rules, slot_node, slot_round, slot_red)
    line = None
    if timeline:
        line = dict(src=msg.src, dst=msg.dst, round=msg.round, nbytes=msg.nbytes, start=started, sent=finished,
                    arrival=finished + hlat.sum(axis=1), first_link=links[:, 0] if M else np.zeros(0, np.int64),
                    last_link=links[np.arange(M), np.maximum((links >= 0).sum(axis=1) - 1, 0)] if M else
                    np.zeros(0, np.int64), slot_node=slot_node, slot_round=slot_round, slot_start=entered,
                    slot_end=done, phase_bounds=bounds)
    return EventRun(total, phase_end, busy, rules.tier_counts(links, msg.nbytes), reduce_time, M, critical, line)


def _critical(msg, links, hser, hlat, queued, bw, rules, slot_node, slot_round, slot_red) -> list:
    """Per round, what its slowest message waited for (the analytic simulator's attribution, per message)."""
    M = msg.src.size
    if M == 0:
        return []
    hop = np.argmax(hser, axis=1)
    rows = np.arange(M)
    ser, lat = hser[rows, hop], hlat.sum(axis=1)
    link = links[rows, hop]
    _, factor = rules.hop_bandwidth(msg.src[:, None], msg.dst[:, None], links)
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


__all__ = ["EventRun", "Messages", "estimate_messages", "match_messages", "run"]
