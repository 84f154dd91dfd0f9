"""The event simulator's compiled loop (event.py prepares its inputs and reads its outputs).

Events are (time, key) pairs in a binary heap held in four arrays (time, key, message, version). The key orders
events at equal times: finishes (which free links) before arrivals before starts, and starts in the order their
senders post them (`position`), then by message id. A start or finish re-divides the links it uses among the
flows on them (processor sharing); each re-division pushes the flow's new finish, and a finish whose version
is no longer the flow's is stale and skipped.

Why this shape: the loop runs about ten heap operations per message (a million messages per simulation at
1,024 ranks), so per-call overheads dominate. Numba reference-counts every array passed to a function, with an
atomic increment and decrement per array per call; with a dozen arrays per call that cost was most of the
loop's time. The loop and its helpers therefore allocate nothing and are compiled without Numba's runtime
(`_nrt=False`, which has them borrow their arguments); `run` allocates the state, and grows the heap whenever
the loop stops to say the next event's pushes may not fit.
"""

from __future__ import annotations

import numba
import numpy as np

START, FINISH, ARRIVE = 2, 0, 1  # event kinds; at equal times finishes free links before new messages take them
KIND_SHIFT, POSITION_SHIFT = 61, 31  # key = kind << 61 | position << 31 | message id
MAX_POSITION, MAX_MESSAGES = 1 << (KIND_SHIFT - POSITION_SHIFT), 1 << POSITION_SHIFT

_compiled = numba.njit(cache=True, _nrt=False)  # no reference counting: see the module docstring


@_compiled
def _push(ht, hk, hm, hv, n, t, key, f, version):
    """Add event (t, key) of message f to the heap of n events (room checked by the caller); the new size."""
    pos = n
    while pos > 0:
        parent = (pos - 1) >> 1
        if t < ht[parent] or (t == ht[parent] and key < hk[parent]):
            ht[pos], hk[pos], hm[pos], hv[pos] = ht[parent], hk[parent], hm[parent], hv[parent]
            pos = parent
        else:
            break
    ht[pos], hk[pos], hm[pos], hv[pos] = t, key, f, version
    return n + 1


@_compiled
def _pop(ht, hk, hm, hv, n):
    """Remove the earliest event (the caller read it at index 0); the new size."""
    n -= 1
    t, key, f, version = ht[n], hk[n], hm[n], hv[n]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= n:
            break
        right = child + 1
        if right < n and (ht[right] < ht[child] or (ht[right] == ht[child] and hk[right] < hk[child])):
            child = right
        if ht[child] < t or (ht[child] == t and hk[child] < key):
            ht[pos], hk[pos], hm[pos], hv[pos] = ht[child], hk[child], hm[child], hv[child]
            pos = child
        else:
            break
    ht[pos], hk[pos], hm[pos], hv[pos] = t, key, f, version
    return n


@_compiled
def _enter(v, ready, cur, slot_ptr, slot_msg, msrc, mdst, mkey, ends, send_end, recv_end, entered, ht, hk, hm, hv,
           n):
    """Node v enters its next round: a message starts once both its ends have entered."""
    k = cur[v]
    entered[k] = ready[v]
    send_end[k] = ready[v]
    recv_end[k] = ready[v]
    for j in range(slot_ptr[k], slot_ptr[k + 1]):
        f = slot_msg[j]
        ends[f] += 1
        if ends[f] == 2:
            n = _push(ht, hk, hm, hv, n, max(ready[msrc[f]], ready[mdst[f]]), (START << KIND_SHIFT) | mkey[f], f, 0)
    return n


@_compiled
def _rerate(g, t, links, hbw, nflow, rem, rate, last, ver, mkey, ht, hk, hm, hv, n):
    """Flow g's fair-share rate from now on: the least over its links of bandwidth / flows on the link."""
    rem[g] -= rate[g] * (t - last[g])
    if rem[g] < 0.0:
        rem[g] = 0.0
    last[g] = t
    r = np.inf
    for h in range(links.shape[1]):
        link = links[g, h]
        if link < 0:
            break
        r = min(r, hbw[g, h] / nflow[link])
    rate[g] = r
    ver[g] += 1
    return _push(ht, hk, hm, hv, n, t + rem[g] / r, (FINISH << KIND_SHIFT) | (mkey[g] & (MAX_MESSAGES - 1)), g,
                 ver[g])


@_compiled
def _rerate_sharers(f, t, links, hbw, nflow, head, nxt, rem, rate, last, ver, active, mkey, ht, hk, hm, hv, n):
    """Every active flow that shares a link with f gets its new fair share."""
    H = links.shape[1]
    for h in range(H):
        link = links[f, h]
        if link < 0:
            break
        e = head[link]
        while e >= 0:
            g = e // H
            if active[g] and g != f:
                n = _rerate(g, t, links, hbw, nflow, rem, rate, last, ver, mkey, ht, hk, hm, hv, n)
            e = nxt[e]
    return n


@_compiled
def _complete(v, t, is_send, k, overlap, send_end, recv_end, recv_first, slot_red, pending, done, ready, cur,
              next_slot, slot_ptr, slot_msg, msrc, mdst, mkey, ends, entered, ht, hk, hm, hv, n):
    """One end of a message is done at t: the sender's bytes have left, or the receiver's have landed."""
    if is_send:
        send_end[k] = max(send_end[k], t)
    else:
        recv_end[k] = max(recv_end[k], t)
    pending[k] -= 1
    if pending[k] == 0:
        if overlap:  # model.CostRules.overlap_reduce
            end = max(send_end[k], recv_end[k], recv_first[k] + slot_red[k] if slot_red[k] > 0 else 0.0)
        else:
            end = max(send_end[k], recv_end[k] + slot_red[k])
        done[k] = end
        ready[v] = end
        cur[v] = next_slot[k]
        if cur[v] >= 0:
            n = _enter(v, ready, cur, slot_ptr, slot_msg, msrc, mdst, mkey, ends, send_end, recv_end, entered,
                       ht, hk, hm, hv, n)
    return n


@_compiled
def _events(msrc, mdst, mkey, links, hbw, lat, nbytes, slot_ptr, slot_msg, slot_red, next_slot, overlap, ready, cur,
            ends, pending, send_end, recv_end, recv_first, done, busy, queued, started, finished, entered, rem, rate,
            last, ver, active, nflow, head, nxt, prv, ht, hk, hm, hv, n, nactive, room):
    """Process events until none is left (returns n = 0) or the heap may lack room for the next event's pushes
    (returns n > 0, to be grown): an event re-divides each active flow at most once per link it shares, pushes an
    arrival, and the round a node then enters starts fewer than `room` messages."""
    H = links.shape[1]
    while n > 0:
        if n + (nactive + 1) * H + room > ht.size:
            return n, nactive
        t, key, f, version = ht[0], hk[0], hm[0], hv[0]
        n = _pop(ht, hk, hm, hv, n)
        kind = key >> KIND_SHIFT
        if kind == START:
            started[f] = t
            kd = cur[mdst[f]]
            recv_first[kd] = min(recv_first[kd], t + lat[f])
            if links[f, 0] < 0 or nbytes[f] <= 0.0:  # nothing to stream: the message is sent at once
                finished[f] = t
                n = _complete(msrc[f], t, True, cur[msrc[f]], overlap, send_end, recv_end, recv_first, slot_red,
                              pending, done, ready, cur, next_slot, slot_ptr, slot_msg, msrc, mdst, mkey, ends,
                              entered, ht, hk, hm, hv, n)
                n = _push(ht, hk, hm, hv, n, t + lat[f], (ARRIVE << KIND_SHIFT) | (mkey[f] & (MAX_MESSAGES - 1)),
                          f, 0)
                continue
            active[f] = True
            nactive += 1
            last[f] = t
            for h in range(H):
                link = links[f, h]
                if link < 0:
                    break
                e = f * H + h
                nxt[e] = head[link]
                if head[link] >= 0:
                    prv[head[link]] = e
                prv[e] = -1
                head[link] = e
                nflow[link] += 1
                busy[link] += nbytes[f] / hbw[f, h]
            n = _rerate(f, t, links, hbw, nflow, rem, rate, last, ver, mkey, ht, hk, hm, hv, n)
            n = _rerate_sharers(f, t, links, hbw, nflow, head, nxt, rem, rate, last, ver, active, mkey, ht, hk, hm,
                                hv, n)
        elif kind == FINISH:
            if version != ver[f] or not active[f]:
                continue
            active[f] = False
            nactive -= 1
            finished[f] = t
            alone = np.inf
            for h in range(H):
                link = links[f, h]
                if link < 0:
                    break
                alone = min(alone, hbw[f, h])
                e = f * H + h
                if prv[e] >= 0:
                    nxt[prv[e]] = nxt[e]
                else:
                    head[link] = nxt[e]
                if nxt[e] >= 0:
                    prv[nxt[e]] = prv[e]
                nflow[link] -= 1
            queued[f] = max(t - started[f] - nbytes[f] / alone, 0.0)
            n = _rerate_sharers(f, t, links, hbw, nflow, head, nxt, rem, rate, last, ver, active, mkey, ht, hk, hm,
                                hv, n)
            n = _complete(msrc[f], t, True, cur[msrc[f]], overlap, send_end, recv_end, recv_first, slot_red, pending,
                          done, ready, cur, next_slot, slot_ptr, slot_msg, msrc, mdst, mkey, ends, entered, ht, hk,
                          hm, hv, n)
            n = _push(ht, hk, hm, hv, n, t + lat[f], (ARRIVE << KIND_SHIFT) | (mkey[f] & (MAX_MESSAGES - 1)), f, 0)
        else:  # ARRIVE: the last byte has landed
            n = _complete(mdst[f], t, False, cur[mdst[f]], overlap, send_end, recv_end, recv_first, slot_red,
                          pending, done, ready, cur, next_slot, slot_ptr, slot_msg, msrc, mdst, mkey, ends, entered,
                          ht, hk, hm, hv, n)
    return n, nactive


@numba.njit(cache=True)
def run(num_nodes, msrc, mdst, mkey, links, hbw, lat, nbytes, slot_ptr, slot_msg, slot_red, first_slot, next_slot,
        num_links, overlap):
    """Execute the messages; per slot (done, entered) and per message (queued, started, finished) times and per
    link busy seconds. Message f runs msrc[f] -> mdst[f] over links[f] (-1 pads) at hop bandwidths hbw[f];
    mkey[f] = position << POSITION_SHIFT | id orders its start among those at the same time. Slot k (a node's
    round) holds messages slot_msg[slot_ptr[k]:slot_ptr[k + 1]]; node v's rounds are slot first_slot[v], then
    next_slot[k] after slot k, until -1."""
    M, H = links.shape
    nslots = slot_ptr.size - 1
    ready = np.zeros(num_nodes)
    cur = first_slot.copy()
    ends = np.zeros(M, np.int64)
    pending = slot_ptr[1:] - slot_ptr[:-1]
    send_end = np.zeros(nslots)
    recv_end = np.zeros(nslots)
    recv_first = np.full(nslots, np.inf)
    done = np.full(nslots, -1.0)
    busy = np.zeros(num_links)
    queued = np.zeros(M)
    started = np.zeros(M)
    finished = np.zeros(M)
    entered = np.zeros(nslots)
    rem = nbytes.copy()
    rate = np.zeros(M)
    last = np.zeros(M)
    ver = np.zeros(M, np.int64)
    active = np.zeros(M, np.bool_)
    nflow = np.zeros(num_links, np.int64)
    head = np.full(num_links, -1, np.int64)
    nxt = np.full(M * H, -1, np.int64)
    prv = np.full(M * H, -1, np.int64)
    cap = 2 * M + 16  # the first rounds post at most M starts
    ht, hk, hm, hv = np.empty(cap), np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64)
    n = 0
    for v in range(num_nodes):
        if cur[v] >= 0:
            n = _enter(v, ready, cur, slot_ptr, slot_msg, msrc, mdst, mkey, ends, send_end, recv_end, entered,
                       ht, hk, hm, hv, n)
    nactive = 0
    room = 2  # an arrival, and the starts of the largest round
    for k in range(nslots):
        room = max(room, pending[k] + 2)
    while True:
        n, nactive = _events(msrc, mdst, mkey, links, hbw, lat, nbytes, slot_ptr, slot_msg, slot_red, next_slot,
                             overlap, ready, cur, ends, pending, send_end, recv_end, recv_first, done, busy, queued,
                             started, finished, entered, rem, rate, last, ver, active, nflow, head, nxt, prv,
                             ht, hk, hm, hv, n, nactive, room)
        if n == 0:
            break
        cap = 2 * cap + (nactive + 1) * H + room
        ht2, hk2, hm2, hv2 = np.empty(cap), np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64)
        ht2[:n] = ht[:n]
        hk2[:n] = hk[:n]
        hm2[:n] = hm[:n]
        hv2[:n] = hv[:n]
        ht, hk, hm, hv = ht2, hk2, hm2, hv2
    return done, busy, queued, started, finished, entered
