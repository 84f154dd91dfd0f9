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


def step(T: np.ndarray, sc: Scatter, lat: np.ndarray, ser: np.ndarray, red: np.ndarray | None, overlap: bool,
         sender_driven: bool) -> np.ndarray:
    """One round on the local ready times T (see the module docstring); `red`: reduce seconds of each reducing
    node (sc.red_local), or None."""
    start = T[sc.src] if sender_driven else np.maximum(T[sc.src], T[sc.dst])
    new = T.copy()
    if sc.src.size:
        arrive = np.maximum.reduceat((start + lat + ser)[sc.d_order], sc.d_starts)
        recv = np.maximum(T[sc.d_nodes], arrive)
        if red is not None and red.size:
            if overlap:
                first = np.full(T.shape, np.inf)
                first[sc.d_nodes] = np.minimum.reduceat((start + lat)[sc.d_order], sc.d_starts)
                full = T.copy()
                full[sc.d_nodes] = recv
                full[sc.red_local] = np.maximum(full[sc.red_local], np.maximum(first[sc.red_local],
                                                                                T[sc.red_local]) + red)
            else:
                full = T.copy()
                full[sc.d_nodes] = recv
                full[sc.red_local] += red
            new = np.maximum(new, full)
        else:
            new[sc.d_nodes] = recv
        sent = np.maximum.reduceat((start + ser)[sc.s_order], sc.s_starts)
        new[sc.s_nodes] = np.maximum(new[sc.s_nodes], sent)
    return new


def repeat(T: np.ndarray, times: int, advance, rate: float, work: int) -> np.ndarray:
    """`advance` applied `times` times to the local times T, one application costing about `work` element
    updates: exactly within EXACT_UPDATES, then at the steady increment or the cycle `rate` (module docstring)."""
    budget = max(8, EXACT_UPDATES // max(work, 1))
    prev = None
    same = 0
    for done in range(times):
        if done >= budget:
            return T + (times - done) * rate
        new = advance(T)
        inc = new - T
        if prev is not None and np.allclose(inc, prev, rtol=1e-12, atol=1e-18):
            same += 1
            if same >= 2:
                return new + (times - done - 1) * inc
        else:
            same = 0
        prev, T = inc, new
    return T


def cycle_rows(src: np.ndarray, dst: np.ndarray, lat: np.ndarray, per_byte: np.ndarray, self_per_byte: float,
               num_nodes: int) -> np.ndarray:
    """(latency, seconds per byte) rows whose maximum at any size is the round's cycle rate: a node's own work
    (0, self_per_byte), each message with its reverse (their mean), and all messages' mean when every node
    sends as many as it receives."""
    rows = [np.array([[0.0, self_per_byte]])]
    F = src.size
    if F:
        key = src * num_nodes + dst
        order = np.argsort(key, kind="stable")
        sk = key[order]
        rkey = dst * num_nodes + src
        at = np.minimum(np.searchsorted(sk, rkey), F - 1)
        hit = sk[at] == rkey
        if hit.any():
            g = order[at[hit]]
            rows.append(np.stack(((lat[hit] + lat[g]) / 2, (per_byte[hit] + per_byte[g]) / 2), axis=1))
        outdeg = np.bincount(src, minlength=num_nodes)
        indeg = np.bincount(dst, minlength=num_nodes)
        if np.array_equal(outdeg, indeg):
            rows.append(np.array([[float(lat.mean()), float(per_byte.mean())]]))
    allrows = np.concatenate(rows)
    uniq, _ = frontier(allrows[:, 0], allrows[:, 1])
    return uniq


def rate_at(rows: np.ndarray, c: float) -> float:
    return float((rows[:, 0] + rows[:, 1] * c).max()) if rows.shape[0] else 0.0


__all__ = ["EXACT_UPDATES", "Scatter", "cycle_rows", "rate_at", "repeat", "scatter", "step"]
