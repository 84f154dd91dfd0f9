"""A huge pipeline's messages of every stage, grouped once for the analytic simulator's bulk model.

Above DATAFLOW_MAX_NODES (analytic.py) a pipeline's fill, steady-state and drain rounds are costed from one
evaluation of all its stages' messages (analytic._stage_hops). Each round's rows are the frontiers (flows.frontier)
of its busy stages' messages; `stage_groups` sorts the messages once by (stage, path latency), which depends on
no protocol, and `stage_frontiers` then gives every stage's frontier for a protocol's costs in one pass: the
same rows and the same flow of each row as a `frontier` call per stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..topology import TIERS
from .flows import Hops, group_values
from .model import CostRules


@dataclass
class StageGroups:
    """A huge pipeline's flows grouped by (stage, path latency), the groups in that order and each group's
    flows in increasing index: what `frontier` does per stage, once for all stages and every protocol."""

    order: np.ndarray  # flows sorted by (stage, latency), stable
    starts: np.ndarray  # first position in `order` of each group
    sizes: np.ndarray  # flows per group
    lat: np.ndarray  # each group's latency
    stage_bounds: np.ndarray  # groups of stage s: [stage_bounds[s], stage_bounds[s + 1])
    tiers: np.ndarray  # (S, tiers): chunk-hops per link tier of each stage's flows
    kinds: np.ndarray  # (S, 2): the stage holds rank-to-rank flows over NVLink, over the network


def _stable_order(keys: np.ndarray) -> np.ndarray:
    """np.argsort(keys, kind="stable") of non-negative integer keys; small keys sort as int16 (numpy's radix
    sort: linear time, the same permutation since the sort is stable)."""
    if keys.size and int(keys.min()) >= 0 and int(keys.max()) < np.iinfo(np.int16).max:
        return np.argsort(keys.astype(np.int16), kind="stable")
    return np.argsort(keys, kind="stable")


def stage_groups(rules: CostRules, hops: Hops, lag: np.ndarray, S: int) -> StageGroups:
    """The protocol-independent grouping of a pipeline's flows (StageGroups), kept on `hops`."""
    key = ("stage groups", S)
    hit = hops.costs.get(key)
    if hit is not None:
        return hit
    kinds = np.zeros((S, 2), bool)
    F = hops.src.size
    if F:
        lats, linv = group_values(hops.lat)
        order = _stable_order(lag * lats.size + linv)
        code = (lag * lats.size + linv)[order]
        starts = np.flatnonzero(np.r_[True, code[1:] != code[:-1]])
        sizes = np.diff(np.r_[starts, F])
        gcode = code[starts]
        glat = lats[gcode % lats.size]
        stage_bounds = np.searchsorted(gcode // lats.size, np.arange(S + 1))
        p2p = (hops.src < rules.world_size) & (hops.dst < rules.world_size)
        np.logical_or.at(kinds[:, 0], lag[p2p & ~hops.net], True)
        np.logical_or.at(kinds[:, 1], lag[p2p & hops.net], True)
    else:
        order = starts = sizes = np.zeros(0, np.int64)
        glat = np.zeros(0)
        stage_bounds = np.zeros(S + 1, np.int64)
    groups = StageGroups(order, starts, sizes, glat, stage_bounds, _stage_tiers(hops, lag, S), kinds)
    hops.costs[key] = groups
    return groups


def stage_frontiers(groups: StageGroups, per_byte: np.ndarray, S: int) -> tuple[np.ndarray, ...]:
    """frontier(lat, per_byte) of each stage's flows, stage after stage: (rows, the flow of each row, and the
    bounds of each stage's rows: stage s has rows [bounds[s], bounds[s + 1]))."""
    if not groups.order.size:
        return np.zeros((0, 2)), np.zeros(0, np.int64), np.zeros(S + 1, np.int64)
    vals = per_byte[groups.order]
    top = np.maximum.reduceat(vals, groups.starts)
    # the first flow of each group attaining its maximum (frontier's choice: the lowest flow index): the least
    # position of a hit in each group (positions of misses count as past the end)
    F = vals.size
    at = np.where(vals == np.repeat(top, groups.sizes), np.arange(F), F)
    first = np.minimum.reduceat(at, groups.starts)
    if (first < F).all():
        flow = groups.order[first]
    else:  # a group without a hit (nan durations): its flows compared equal to none, as before
        hit = np.flatnonzero(at < F)
        gid = np.searchsorted(groups.starts, hit, side="right") - 1
        flow = groups.order[hit[np.r_[True, gid[1:] != gid[:-1]]]]
    # per stage (its groups by increasing latency): drop the groups a later one dominates
    keep = np.ones(top.size, bool)
    for st in range(S):
        lo, hi = int(groups.stage_bounds[st]), int(groups.stage_bounds[st + 1])
        if hi - lo > 1:
            t = top[lo:hi]
            keep[lo:hi - 1] = t[:-1] > np.maximum.accumulate(t[::-1])[::-1][1:]
    bounds = np.r_[0, np.cumsum(keep)][groups.stage_bounds]
    return np.stack([groups.lat[keep], top[keep]], axis=1), flow[keep], bounds


def _stage_tiers(hops: Hops, lag: np.ndarray, S: int) -> np.ndarray:
    """(S, tiers): chunk-hops per link tier of each stage's flows."""
    if not hops.hl.size:
        return np.zeros((S, len(TIERS)))
    tiers = hops.hop_tier
    # a flow standing for copies of itself in other domains (replicas.py) counts once per copy
    units = hops.units[hops.fidx] if hops.replicas is None else (hops.units * hops.replicas.copies)[hops.fidx]
    cell = lag[hops.fidx] * len(TIERS) + tiers
    return np.bincount(cell, weights=units, minlength=S * len(TIERS))[:S * len(TIERS)].reshape(S, len(TIERS))


def window_sums(tier: np.ndarray, kinds: np.ndarray, lo: np.ndarray, hi: np.ndarray, busy: np.ndarray
                 ) -> tuple[np.ndarray, list]:
    """Per round of a pipeline's pattern (its busy stages [lo, hi), none where not busy): the sum of the stages'
    chunk-hops per tier, tier[lo:hi].sum(axis=0), and which step kinds they hold, kinds[lo:hi].any(axis=0),
    for all rounds at once by prefix sums. Chunk-hops are whole numbers, whose sums are exact in any order
    below 2**53; other values (never produced by the builders here) are summed slice by slice."""
    if np.array_equal(tier, np.floor(tier)) and float(tier.sum()) < 2.0 ** 53:
        cum = np.concatenate([np.zeros((1, tier.shape[1])), np.cumsum(tier, axis=0)])
        tiers = np.where(busy[:, None], cum[hi] - cum[lo], 0.0)
    else:
        tiers = np.array([tier[x:y].sum(axis=0) if ok else np.zeros(tier.shape[1])
                          for x, y, ok in zip(lo.tolist(), hi.tolist(), busy.tolist(), strict=True)])
    counts = np.concatenate([np.zeros((1, kinds.shape[1]), np.int64), np.cumsum(kinds, axis=0)])
    held = ((counts[hi] - counts[lo]) > 0) & busy[:, None]
    return tiers, [tuple(row) for row in held.tolist()]


__all__ = ["StageGroups", "stage_frontiers", "stage_groups", "window_sums"]
