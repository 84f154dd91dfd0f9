"""SHARP aggregation trees over a cluster's fat-tree: which switches aggregate which ranks, level by level.

A tree spans the leaves that host its ranks and climbs through one up port per level (so different rails climb
through different spines and cores), stopping at the first level with a single switch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SharpLevel:
    """One level of an aggregation tree: `switches[i]` aggregates `children[i, :]` (node ids, -1 padded)."""

    level: int  # fat-tree level: 1 = leaf
    switches: np.ndarray  # (S,) node ids
    children: np.ndarray  # (S, C) node ids: ranks at level 1, switches of the level below otherwise


@dataclass(frozen=True)
class SharpTree:
    """A SHARP aggregation tree, bottom-up: levels[0] are leaves (children = ranks), levels[-1] the root."""

    rail: int | None
    ranks: np.ndarray
    levels: list[SharpLevel]

    @property
    def root(self) -> int:
        return int(self.levels[-1].switches[0])

    @property
    def depth(self) -> int:
        return len(self.levels)

    @property
    def switches(self) -> np.ndarray:
        return np.concatenate([lv.switches for lv in self.levels])

    def parent_map(self) -> dict[int, int]:
        """child node -> parent switch, for every edge (small trees; the arrays serve the large ones)."""
        out: dict[int, int] = {}
        for lv in self.levels:
            for sw, kids in zip(lv.switches.tolist(), lv.children.tolist(), strict=True):
                out.update({c: sw for c in kids if c >= 0})
        return out


def _increasing(x: np.ndarray, strictly: bool) -> bool:
    return x.size < 2 or bool((x[1:] > x[:-1]).all() if strictly else (x[1:] >= x[:-1]).all())


def _sorted_unique(x: np.ndarray) -> np.ndarray:
    """np.unique by sorting (numpy's hash-based unique is slow on large int arrays); x itself where it is
    strictly increasing already (a rail's ranks), copied."""
    if _increasing(x, strictly=True):
        return x.copy()
    x = np.sort(x)
    return x[np.concatenate(([True], x[1:] != x[:-1]))] if x.size else x


def _grouped(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique keys (sorted) and a (K, max count) array of their values, -1 padded; value order preserved."""
    if _increasing(keys, strictly=False):  # (a tree's ranks by leaf, mostly): the stable sort's order as given
        k, v = keys, values
    else:
        order = np.argsort(keys, kind="stable")
        k, v = keys[order], values[order]
    start = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1]))) if k.size else np.zeros(0, np.int64)
    uniq = k[start]
    counts = np.diff(np.append(start, k.size))
    out = np.full((uniq.size, int(counts.max()) if counts.size else 0), -1, dtype=np.int64)
    row = np.repeat(np.arange(uniq.size), counts)
    col = np.arange(k.size) - np.repeat(start, counts)
    out[row, col] = v
    return uniq, out


class ClusterSharpTrees:
    """Cluster's SHARP trees (a mixin of Cluster: reads its fat-tree, node offsets and rank placement)."""

    # -- SHARP aggregation trees --------------------------------------------------------------------------------
    def sharp_tree(self, rail: int | None = None, ranks: object = None, port: int | None = None) -> SharpTree:
        """The aggregation tree over the leaves that host `ranks` (default: all ranks of `rail`, or all ranks).

        Each level's switches pick their parent through the same up port: `port` if given, else
        `rail % up_ports` (so different rails climb through different spines and cores, and each tree's
        switches reach one root). The tree stops at the first level with a single switch. Leaves' children are
        the ranks (in rank order); higher switches' children are the tree's switches one level down.
        """
        if self.tree is None:
            raise ValueError(f"{self.name} has no fabric, so no SHARP tree")
        if ranks is None:
            ranks = np.arange(self.world_size) if rail is None else self.rail_groups()[self._rail(rail)]
            ranks = ranks[ranks >= 0]  # a placement's empty slots
        r = _sorted_unique(self._ranks(ranks))
        if r.size == 0:
            raise ValueError("a SHARP tree needs at least one rank")
        t, h = self._fabric_host(r)
        if t.size and (t != t[0]).any():
            raise ValueError("in a per-rail fabric a SHARP tree serves one rail: its ranks span several trees")
        tree = int(t[0])
        sel = 0 if port is None and rail is None else (self._rail(rail) if port is None else int(port))
        leaf_idx = h // self.tree.M[1]
        base = self.fabric_base + self.node_offset[1] + tree * self.tree.n[1]
        idx, kids = _grouped(leaf_idx, r)
        levels = [SharpLevel(1, base + idx, kids)]
        lv = 1
        while idx.size > 1:
            lv += 1
            up = self.tree.up[lv - 1]
            parent = self.tree.parent(lv, idx, np.full(idx.shape, sel % up, dtype=np.int64))
            child_nodes = self.fabric_base + self.node_offset[lv - 1] + tree * self.tree.n[lv - 1] + idx
            idx, kids = _grouped(parent, child_nodes)
            levels.append(SharpLevel(lv, self.fabric_base + self.node_offset[lv] + tree * self.tree.n[lv] + idx,
                                     kids))
        return SharpTree(None if rail is None else int(rail), r, levels)


__all__ = ["ClusterSharpTrees", "SharpLevel", "SharpTree"]
