"""The event simulator's compiled loop (event.py prepares its inputs and reads its outputs; the model is there).

Events are (time, key) pairs in a binary heap held in four arrays (time, key, message, version). The key orders
events at equal times: finishes (which free links) before arrivals before starts, starts in the order their
senders post them (`position`), then by message id; the same order as a heap of (time, kind, position,
message, version) tuples. Only finishes of one message can share a (time, key), and all of them but the
message's current version are stale and skipped, so their order among themselves changes nothing.

Why this shape: the loop runs about ten heap operations per message, so per-call overheads dominate. Numba
reference-counts every array passed to a function, with an atomic increment and decrement per array per call;
with a dozen arrays per call that cost was most of the loop's time. The loop and its helpers therefore allocate
nothing and are compiled without Numba's runtime (`_nrt=False`, which has them borrow their arguments); `run`
allocates the state, and grows the heap whenever the loop stops to say the next event's pushes may not fit.
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
def _post(f, t, mkey, ends, pushed, ht, hk, hm, hv, n):
    """One end of message f is ready at t; with both, the message starts at the later of their times.
    ends[f]: -1 before either end is ready, then the first end's time, inf once started (a local copy's
    sender posts it from both of its entries in the slot: later posts change nothing). An end may be posted
    ahead of the events in time (a node whose round ends with a reduction is ready after the event that
    completed it), so the end posted second need not be the later one."""
    if ends[f] < 0:
        ends[f] = t
    elif ends[f] < np.inf:
        pushed[0] += 1
        n = _push(ht, hk, hm, hv, n, max(t, ends[f]), (START << KIND_SHIFT) | mkey[f], f, 0)
        ends[f] = np.inf
    return n


@_compiled
def _advance(v, ready, cur, node_last, slot_ptr, slot_msg, msrc, mkey, ends, send_end, recv_end, recv_first,
             slot_red, pending, done, inside, overlap, credit_ptr, credit_msg, entered, pushed, ht, hk, hm, hv, n):
    """Node v enters its next slots (rounds): posts their messages (each starts once its sender has entered its
    round and its receiver the slot that frees its credit: model.CostRules.credit), and finishes at once a slot
    whose receives have all landed already (they may land before their receiver reaches their round)."""
    while cur[v] < node_last[v]:
        k = cur[v]
        entered[k] = ready[v]
        inside[k] = True
        send_end[k] = ready[v]
        recv_end[k] = max(recv_end[k], ready[v])
        for j in range(slot_ptr[k], slot_ptr[k + 1]):
            f = slot_msg[j]
            if msrc[f] == v:
                n = _post(f, ready[v], mkey, ends, pushed, ht, hk, hm, hv, n)
        for j in range(credit_ptr[k], credit_ptr[k + 1]):
            n = _post(credit_msg[j], ready[v], mkey, ends, pushed, ht, hk, hm, hv, n)
        if pending[k] > 0:
            return n
        _finish(v, k, overlap, send_end, recv_end, recv_first, slot_red, done, ready, cur, entered)
    return n


@_compiled
def _finish(v, k, overlap, send_end, recv_end, recv_first, slot_red, done, ready, cur, entered):
    """Slot k of node v is complete: its end (model.py) becomes v's ready time."""
    if overlap:  # model.CostRules.overlap_reduce: the reduction starts once the node is in the round
        end = max(send_end[k], recv_end[k], max(recv_first[k], entered[k]) + slot_red[k] if slot_red[k] > 0
                  else 0.0)
    else:
        end = max(send_end[k], recv_end[k] + slot_red[k])
    done[k] = end
    ready[v] = end
    cur[v] += 1


@_compiled
def _rerate(g, t, links, hbw, lmin, lcnt, mround, rem, rate, last, ver, ht, hk, hm, hv, n):
    """Flow g's rate from now on: the least over its links of bandwidth / flows of the link's earliest round
    among those on it, 0 while a flow of an earlier round holds one of its links (links serve rounds in order)."""
    rem[g] -= rate[g] * (t - last[g])
    if rem[g] < 0.0:
        rem[g] = 0.0
    last[g] = t
    r = np.inf
    for h in range(links.shape[1]):
        link = links[g, h]
        if link < 0:
            break
        if mround[g] > lmin[link]:
            r = 0.0
            break
        r = min(r, hbw[g, h] / lcnt[link])
    rate[g] = r
    ver[g] += 1
    if r > 0.0:
        n = _push(ht, hk, hm, hv, n, t + rem[g] / r, (FINISH << KIND_SHIFT) | g, g, ver[g])
    return n


@_compiled
def _rerate_sharers(f, t, links, hbw, lmin, lcnt, mround, head, nxt, rem, rate, last, ver, active, ht, hk, hm, hv,
                    n):
    """Every active flow that shares a link with f gets its new rate."""
    H = links.shape[1]
    for h in range(H):
        link = links[f, h]
        if link < 0:
            break
        e = head[link]
        while e >= 0:
            g = e // H
            if active[g] and g != f:
                n = _rerate(g, t, links, hbw, lmin, lcnt, mround, rem, rate, last, ver, ht, hk, hm, hv, n)
            e = nxt[e]
    return n


@_compiled
def _rescan(link, H, head, nxt, mround, lmin, lcnt):
    """The earliest round among the flows on `link` and how many flows of it there are."""
    lo = np.iinfo(np.int64).max
    c = 0
    e = head[link]
    while e >= 0:
        r = mround[e // H]
        if r < lo:
            lo, c = r, 1
        elif r == lo:
            c += 1
        e = nxt[e]
    lmin[link] = lo
    lcnt[link] = c


@_compiled
def _complete(v, t, is_send, k, overlap, credit_ptr, credit_msg, send_end, recv_end, recv_first, slot_red, pending,
              done, inside, ready, cur, node_last, slot_ptr, slot_msg, msrc, mkey, ends, entered, pushed,
              ht, hk, hm, hv, n):
    """One end of a message is done at t in slot k of node v: the sender's bytes have left, or the receiver's
    have landed (possibly before v entered slot k: the slot then finishes when v enters it)."""
    if is_send:
        send_end[k] = max(send_end[k], t)
    else:
        recv_end[k] = max(recv_end[k], t)
    pending[k] -= 1
    if pending[k] == 0 and inside[k]:
        _finish(v, k, overlap, send_end, recv_end, recv_first, slot_red, done, ready, cur, entered)
        n = _advance(v, ready, cur, node_last, slot_ptr, slot_msg, msrc, mkey, ends, send_end, recv_end, recv_first,
                     slot_red, pending, done, inside, overlap, credit_ptr, credit_msg, entered, pushed,
                     ht, hk, hm, hv, n)
    return n


@_compiled
def _events(msrc, mdst, mkey, mround, ks, kd, links, hbw, lat, nbytes, slot_ptr, slot_msg, slot_red, node_last,
            overlap, credit_ptr, credit_msg, ready, cur, ends, pending, send_end, recv_end, recv_first, done, inside,
            busy, queued, started, finished, entered, rem, rate, last, ver, active, lmin, lcnt, head, nxt, prv,
            pushed, ht, hk, hm, hv, n, nactive):
    """Process events until none is left (returns n = 0) or the heap may lack room for the next event's pushes
    (returns n > 0, to be grown): an event re-divides each active flow at most once per link it shares, pushes
    an arrival, and starts at most the messages whose start is not pushed yet."""
    M, H = links.shape
    while n > 0:
        if n + (nactive + 1) * H + 2 + (M - pushed[0]) > ht.size:
            return n, nactive
        t, key, f, version = ht[0], hk[0], hm[0], hv[0]
        n = _pop(ht, hk, hm, hv, n)
        kind = key >> KIND_SHIFT
        if kind == START:
            started[f] = t
            recv_first[kd[f]] = min(recv_first[kd[f]], t + lat[f])
            if links[f, 0] < 0 or nbytes[f] <= 0.0:  # nothing to stream: the message is sent at once
                finished[f] = t
                n = _complete(msrc[f], t, True, ks[f], overlap, credit_ptr, credit_msg, send_end, recv_end,
                              recv_first, slot_red, pending, done, inside, ready, cur, node_last, slot_ptr, slot_msg,
                              msrc, mkey, ends, entered, pushed, ht, hk, hm, hv, n)
                n = _push(ht, hk, hm, hv, n, t + lat[f], (ARRIVE << KIND_SHIFT) | f, f, 0)
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
                if mround[f] < lmin[link]:
                    lmin[link] = mround[f]
                    lcnt[link] = 1
                elif mround[f] == lmin[link]:
                    lcnt[link] += 1
                busy[link] += nbytes[f] / hbw[f, h]
            n = _rerate(f, t, links, hbw, lmin, lcnt, mround, rem, rate, last, ver, ht, hk, hm, hv, n)
            n = _rerate_sharers(f, t, links, hbw, lmin, lcnt, mround, head, nxt, rem, rate, last, ver, active,
                                ht, hk, hm, hv, n)
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
                if mround[f] == lmin[link]:
                    lcnt[link] -= 1
                    if lcnt[link] == 0:
                        _rescan(link, H, head, nxt, mround, lmin, lcnt)
            queued[f] = max(t - started[f] - nbytes[f] / alone, 0.0)
            n = _rerate_sharers(f, t, links, hbw, lmin, lcnt, mround, head, nxt, rem, rate, last, ver, active,
                                ht, hk, hm, hv, n)
            n = _complete(msrc[f], t, True, ks[f], overlap, credit_ptr, credit_msg, send_end, recv_end, recv_first,
                          slot_red, pending, done, inside, ready, cur, node_last, slot_ptr, slot_msg, msrc, mkey,
                          ends, entered, pushed, ht, hk, hm, hv, n)
            n = _push(ht, hk, hm, hv, n, t + lat[f], (ARRIVE << KIND_SHIFT) | f, f, 0)
        else:  # ARRIVE: the last byte has landed
            n = _complete(mdst[f], t, False, kd[f], overlap, credit_ptr, credit_msg, send_end, recv_end, recv_first,
                          slot_red, pending, done, inside, ready, cur, node_last, slot_ptr, slot_msg, msrc, mkey,
                          ends, entered, pushed, ht, hk, hm, hv, n)
    return n, nactive


@numba.njit(cache=True)
def run(num_nodes, msrc, mdst, mkey, mround, ks, kd, links, hbw, lat, nbytes, slot_ptr, slot_msg, slot_red,
        node_first, node_last, num_links, overlap, credit_ptr, credit_msg):
    """Execute the messages; per slot (done, entered) and per message (queued, started, finished) times and per
    link busy seconds. Message f runs msrc[f] -> mdst[f] in round mround[f] over links[f] (-1 pads) at hop
    bandwidths hbw[f], from its sender's slot ks[f] to its receiver's kd[f]; mkey[f] = position <<
    POSITION_SHIFT | f orders its start among those at the same time. Slot k (a node's round) holds messages
    slot_msg[slot_ptr[k]:slot_ptr[k + 1]]; node v's slots are node_first[v] to node_last[v]; entering slot k
    frees the credit of messages credit_msg[credit_ptr[k]:credit_ptr[k + 1]] (their receiver's side)."""
    M, H = links.shape
    nslots = slot_ptr.size - 1
    ready = np.zeros(num_nodes)
    cur = node_first.copy()
    ends = np.full(M, -1.0)  # _post: the first end's ready time
    pending = slot_ptr[1:] - slot_ptr[:-1]
    send_end = np.zeros(nslots)
    recv_end = np.zeros(nslots)
    recv_first = np.full(nslots, np.inf)
    done = np.full(nslots, -1.0)
    inside = np.zeros(nslots, np.bool_)
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
    lmin = np.full(num_links, np.iinfo(np.int64).max, np.int64)  # earliest round among the flows on each link
    lcnt = np.zeros(num_links, np.int64)  # flows of that round on it
    head = np.full(num_links, -1, np.int64)
    nxt = np.full(M * H, -1, np.int64)
    prv = np.full(M * H, -1, np.int64)
    pushed = np.zeros(1, np.int64)  # messages whose start is pushed
    cap = 2 * M + 16  # holds every start, which the first rounds may post
    ht, hk, hm, hv = np.empty(cap), np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64)
    n = 0
    for v in range(num_nodes):
        n = _advance(v, ready, cur, node_last, slot_ptr, slot_msg, msrc, mkey, ends, send_end, recv_end, recv_first,
                     slot_red, pending, done, inside, overlap, credit_ptr, credit_msg, entered, pushed,
                     ht, hk, hm, hv, n)
    nactive = 0
    while True:
        n, nactive = _events(msrc, mdst, mkey, mround, ks, kd, links, hbw, lat, nbytes, slot_ptr, slot_msg,
                             slot_red, node_last, overlap, credit_ptr, credit_msg, ready, cur, ends, pending,
                             send_end, recv_end, recv_first, done, inside, busy, queued, started, finished, entered,
                             rem, rate, last, ver, active, lmin, lcnt, head, nxt, prv, pushed, ht, hk, hm, hv, n,
                             nactive)
        if n == 0:
            break
        cap = 2 * cap + (nactive + 1) * H + 2 + (M - pushed[0])
        ht2, hk2, hm2, hv2 = np.empty(cap), np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64)
        ht2[:n] = ht[:n]
        hk2[:n] = hk[:n]
        hm2[:n] = hm[:n]
        hv2[:n] = hv[:n]
        ht, hk, hm, hv = ht2, hk2, hm2, hv2
    return done, busy, queued, started, finished, entered
