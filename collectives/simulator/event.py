"""The event simulator: discrete-event execution of every node's explicit program (`expand`).

Messages are the matched send/receive pairs of the programs (the k-th send from a to b in round r meets the
k-th receive at b from a in round r). Each node walks its rounds in order; entering a round posts its messages,
and a message becomes an event once both its ends have entered its round (rounds of different nodes are
otherwise independent: data dependencies only, no global barrier). Events are processed in start-time order;
messages that start at the same time go in the order their senders post them (a sender's first message of a
round before any sender's second), so a node that sends many messages at once (an all-to-all round) does not
take every receiver's link ahead of the other senders' first messages: the links serve the round's messages in
turn, as the analytic model's fair share does.

Each directed link is a FIFO resource: a message streams cut-through along its path; at each hop it waits until
the link is free, holds it for bytes / effective bandwidth (model.py), and moves on after the hop's latency.
Its arrival = start + queueing + sum of hop latencies + bytes / slowest effective bandwidth. A node's round ends
when its sends have left and its receives have landed, plus the reduction of what it received (model.py), and
the node then enters its next round: that is how chunks pipeline. Reservations never overlap, so no link ever
carries more than its bandwidth (checked: busy time <= elapsed time).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numba
import numpy as np

from ..errors import ScheduleError
from ..schedule.expand import expand
from ..schedule.ops import OpKind
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


@numba.njit(cache=True)
def _enter(v, ready, cur, slot_ptr, slot_msg, msrc, mdst, mpos, ends, send_end, recv_end, heap):
    k = cur[v]
    send_end[k] = ready[v]
    recv_end[k] = ready[v]
    for j in range(slot_ptr[k], slot_ptr[k + 1]):
        f = slot_msg[j]
        ends[f] += 1
        if ends[f] == 2:
            heapq.heappush(heap, (max(ready[msrc[f]], ready[mdst[f]]), mpos[f], f))


@numba.njit(cache=True)
def _run(num_nodes, msrc, mdst, mpos, links, hser, hlat, slot_ptr, slot_msg, slot_red, node_first, node_last,
         num_links, overlap):
    nslots = slot_ptr.size - 1
    ready = np.zeros(num_nodes)
    cur = node_first.copy()
    ends = np.zeros(msrc.size, np.int64)
    pending = slot_ptr[1:] - slot_ptr[:-1]
    send_end = np.zeros(nslots)
    recv_end = np.zeros(nslots)
    recv_first = np.full(nslots, np.inf)
    done = np.full(nslots, -1.0)
    free = np.zeros(num_links)
    busy = np.zeros(num_links)
    queued = np.zeros(msrc.size)
    heap = [(0.0, np.int64(0), np.int64(0))]
    heap.pop()
    for v in range(num_nodes):
        if cur[v] < node_last[v]:
            _enter(v, ready, cur, slot_ptr, slot_msg, msrc, mdst, mpos, ends, send_end, recv_end, heap)
    H = links.shape[1]
    while len(heap) > 0:
        s, _, f = heapq.heappop(heap)
        delay = 0.0
        prefix = 0.0
        slowest = 0.0
        for h in range(H):
            link = links[f, h]
            if link < 0:
                break
            head = s + prefix + delay
            begin = max(head, free[link])
            delay += begin - head
            free[link] = begin + hser[f, h]
            busy[link] += hser[f, h]
            prefix += hlat[f, h]
            slowest = max(slowest, hser[f, h])
        queued[f] = delay
        sent = s + delay + slowest
        for side in range(2):
            v = msrc[f] if side == 0 else mdst[f]
            k = cur[v]
            if side == 0:
                send_end[k] = max(send_end[k], sent)
            else:
                recv_end[k] = max(recv_end[k], sent + prefix)
                # streamed reduction (overlap): it runs from the round's first arriving byte at the kernel's rate
                recv_first[k] = min(recv_first[k], s + delay + prefix)
            pending[k] -= 1
            if pending[k] == 0:
                if overlap:  # model.CostRules.overlap_reduce
                    end = max(send_end[k], recv_end[k], recv_first[k] + slot_red[k] if slot_red[k] > 0 else 0.0)
                else:
                    end = max(send_end[k], recv_end[k] + slot_red[k])
                done[k] = end
                ready[v] = end
                cur[v] += 1
                if cur[v] < node_last[v]:
                    _enter(v, ready, cur, slot_ptr, slot_msg, msrc, mdst, mpos, ends, send_end, recv_end, heap)
    return done, busy, queued


@dataclass
class EventRun:
    time: float
    phase_end: np.ndarray  # per phase: latest round end of any node in it
    busy: np.ndarray  # per link: seconds held
    tier_bytes: np.ndarray
    reduce_time: np.ndarray  # per node: seconds spent reducing
    num_messages: int
    critical: list  # per round: (resource key, seconds) of its slowest message (as analytic.evaluate keys)


def run(schedule, rules: CostRules) -> EventRun:
    """Execute `schedule` event by event on `rules.topology`."""
    msg = match_messages(schedule, rules.itemsize)
    topo = rules.topology
    M = msg.src.size
    links = topo.path_links(msg.src, msg.dst) if M else np.zeros((0, 1), np.int64)
    bw, _ = rules.hop_bandwidth(msg.src[:, None], msg.dst[:, None], links)
    hser = np.where(links >= 0, msg.nbytes[:, None] / bw, 0.0)
    hlat = rules.path_latency(links)
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
    done, busy, queued = _run(num_nodes, msg.src, msg.dst, msg.position, links, hser, hlat, slot_ptr,
                              mid.astype(np.int64), slot_red, node_first, node_last, topo.num_links,
                              rules.overlap_reduce)
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
    return EventRun(total, phase_end, busy, rules.tier_counts(links, msg.nbytes), reduce_time, M, critical)


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
