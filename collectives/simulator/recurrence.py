"""A per-node recurrence over a schedule's rounds: NCCL's per-step latency critical path (latency.py) runs it.

Each node has a ready time T[v]. In one round, a message f from u to v starts at

* T[u] (*sender-driven*, `sender_driven=True`): NCCL's step waits for its sender's data, not for the receiver
  to reach the same step, because the receiver's buffer has NCCL_STEPS slots per connection
  (src/include/device.h; src/device/prims_*.h wait for the receiver's credit only when all slots are full);
* max(T[u], T[v]) (*rendezvous*): the rule of the transfer model (model.py), kept there because the event and
  analytic models only agree on shared links while a round's messages overlap each other (analytic.py).

It lands at start + latency + serialization; node v's round ends when its sends have left and its receives have
landed and been reduced (model.py): T'[v] = max(T[v], sends' start + ser, receives' arrival), with a reduction
after the receives (streamed: no earlier than max(T[v], first arrival) + reduce time).

A uniform round repeated R times applies that map R times. While the R x (messages + nodes) updates stay within
EXACT_UPDATES the map is iterated exactly; it stops early once every node's increment has been the same three
times in a row (a steady state, which a max-plus linear map keeps), and beyond the budget the remaining
iterations advance every node by the round's cycle rate (`cycle_rows`): the largest mean duration of a cycle of
dependencies the round certainly holds (a node's own sends and reduction, a message and its reverse, and, when
every node sends as many messages as it receives, the mean over all messages: exact for rings, whose channels
all cross the same boundaries). Without per-node times (the bulk model) a repeated round costs its slowest
message plus R - 1 times that rate, never more than R x its slowest message.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .flows import frontier

EXACT_UPDATES = 8_000_000  # message updates of one repeated round iterated exactly, before extrapolating
PERIODS = 8  # the longest period of a steady state `iterate` recognises


@dataclass
class Scatter:
    """A round's messages grouped by receiver and by sender over the nodes they touch (local indices)."""

    nodes: np.ndarray  # the global node of each local index
    src: np.ndarray  # local sender of each message
    dst: np.ndarray  # local receiver of each message
    d_order: np.ndarray
    d_starts: np.ndarray
    d_nodes: np.ndarray
    s_order: np.ndarray
    s_starts: np.ndarray
    s_nodes: np.ndarray
    red_local: np.ndarray  # local index of each reducing node


def _groups(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]]) if k.size else np.zeros(0, np.int64)
    return order, starts, k[starts]


def scatter(src: np.ndarray, dst: np.ndarray, red_node: np.ndarray) -> Scatter:
    nodes, inv = np.unique(np.concatenate((src, dst, red_node)), return_inverse=True)
    F = src.size
    ls, ld, lr = inv[:F], inv[F:2 * F], inv[2 * F:]
    d_order, d_starts, d_nodes = _groups(ld)
    s_order, s_starts, s_nodes = _groups(ls)
    return Scatter(nodes, ls, ld, d_order, d_starts, d_nodes, s_order, s_starts, s_nodes, lr)


def step(T: np.ndarray, credit: np.ndarray, sc: Scatter, lat: np.ndarray, ser: np.ndarray, red: np.ndarray | None,
         overlap: bool) -> np.ndarray:
    """One round on the local ready times T (see the module docstring): message f starts at
    max(T[sender], credit[f]), credit[f] its receiver's end of the round its credit frees; `red`: reduce seconds
    of each reducing node (sc.red_local), or None."""
    start = np.maximum(T[sc.src], credit)
    new = T.copy()
    if sc.src.size:
        arrive = np.maximum.reduceat((start + lat + ser)[sc.d_order], sc.d_starts)
        new[sc.d_nodes] = np.maximum(T[sc.d_nodes], arrive)
        if red is not None and red.size:
            if overlap:  # the reduction streams from the round's first arriving byte, once the node is in it
                first = np.full(T.shape, np.inf)
                first[sc.d_nodes] = np.minimum.reduceat((start + lat)[sc.d_order], sc.d_starts)
                r = sc.red_local
                new[r] = np.maximum(new[r], np.maximum(first[r], T[r]) + red)
            else:
                new[sc.red_local] += red
        sent = np.maximum.reduceat((start + ser)[sc.s_order], sc.s_starts)
        new[sc.s_nodes] = np.maximum(new[sc.s_nodes], sent)
    return new


def advance_history(H: np.ndarray, sc: Scatter, back: np.ndarray, lat: np.ndarray, ser: np.ndarray,
                    red: np.ndarray | None, overlap: bool) -> np.ndarray:
    """One round on the local history H (slots, nodes): H[-1] the ready times now, H[-j] those j - 1 rounds
    ago; message f's credit is its receiver's row H[-back[f]] (back >= 1, at most len(H))."""
    return step(H[-1], H[H.shape[0] - back, sc.dst], sc, lat, ser, red, overlap)


def iterate(H: np.ndarray, times: int, advance, rate: float, work: int) -> np.ndarray:
    """The local history H (slots, nodes; see advance_history) after `times` rounds of advance(H) -> new row:
    exact within EXACT_UPDATES updates (`work` per round), then at the steady increment or the cycle `rate`
    (module docstring).

    A steady state may have a period c > 1 (a max-plus map is eventually periodic: x(k + c) = x(k) + D): once
    the newest row's c-round increment D has repeated c x (1 + slots) rounds in a row, every later row is the
    row a whole number of periods before it plus that many D (c = 1: the history moves by D each round)."""
    budget = max(8, EXACT_UPDATES // max(work, 1))
    rows = [H[-1]]  # the newest rows, newest last (at most PERIODS + 1)
    same = [0] * (PERIODS + 1)  # per period c: rounds in a row whose c-round increment repeated
    prev: list[np.ndarray | None] = [None] * (PERIODS + 1)
    need = 1 + H.shape[0]
    for done in range(times):
        if done >= budget:
            return H + (times - done) * rate
        new = advance(H)
        H = np.vstack((H[1:], new[None, :]))
        rows.append(new)
        if len(rows) > PERIODS + 1:
            rows.pop(0)
        left = times - done - 1
        for c in range(1, min(PERIODS, len(rows) - 1) + 1):
            d = new - rows[-1 - c]
            same[c] = same[c] + 1 if prev[c] is not None and _close(d, prev[c]) else 0
            prev[c] = d
            if same[c] >= need * c:
                return H + left * d if c == 1 else _periodic(H, rows, c, d, left)
    return H


def _periodic(H: np.ndarray, rows: list[np.ndarray], c: int, D: np.ndarray, left: int) -> np.ndarray:
    """The history `left` rounds on, when each row is the row c rounds before it plus D."""
    slots = H.shape[0]
    out = np.empty_like(H)
    for i in range(slots):
        j = left - (slots - 1 - i)  # output row i is the row j rounds after the newest one
        if j <= 0:
            out[i] = H[slots - 1 + j]
        else:
            n = -(-j // c)  # periods back to a row we have: j - n c in (-c, 0]
            out[i] = rows[-1 + j - n * c] + n * D
    return out


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    """np.allclose(a, b, rtol=1e-12, atol=1e-18), without its overhead on finite arrays."""
    with np.errstate(invalid="ignore"):
        if bool((np.abs(a - b) <= 1e-18 + 1e-12 * np.abs(b)).all()):
            return True
    if np.isfinite(a).all() and np.isfinite(b).all():
        return False
    return bool(np.allclose(a, b, rtol=1e-12, atol=1e-18))


def reverse_pairs(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """(flows, their reverse flows): one message of each pair of nodes that exchange messages both ways in the
    round, and one of the reverse direction (one sort of the unordered pairs)."""
    if not src.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo, hi = np.minimum(src, dst), np.maximum(src, dst)
    code = (lo * num_nodes + hi) * 2 + (src < dst)
    order = np.argsort(code)
    sc = code[order]
    pair = sc >> 1
    first = np.flatnonzero(np.r_[True, pair[1:] != pair[:-1]])
    last = np.r_[first[1:] - 1, sc.size - 1]
    both = (sc[first] & 1) != (sc[last] & 1)
    return order[first[both]], order[last[both]]


def cycle_rows(src: np.ndarray, dst: np.ndarray, lat: np.ndarray, per_byte: np.ndarray, self_per_byte: float,
               num_nodes: int, slots: int, flow_rows: np.ndarray | None = None, pairs: tuple | None = None,
               shared: dict | None = None, full=None) -> np.ndarray:
    """(latency, seconds per byte) rows whose maximum at any size is the round's cycle rate, a lower bound of
    the rate its cycles of dependencies set: a node's own work (0, self_per_byte), a message's receiver
    waiting for its credit `slots` rounds back (the message's duration / slots: with one slot, rendezvous, the
    slowest message), each message with its reverse (their mean), and all messages' mean when every node sends
    as many as it receives. `flow_rows`: frontier(lat, per_byte), `pairs`: reverse_pairs(src, dst), if known;
    `shared`: a dict kept with (src, dst, lat) for what does not depend on per_byte (the protocols of one round
    share it). `full` (replicas.Replicas): the flows stand for more, identical ones (a pipeline's domains
    costed on one); the balance test and the means are over all of them."""
    F = src.size
    if flow_rows is None:
        flow_rows = _extremes(lat, per_byte)
    rows = [np.array([[0.0, self_per_byte]]), flow_rows / slots]
    if F and slots > 1:
        hit, g = reverse_pairs(src, dst, num_nodes) if pairs is None else pairs
        memo = {} if shared is None else shared
        if "balanced" not in memo:
            memo["pair_lat"] = (lat[hit] + lat[g]) / 2 if hit.size else None
            if full is None:
                memo["balanced"] = np.array_equal(np.bincount(src, minlength=num_nodes),
                                                  np.bincount(dst, minlength=num_nodes))
            else:
                memo["balanced"] = full.balanced
            memo["mean_lat"] = (float(lat.mean()) if full is None else full.mean(lat)) if memo["balanced"] \
                else None
        if hit.size:
            rows.append(_extremes(memo["pair_lat"], (per_byte[hit] + per_byte[g]) / 2))
        if memo["balanced"]:
            mean = float(per_byte.mean()) if full is None else full.mean(per_byte)
            rows.append(np.array([[memo["mean_lat"], mean]]))
    allrows = np.concatenate(rows)
    uniq, _ = frontier(allrows[:, 0], allrows[:, 1])
    return uniq


def _extremes(lat: np.ndarray, per_byte: np.ndarray) -> np.ndarray:
    """The rows of the largest latency and of the largest seconds per byte (exact at both ends of the size
    range, below the full frontier between them: the rate stays a lower bound)."""
    if not lat.size:
        return np.zeros((0, 2))
    i, j = int(np.argmax(lat)), int(np.argmax(per_byte))
    return np.array([[lat[i], per_byte[i]], [lat[j], per_byte[j]]])


def rate_at(rows: np.ndarray, c: float) -> float:
    return float((rows[:, 0] + rows[:, 1] * c).max()) if rows.shape[0] else 0.0


__all__ = ["EXACT_UPDATES", "Scatter", "advance_history", "cycle_rows", "iterate", "reverse_pairs", "rate_at", "scatter", "step"]
