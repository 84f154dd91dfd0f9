"""A forest of identical fat-trees of radix-k switches, addressed arithmetically (nothing per host is stored).

Each tree is a generalized fat-tree (XGFT with parallel cables at the top): hosts are level 0, leaf switches
level 1, then spine, core, ... up to level L. Vocabulary, per level l = 1..L:

- `m[l]`: children of a level-l switch (leaf: hosts per leaf = its down ports);
- `w[l]`: parents of a level-(l-1) node; `p[l]`: parallel cables to each parent, so a level-(l-1) node has
  `up[l-1] = w[l] * p[l]` up ports (a host has one: its NIC);
- a level-l node is (X, Y): X = host // M[l] names its subtree (M[l] = m[1]...m[l]), Y in [0, W[l]) names
  which of the subtree's W[l] = w[1]...w[l] switches it is; its index within the level is X * W[l] + Y.

Non-blocking by default: a leaf has `leaf_down` (= k/2) host ports and k - leaf_down up ports (fewer up ports
model oversubscription); middle levels have k/2 ports down and k/2 up; the top level uses all k ports down,
spreading each lower node's up ports over the fewest top switches that still give integer parallel cables
(`p[L]` = the largest divisor of up[L-1] with m[L] * p[L] <= k). So a full 3-level radix-k tree has k^3/4 hosts;
a truncated one (fewer than k pods) has fewer, fuller top switches.

Routing is up/down with deterministic destination-mod-k port choice: the flow climbs to the nearest common
ancestor level a (the lowest l where src // M[l] == dst // M[l]), leaving level l-1 by port
u[l] = (dst // D[l]) % up[l-1] (D[2] = 1, D[l+1] = D[l] * up[l-1]; the host's port u[1] = 0), and descends
over the cables with the same port numbers on the destination side (the same Y at every level), which is the
unique down path from the chosen top switch.

Cables: level-l cable c (between levels l-1 and l) is (lower node index) * up[l-1] + port, with
n[0] = M[L] host slots per tree; each cable is two links (up and down).
"""

from __future__ import annotations

import math

import numpy as np

MAX_LEVELS = 6


def capacity(radix: int, leaf_down: int, levels: int) -> int:
    """Hosts one tree of `levels` levels can hold."""
    if levels <= 0:
        return 0
    if levels == 1:
        return radix
    return leaf_down * (radix // 2) ** (levels - 2) * radix


def levels_needed(hosts: int, radix: int, leaf_down: int) -> int:
    """Fewest levels whose tree holds `hosts` hosts."""
    for levels in range(1, MAX_LEVELS + 1):
        if capacity(radix, leaf_down, levels) >= hosts:
            return levels
    raise ValueError(f"{hosts} hosts need more than {MAX_LEVELS} levels of radix-{radix} switches")


class FatTree:
    """`trees` identical fat-trees, each with `hosts` host slots in use (see the module docstring)."""

    def __init__(self, hosts: int, trees: int, radix: int, leaf_down: int, levels: int | None = None) -> None:
        if radix < 2 or radix % 2:
            raise ValueError(f"radix must be an even number >= 2, got {radix}")
        if not 1 <= leaf_down < radix:
            raise ValueError(f"a leaf needs between 1 and radix-1 = {radix - 1} host ports, got {leaf_down}")
        need = levels_needed(hosts, radix, leaf_down)
        if levels is None:
            levels = need
        elif levels < need:
            raise ValueError(f"{hosts} hosts per tree need {need} levels of radix-{radix} switches "
                             f"(at most {capacity(radix, leaf_down, levels)} fit in {levels})")
        elif levels > MAX_LEVELS:
            raise ValueError(f"at most {MAX_LEVELS} levels are modelled, got {levels}")
        L = levels
        k = radix
        m = [1] * (L + 1)
        w = [1] * (L + 1)
        p = [1] * (L + 1)
        up = [1] * (L + 1)  # up[0] = 1: a host's NIC cable
        if L == 1:
            m[1] = hosts
            up[1] = 0
        else:
            m[1] = leaf_down
            up[1] = k - leaf_down
            for lv in range(2, L):
                m[lv] = k // 2
                w[lv] = up[lv - 1]
                up[lv] = k - k // 2
            leaves = -(-hosts // leaf_down)
            m[L] = -(-leaves // math.prod(m[2:L]))  # top-level children: only as many subtrees as needed
            p[L] = max(d for d in range(1, up[L - 1] + 1) if up[L - 1] % d == 0 and m[L] * d <= k)
            w[L] = up[L - 1] // p[L]
            up[L] = 0
        self.radix, self.levels, self.trees, self.hosts = k, L, trees, hosts
        self.m, self.w, self.p, self.up = m, w, p, up
        self.M = [math.prod(m[1:lv + 1]) for lv in range(L + 1)]  # hosts under one level-l subtree
        self.W = [math.prod(w[1:lv + 1]) for lv in range(L + 1)]  # switches per level-l subtree
        self.slots = self.M[L]  # host slots per tree (>= hosts)
        # n[l]: level-l nodes per tree (n[0]: host slots).
        self.n = [self.slots // self.M[lv] * self.W[lv] for lv in range(L + 1)]
        self.D = [0, 0] + [math.prod(up[1:lv - 1]) for lv in range(2, L + 1)]  # port-choice divisors
        # cables per tree at level l (between l-1 and l)
        self.cables = [0] + [self.n[lv - 1] * up[lv - 1] for lv in range(1, L + 1)]

    # -- counts -------------------------------------------------------------------------------------------
    def switches_per_tree(self, level: int) -> int:
        return self.n[level]

    # -- addressing -----------------------------------------------------------------------------------------
    def parent(self, level: int, index: np.ndarray, port: np.ndarray) -> np.ndarray:
        """Index (within the tree) of the level-`level` parent of level-(level-1) node `index` via `port`."""
        lo = level - 1
        X, Y = np.divmod(index, self.W[lo])
        return (X // self.m[level]) * self.W[level] + Y * self.w[level] + port // self.p[level]

    def children(self, level: int, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(level-(level-1) child indices, the child's port to this switch) for one switch; one row per cable."""
        X, Y = divmod(index, self.W[level])
        Ylo, y = divmod(Y, self.w[level])
        xs = X * self.m[level] + np.arange(self.m[level], dtype=np.int64)
        child = np.repeat(xs * self.W[level - 1] + Ylo, self.p[level])
        port = np.tile(y * self.p[level] + np.arange(self.p[level], dtype=np.int64), xs.size)
        return child, port

    def cable_ends(self, level: int, cable: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lower node index at level-1, upper node index at level) of level-`level` cables (within a tree)."""
        lower, port = np.divmod(cable, self.up[level - 1])
        return lower, self.parent(level, lower, port)

    def cable(self, level: int, lower: np.ndarray, port: np.ndarray) -> np.ndarray:
        return lower * self.up[level - 1] + port

    # -- routing --------------------------------------------------------------------------------------------
    def nca_level(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Level of the nearest common ancestor of host slots src and dst (0 when src == dst)."""
        a = np.zeros(np.shape(src), dtype=np.int64)
        for lv in range(self.levels):
            a += (src // self.M[lv]) != (dst // self.M[lv])
        return a

    def route(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Cables of the up/down routes from host slot src to dst, within one tree.

        Returns (a, up, down): a[f] is the NCA level; up[f, l-1] / down[f, l-1] is the level-l cable climbed on
        the source side / descended on the destination side (-1 for l > a[f]).
        """
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        a = self.nca_level(src, dst)
        F = src.shape[0]
        # column by column (Fortran order), each level over the flows that climb to it only
        up = np.full((F, self.levels), -1, dtype=np.int64, order="F")
        down = np.full((F, self.levels), -1, dtype=np.int64, order="F")
        act = np.flatnonzero(a >= 1)
        s, d, top = src[act], dst[act], a[act]
        Y = np.zeros(act.size, dtype=np.int64)
        for lv in range(1, self.levels + 1):
            if not act.size:
                break
            # (dst // D) % up, the remainder as x - (x // up) * up (numpy's remainder by a scalar is slow)
            port = np.zeros(act.size, dtype=np.int64) if lv == 1 else _remainder(d // self.D[lv], self.up[lv - 1])
            lower_s = (s // self.M[lv - 1]) * self.W[lv - 1] + Y
            lower_d = (d // self.M[lv - 1]) * self.W[lv - 1] + Y
            up[act, lv - 1] = lower_s * self.up[lv - 1] + port
            down[act, lv - 1] = lower_d * self.up[lv - 1] + port
            Y = Y * self.w[lv] + port // self.p[lv]
            more = np.flatnonzero(top > lv)
            act, s, d, top, Y = act[more], s[more], d[more], top[more], Y[more]
        return a, up, down


def _remainder(x: np.ndarray, k: int) -> np.ndarray:
    """x % k of non-negative integers x by a positive int k (the same array)."""
    return x - (x // k) * k


__all__ = ["MAX_LEVELS", "FatTree", "capacity", "levels_needed"]
