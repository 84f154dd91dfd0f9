"""Link sharing among one round's messages that start at different times (the analytic model's dataflow rule).

The analytic model costs a round's messages once, each at max over its hops of (chunks on the link / effective
bandwidth): every message sharing a link is charged as if all of them streamed over it for their whole
duration. That is exact while they start together (the event model then shares the link among all of them too)
and too slow when they do not: a message whose link-mates started long before it and have left streams alone.
Recursive doubling on a non-power-of-two world is the case: after the fold, ranks whose early exchanges stayed
inside a domain reach an exchange across the fabric hundreds of microseconds before the ranks whose exchanges
crossed it, and their messages share the fabric's links with the late ones' only in part, or not at all.

So where a round's messages on a shared link start at different times (the dataflow model knows every start),
those messages are shared over time as the event model shares them (event.py): a message streams at the least,
over its hops, of the hop's effective bandwidth divided by the messages streaming over that link at that moment;
every start and end re-divides the links it uses. `shared_flows` finds a round's messages that cross a link
with others (a closed set: a link's messages are all in it), `stream_ends` computes when each finishes
streaming. Messages of different rounds meeting on a link (which the event model serves in round order) are not
followed: each round is shared among its own messages, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

# the most work a round's sharing over time may take: sum over its shared links of (messages on the link)^2,
# the re-ratings `stream_ends` does (each start or end re-rates the messages on its links). A round above it
# (a deep pipeline's round with thousands of messages over switch links) keeps the whole-duration rule.
SHARING_WORK_BUDGET = 100_000


@dataclass
class SharedLinks:
    """The messages of a round that share a link with another, and their hops, for `stream_ends`."""

    flows: np.ndarray  # the round's flow index of each shared message
    hop_start: np.ndarray  # (len(flows) + 1,): message i's hops are hop_start[i]:hop_start[i + 1]
    hop_link: np.ndarray  # compact link index of each hop (0..links-1)
    hop_bw: np.ndarray  # effective bandwidth of each hop (bytes/s of data)
    link_start: np.ndarray  # (links + 1,): link l's messages are link_flows[link_start[l]:link_start[l + 1]]
    link_flows: np.ndarray  # local message indices, link-major
    units: np.ndarray  # chunks each message carries


def shared_flows(fidx: np.ndarray, hl: np.ndarray, hop_load: np.ndarray, hop_bw: np.ndarray,
                 units: np.ndarray) -> SharedLinks | None:
    """The messages crossing a link that carries more than their own chunks (flow-major hops: fidx, hl, the
    link's chunks hop_load, effective bandwidth hop_bw), or None when no link is shared (or sharing them over
    time would cost more than SHARING_WORK_BUDGET)."""
    if not hl.size:
        return None
    shared_hop = hop_load > units[fidx] * (1 + 1e-12)
    if not shared_hop.any():
        return None
    hit = np.zeros(units.size, bool)
    hit[fidx[shared_hop]] = True
    flows = np.flatnonzero(hit)
    on_shared = np.unique(hl[shared_hop], return_counts=True)[1]
    if float((on_shared.astype(np.float64) ** 2).sum()) > SHARING_WORK_BUDGET:
        return None
    keep = hit[fidx]
    f_h, l_h, bw_h = fidx[keep], hl[keep], hop_bw[keep]
    local = np.zeros(units.size, np.int64)
    local[flows] = np.arange(flows.size)
    f_loc = local[f_h]
    links, l_loc = np.unique(l_h, return_inverse=True)
    hop_start = np.searchsorted(f_loc, np.arange(flows.size + 1))
    order = np.argsort(l_loc, kind="stable")
    link_start = np.searchsorted(l_loc[order], np.arange(links.size + 1))
    return SharedLinks(flows, hop_start.astype(np.int64), l_loc.astype(np.int64), bw_h.astype(np.float64),
                       link_start.astype(np.int64), f_loc[order].astype(np.int64), units[flows].astype(np.float64))


def staggered(sh: SharedLinks, start: np.ndarray) -> bool:
    """Whether some shared link's messages do not all start at the same time (`start`: per shared message)."""
    at = start[sh.link_flows]
    lo = np.minimum.reduceat(at, sh.link_start[:-1])
    hi = np.maximum.reduceat(at, sh.link_start[:-1])
    return bool((hi - lo > 1e-12 * np.maximum(np.abs(hi), 1e-9)).any())


def stream_ends(sh: SharedLinks, start: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """When each shared message's last byte leaves its sender, the messages starting at `start` with `nbytes`
    each and sharing their links over time (module docstring)."""
    return _stream_ends(start.astype(np.float64), nbytes.astype(np.float64), sh.hop_start, sh.hop_link, sh.hop_bw,
                        sh.link_start, sh.link_flows, int(sh.link_start.size - 1))


class LinkClock:
    """Per link, the span (first start, last end) of the latest round's messages that streamed over it, so that
    a later round's messages yield to them (event.py: a link serves the messages of earlier rounds first)."""

    def __init__(self) -> None:
        self.busy_from = np.zeros(0)
        self.busy_until = np.zeros(0)

    def _links(self, hops) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(distinct links of the round's hops, the hops in link order, where each link's hops begin there),
        kept with the hops (they serve every size of a sweep)."""
        hit = hops.costs.get("links")
        if hit is None:
            order = np.argsort(hops.hl, kind="stable")
            sorted_links = hops.hl[order]
            bounds = np.flatnonzero(np.r_[True, sorted_links[1:] != sorted_links[:-1]])
            hit = (sorted_links[bounds], order, bounds)
            hops.costs["links"] = hit
        size = int(hit[0][-1]) + 1
        if size > self.busy_until.size:
            grow = max(size - self.busy_until.size, self.busy_until.size)
            self.busy_from = np.concatenate((self.busy_from, np.zeros(grow)))
            self.busy_until = np.concatenate((self.busy_until, np.zeros(grow)))
        return hit

    def spans(self, hops) -> tuple[np.ndarray, np.ndarray] | None:
        """(from, until) of the earlier rounds' span on each hop's link, or None when the round has no hops."""
        if not hops.hl.size:
            return None
        self._links(hops)
        return self.busy_from[hops.hl], self.busy_until[hops.hl]

    @staticmethod
    def waits(hops, spans, start: np.ndarray) -> np.ndarray:
        """Per message: when it can stream, no earlier than `start` and than the end of an earlier round's span
        it starts inside of on one of its links."""
        if spans is None:
            return start
        a, b = spans
        s = start[hops.fidx]
        wait = np.where((a <= s) & (s < b), b, s)
        out = start.copy()
        rows = hops.fidx[hops.starts]
        out[rows] = np.maximum(start[rows], np.maximum.reduceat(wait, hops.starts))
        return out

    @staticmethod
    def paused(hops, spans, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """`end` delayed by the earlier rounds' spans that begin on one of a message's links while it streams
        (from `start`): it pauses for them."""
        if spans is None:
            return end
        a, b = spans
        f = hops.fidx
        delay = np.where((start[f] < a) & (a < end[f]), b - a, 0.0)
        out = end.copy()
        rows = f[hops.starts]
        out[rows] += np.maximum.reduceat(delay, hops.starts)
        return out

    def record(self, hops, start: np.ndarray, end: np.ndarray) -> None:
        """Note the round's messages' spans (from their streaming start to their end) on their links."""
        if not hops.hl.size:
            return
        links, order, bounds = self._links(hops)
        f = hops.fidx[order]
        lo = np.minimum.reduceat(start[f], bounds)
        hi = np.maximum.reduceat(end[f], bounds)
        newer = hi > self.busy_until[links]
        self.busy_from[links[newer]] = lo[newer]
        self.busy_until[links[newer]] = hi[newer]


@numba.njit(cache=True)
def _push(ht, hf, hv, n, t, f, v):
    """Add (t, f, v) to the binary min-heap of n entries ordered by time, then flow; the new size."""
    pos = n
    while pos > 0:
        parent = (pos - 1) >> 1
        if t < ht[parent] or (t == ht[parent] and f < hf[parent]):
            ht[pos], hf[pos], hv[pos] = ht[parent], hf[parent], hv[parent]
            pos = parent
        else:
            break
    ht[pos], hf[pos], hv[pos] = t, f, v
    return n + 1


@numba.njit(cache=True)
def _pop(ht, hf, hv, n):
    """Remove the heap's first entry (read by the caller); the new size."""
    n -= 1
    t, f, v = ht[n], hf[n], hv[n]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= n:
            break
        if child + 1 < n and (ht[child + 1] < ht[child] or (ht[child + 1] == ht[child] and hf[child + 1] < hf[child])):
            child += 1
        if ht[child] < t or (ht[child] == t and hf[child] < f):
            ht[pos], hf[pos], hv[pos] = ht[child], hf[child], hv[child]
            pos = child
        else:
            break
    ht[pos], hf[pos], hv[pos] = t, f, v
    return n


@numba.njit(cache=True)
def _stream_ends(start, nbytes, hop_start, hop_link, hop_bw, link_start, link_flows, nlinks):
    """Processor sharing with starts: every start or end re-rates the messages on the links it touches; the
    projected ends wait in a heap (an entry is stale once its message has been re-rated: `version`)."""
    F = start.size
    order = np.argsort(start, kind="mergesort")
    active = np.zeros(nlinks, np.float64)  # messages streaming over each link
    rem = nbytes.copy()
    last = start.copy()
    rate = np.zeros(F)
    state = np.zeros(F, np.int8)  # 0 not started, 1 streaming, 2 done
    version = np.zeros(F, np.int64)
    end = np.zeros(F)
    cap = 4 * F + 16
    ht, hf, hv = np.empty(cap), np.empty(cap, np.int64), np.empty(cap, np.int64)
    n = 0
    nxt = 0
    done = 0
    while done < F:
        # drop stale entries; the earliest end comes before a start at the same time (as event.py orders them)
        while n > 0 and (state[hf[0]] != 1 or hv[0] != version[hf[0]]):
            n = _pop(ht, hf, hv, n)
        tf = ht[0] if n > 0 else np.inf
        ts = start[order[nxt]] if nxt < F else np.inf
        if n > 0 and tf <= ts:
            t, f = tf, hf[0]
            n = _pop(ht, hf, hv, n)
            state[f] = 2
            end[f] = t
            done += 1
            delta = -1.0
        else:
            t, f = ts, order[nxt]
            nxt += 1
            state[f] = 1
            last[f] = t
            delta = 1.0
        for h in range(hop_start[f], hop_start[f + 1]):
            active[hop_link[h]] += delta
        # re-rate f (if it starts) and every streaming message on its links
        for h in range(hop_start[f], hop_start[f + 1]):
            lk = hop_link[h]
            for i in range(link_start[lk], link_start[lk + 1]):
                g = link_flows[i]
                if state[g] != 1:
                    continue
                rem[g] = max(rem[g] - rate[g] * (t - last[g]), 0.0)
                last[g] = t
                r = np.inf
                for k in range(hop_start[g], hop_start[g + 1]):
                    share = hop_bw[k] / active[hop_link[k]]
                    if share < r:
                        r = share
                rate[g] = r
                version[g] += 1
                if n + 1 > ht.size:  # grow the heap
                    ht2, hf2, hv2 = np.empty(2 * ht.size), np.empty(2 * ht.size, np.int64), np.empty(2 * ht.size, np.int64)
                    ht2[:n], hf2[:n], hv2[:n] = ht[:n], hf[:n], hv[:n]
                    ht, hf, hv = ht2, hf2, hv2
                n = _push(ht, hf, hv, n, t + rem[g] / r if rem[g] > 0.0 else t, g, version[g])
    return end


__all__ = ["SHARING_WORK_BUDGET", "LinkClock", "SharedLinks", "shared_flows", "stream_ends", "staggered"]
