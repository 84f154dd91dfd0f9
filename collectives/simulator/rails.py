"""Rails costed once: the messages between domains on rails 1.. as copies of rail 0's (replicas.py costs the
kept ones).

On a fabric whose rails are copies of one another (Cluster.rail_link_steps: per-rail fat-trees, or trees whose
pods hold whole blocks of rails and whose port choices keep a rail's paths on its own cables), the message
between ranks of two domains on rail j takes the path of the message between the rail-0 GPUs of the same
domains with every fabric link moved by j steps of its level, over links no other rail uses. Where every message
between domains is such a copy (same chunks, stage and receiver's reduction), `rail_rows` lays them out as rows
of a rail-0 message and its copies, and only rail 0's are costed. Messages between a rank and a fabric switch,
or two fabric switches (SHARP's rail trees), cross the one link joining their ends: they are copies where a map
of the nodes (a rank moved by its rail, each rail-0 switch to one switch of each rail) carries rail 0's messages
to each other rail's, over links with the same attributes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .flows import PATH_BLOCK


@dataclass(frozen=True)
class RailRows:
    """Messages between domains as rows of R (column j: rail j), a rail-0 message and its copies on rails 1..:
    `index` ((rows, R) message indices), or, where the messages are the range [lo, hi) (`index` None), the
    range read in place: R consecutive messages a row (`rails_last`), or rail after rail, (hi - lo) / R each."""

    R: int
    index: np.ndarray | None = None
    lo: int = 0
    hi: int = 0
    rails_last: bool = True

    def laid(self, x: np.ndarray) -> np.ndarray:
        """x per message as (rows, R): a view of x[lo:hi] for a range, else gathered."""
        if self.index is not None:
            return x[self.index]
        y = x[self.lo:self.hi]
        return y.reshape(-1, self.R) if self.rails_last else y.reshape(self.R, -1).T

    @property
    def rows(self) -> int:
        return int(self.index.shape[0]) if self.index is not None else (self.hi - self.lo) // self.R

    @property
    def rail0(self) -> np.ndarray:
        """The rail-0 messages (increasing)."""
        if self.index is not None:
            return self.index[:, 0].copy()
        return np.arange(self.lo, self.hi, self.R) if self.rails_last else np.arange(self.lo, self.lo + self.rows)

    def copy_originals(self, x: np.ndarray) -> None:
        """x at every copy set to x at its original (in place: for a range, through views, not gathers)."""
        self.set_copies(x, None)

    def set_copies(self, x: np.ndarray, value) -> None:
        """x at every copy set to `value` (None: to x at the copy's original), in place."""
        if self.index is not None:
            x[self.index[:, 1:]] = x[self.index[:, :1]] if value is None else value
            return
        rows = x[self.lo:self.hi].reshape(-1, self.R) if self.rails_last else x[self.lo:self.hi].reshape(self.R, -1).T
        rows[:, 1:] = rows[:, :1] if value is None else value


def rail_rows(topo, src: np.ndarray, dst: np.ndarray, fields: tuple, receiver_fields: tuple,
              between: np.ndarray | range) -> RailRows | None:
    """The messages between domains `between` (indices, increasing, or a range) as rows of a rail-0 message and
    its copies on rails 1.., where every message between domains is a copy of one on rail 0 moved by its rail:
    the message between two ranks on rail j > 0 has one between the rail-0 GPUs of the same domains (ranks
    src - j, dst - j), with the same `fields` (per message: chunks, stage) and `receiver_fields` (per node,
    read at the receiver: what it reduces), j places before it in the list of messages between domains (rows
    of R messages, rail 0 to R - 1: NCCL's NVLS trees and SHARP's rail trees) or j blocks of n / R before it
    (rail after rail: a ring over the domains per rail). On a fabric whose rails are copies of one another for
    such messages (Cluster.rail_link_steps: paths moved link by link, the rails' links disjoint) rail j's links
    then carry rail 0's loads, so a copy has its original's path latency and seconds per byte, and its
    original comes first in the message order and the node order. Messages to or from fabric switches
    (SHARP's rail trees) are copies on the same terms where every message between domains has a fabric switch
    at one end (`_fabric_rails_alike`). None where any message between domains is not of either form (one
    between rails, a mix of the two forms: they could share links), or the rails are not copies."""
    R = int(getattr(topo, "R", 1))
    n = len(between)
    if R < 2 or not n or n % R:
        return None
    steps = getattr(topo, "rail_link_steps", None)
    rank_rails = steps is not None and steps() is not None
    N = int(topo.world_size)
    fabric = int(getattr(topo, "fabric_base", topo.num_nodes))
    lo, hi = int(between[0]), int(between[-1]) + 1
    if hi - lo == n:  # one range: read where the messages lie, as (n / R, R) views (column j: rail j)
        s, d = src[lo:hi], dst[lo:hi]
        ranks = int(s.max()) < N and int(d.max()) < N
        if (ranks and not rank_rails) or (not ranks and not (hasattr(topo, "adjacent_links") and
                                                             bool(((s >= fabric) | (d >= fabric)).all()))):
            return None
        for rails_last in (True, False):
            rows = RailRows(R, None, lo, hi, rails_last)
            alike = (_rails_alike(rows, src, dst, fields, receiver_fields, N) if ranks else
                     _fabric_rails_alike(topo, rows, src, dst, fields, receiver_fields, N, fabric))
            if alike:
                return rows
        return None
    if not rank_rails:
        return None
    s, d = src[between], dst[between]
    if int(s.max()) >= N or int(d.max()) >= N:
        return None
    rail = s % R
    if not np.array_equal(rail, d % R):
        return None
    for index in (np.arange(n).reshape(-1, R), np.arange(n).reshape(R, -1).T):
        if np.array_equal(rail[index], np.broadcast_to(np.arange(R), index.shape)):
            rows = RailRows(R, between[index])
            if _rails_alike(rows, src, dst, fields, receiver_fields, N):
                return rows
    return None


RAIL_BLOCK = 1 << 16  # messages _rails_alike compares at a time


def _rails_alike(rows: RailRows, src: np.ndarray, dst: np.ndarray, fields: tuple, receiver_fields: tuple,
                 N: int) -> bool:
    """Whether the messages of `rows` are rail-0 messages between ranks (column 0) and their copies moved by j
    ranks (column j) with the same fields; compared about RAIL_BLOCK messages at a time (the temporary arrays
    stay in the processor's caches)."""
    R = rows.R
    S_all, D_all = rows.laid(src), rows.laid(dst)
    X_all = [rows.laid(x) for x in fields]
    step = max(1, RAIL_BLOCK // R)
    for a in range(0, rows.rows, step):
        S, D = S_all[a:a + step], D_all[a:a + step]
        if int(S.max()) >= N or int(D.max()) >= N or (S[:, 0] % R).any() or (D[:, 0] % R).any():
            return False
        moved = np.broadcast_to(np.arange(R), S.shape)
        if not (np.array_equal(S - S[:, :1], moved) and np.array_equal(D - D[:, :1], moved)):
            return False
        if not all(bool((X == X[:, :1]).all()) for X in [X[a:a + step] for X in X_all] +
                   [x[D] for x in receiver_fields]):
            return False
    return True


def _fabric_rails_alike(topo, rows: RailRows, src: np.ndarray, dst: np.ndarray, fields: tuple,
                        receiver_fields: tuple, N: int, fabric: int) -> bool:
    """Whether the messages of `rows`, each with a fabric switch (node >= `fabric`) at one end and a rank or a
    fabric switch at the other, are rail-0 messages (column 0) and copies (column j) under a map of the nodes
    that moves a rank by j (rail 0's ranks to rail j's) and a fabric switch to a fabric switch, one per rail,
    distinct across rails and after its original in the node order, with the same fields. Such a message
    crosses the one link between its two adjacent ends (Cluster.hop_list's path; `adjacent_links` finds it,
    and raises for ends that are not adjacent, as costing the message would), so a copy crosses the image of
    its original's link: the map of the links is one-to-one and the rails' links are disjoint, as the nodes'
    are; the links' attributes are compared, as are the fields. Messages between a rank and a switch need only
    rail 0's links where each copy's switch is its original's moved by the topology's rail_leaf_step (that makes
    it the copy's rank's leaf, over a cable with the original's attributes)."""
    R = rows.R
    S, D = rows.laid(src), rows.laid(dst)
    for X in (S, D):
        rank = X[:, 0] < N
        if not np.array_equal(X < N, np.broadcast_to(rank[:, None], X.shape)):
            return False  # a rank's copy is a rank, a switch's a switch
        if rank.any():
            r = X[rank]
            if (r[:, 0] % R).any() or not np.array_equal(r - r[:, :1], np.broadcast_to(np.arange(R), r.shape)):
                return False
        if not rank.all() and int(X[~rank].min()) < fabric:
            return False  # a domain's switch at a message between domains
    # the switches' map: each rail-0 switch to one switch per rail (one row wherever it appears), all distinct
    sw = np.concatenate([S[S[:, 0] >= fabric], D[D[:, 0] >= fabric]]) - fabric
    size = int(sw.max()) + 1
    some = np.zeros(size, np.int64)
    some[sw[:, 0]] = np.arange(sw.shape[0])  # a row of each rail-0 switch (any: every row must equal it)
    if not np.array_equal(sw[some[sw[:, 0]]], sw) or bool((sw[:, 1:] <= sw[:, :1]).any()):
        return False
    distinct = np.count_nonzero(np.bincount(sw[:, 0], minlength=size))
    if np.count_nonzero(np.bincount(sw.ravel(), minlength=size)) != R * distinct:
        return False  # two switches of rail 0 map to one, or a rail's switch is another rail's
    if not all(bool((X == X[:, :1]).all()) for X in [rows.laid(x) for x in fields] +
               [x[D] for x in receiver_fields]):
        return False
    links = topo.adjacent_links
    leaf_step = getattr(topo, "rail_leaf_step", None)
    rail_step = None if leaf_step is None else leaf_step()
    if rail_step is not None:
        # messages between a rank and a switch: where each copy's switch is its original's moved by j leaf steps
        # (rail_leaf_step), the copy's switch is its rank's leaf once rail 0's is, and the cable between them
        # has rail 0's attributes; so rail 0's links alone are found (each a rank and its leaf: adjacent_links
        # raises otherwise, as costing the message would)
        from_rank = S[:, 0] < N
        rank_row = from_rank | (D[:, 0] < N)
        switch = np.where(from_rank[:, None], D, S)[rank_row]
        if np.array_equal(switch - switch[:, :1], np.broadcast_to(np.arange(R) * rail_step, switch.shape)):
            links(S[rank_row, 0], D[rank_row, 0])
            S, D = S[~rank_row], D[~rank_row]
    # the links (hop_list's one hop of a message with a switch at one end) and their attributes, PATH_BLOCK
    # messages at a time (a block's temporaries stay in the processor's caches)
    s, d = S.ravel(), D.ravel()
    step = max(1, PATH_BLOCK // R)
    for a in range(0, S.shape[0], step):
        hl = links(s[a * R:(a + step) * R], d[a * R:(a + step) * R])
        for x in (topo.link_attributes(hl) if hasattr(topo, "link_attributes") else
                  (topo.link_bandwidth(hl), topo.link_latency(hl), topo.link_tier(hl))):
            x = x.reshape(-1, R)
            if not bool((x == x[:, :1]).all()):
                return False
    return True


__all__ = ["RailRows", "rail_rows"]
