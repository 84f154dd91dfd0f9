"""Cluster's links and paths: link attributes by id block, the link between adjacent nodes, and the paths
(NVLink hops inside a domain; NIC, fat-tree cables and PXN hops between domains) that messages take. Link and node
ids are laid out as cluster.py's docstring says; every query is vectorized over numpy arrays."""

from __future__ import annotations

import numpy as np

from .base import as_index_array


class ClusterLinks:
    """Link and path queries of Cluster (a mixin: reads the id blocks and fat-tree Cluster builds)."""

    # -- links ---------------------------------------------------------------------------------------------------
    def _block(self, links: object) -> tuple[np.ndarray, np.ndarray]:
        ids = as_index_array(links, "links")
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_links):
            raise ValueError(f"link ids must be in [0, {self.num_links})")
        return ids, np.searchsorted(self._block_start, ids, side="right") - 1

    def link_bandwidth(self, links: object) -> np.ndarray:
        return self._block_bw[self._block(links)[1]]

    def link_latency(self, links: object) -> np.ndarray:
        return self._block_lat[self._block(links)[1]]

    def link_tier(self, links: object) -> np.ndarray:
        return self._block_tier[self._block(links)[1]]

    def link_endpoints(self, links: object) -> tuple[np.ndarray, np.ndarray]:
        ids, blk = self._block(links)
        src = np.full(ids.shape, -1, dtype=np.int64)
        dst = np.full(ids.shape, -1, dtype=np.int64)
        for b in np.unique(blk).tolist():
            sel = blk == b
            start, _, _, _, kind, lv, direction = self._blocks[b]
            off = ids[sel] - start
            if kind == "nvlink":
                lower, upper = off, self.nvswitch_base + self._domains_of(off)
            else:
                assert self.tree is not None
                t, c = np.divmod(off, self.tree.cables[lv])
                lo, hi = self.tree.cable_ends(lv, c)
                upper = self.fabric_base + self.node_offset[lv] + t * self.tree.n[lv] + hi
                if lv == 1:
                    lower = self._host_rank(t, lo)
                    upper = np.where(lower >= 0, upper, -1)
                else:
                    lower = self.fabric_base + self.node_offset[lv - 1] + t * self.tree.n[lv - 1] + lo
            src[sel], dst[sel] = (lower, upper) if direction == 0 else (upper, lower)
        return src, dst

    def _cable_link(self, level: int, tree: np.ndarray, cable: np.ndarray, down: bool) -> np.ndarray:
        assert self.tree is not None
        size = self.trees * self.tree.cables[level]
        return self.link_offset[level] + (size if down else 0) + tree * self.tree.cables[level] + cable

    def link_between(self, src: object, dst: object) -> np.ndarray:
        """The one link from each src[f] to an adjacent dst[f] (rank <-> its domain switch, rank <-> its leaf,
        fabric switch <-> parent switch; parallel cables: the lowest port). Raises for non-adjacent pairs."""
        s, d = np.broadcast_arrays(as_index_array(src, "src"), as_index_array(dst, "dst"))
        s, d = s.ravel(), d.ravel()
        out = np.full(s.shape, -1, dtype=np.int64)
        N = self.world_size
        todo = None  # the flows the upward pass left (a pair is adjacent one way at most)
        for a, b, down in ((s, d, False), (d, s, True)):  # a: the lower end, b: the upper end
            if down:
                todo = np.flatnonzero(out < 0)
                a, b = a[todo], b[todo]
            found = np.full(a.shape, -1, dtype=np.int64)
            lower_rank = (a >= 0) & (a < N)
            # rank <-> its domain switch
            m = lower_rank & (b == self.nvswitch_base + self._domains_of(np.where(lower_rank, a, 0)))
            found[m] = (a[m] + (N if down else 0))
            if self.tree is not None:
                # rank <-> its leaf
                m = lower_rank & (b >= self.fabric_base) & (found < 0)
                if m.any():
                    t, h = self._fabric_host(a[m])
                    leaf = self.fabric_base + self.node_offset[1] + t * self.tree.n[1] + h // self.tree.M[1]
                    ok = leaf == b[m]
                    idx = np.flatnonzero(m)[ok]
                    found[idx] = self._cable_link(1, t[ok], h[ok], down)
                # switch <-> parent switch
                m = (a >= self.fabric_base) & (b >= self.fabric_base) & (found < 0)
                if m.any():
                    f = np.flatnonzero(m)
                    found[f] = self._switch_uplinks(a[f], b[f], down)
            if down:
                out[todo] = found
            else:
                out = found
        bad = np.flatnonzero(out < 0)
        if bad.size:
            f = int(bad[0])
            raise ValueError(f"no link joins {self.node_label(int(s[f]))} and {self.node_label(int(d[f]))} "
                             f"({bad.size} non-adjacent pair(s))")
        return out

    def _switch_addresses(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vectorized `_switch_address` of fabric switch nodes: (level, tree, index within tree); level 0 where
        the node is not a fabric switch."""
        assert self.tree is not None
        L = self.levels
        rel = nodes - self.fabric_base
        ok = (rel >= 0) & (nodes < self.num_nodes)
        lv = np.searchsorted(np.asarray(self.node_offset[1:L + 2], np.int64), np.where(ok, rel, 0), side="right")
        lv = np.where(ok, np.clip(lv, 1, L), 0)
        n = np.asarray(self.tree.n, np.int64)
        t, i = np.divmod(rel - np.asarray(self.node_offset, np.int64)[lv], np.maximum(n[lv], 1))
        return lv, t, i

    def _switch_uplinks(self, a: np.ndarray, b: np.ndarray, down: bool) -> np.ndarray:
        """Link from fabric switch a[f] up to its parent b[f] (down: the reverse link); -1 where b[f] is not a
        parent of a[f]. Parallel cables: the lowest port."""
        ft = self.tree
        assert ft is not None
        L = self.levels
        la, ta, ia = self._switch_addresses(a)
        lb, tb, ib = self._switch_addresses(b)
        ok = (la >= 1) & (lb == la + 1) & (ta == tb)
        lbc = np.clip(lb, 1, L)
        lac = np.clip(la, 0, L)
        W, m_, w = (np.asarray(x, np.int64) for x in (ft.W, ft.m, ft.w))
        p_, up, cables = (np.asarray(x, np.int64) for x in (ft.p, ft.up, ft.cables))
        X, Y = np.divmod(ia, np.maximum(W[lac], 1))
        Xb, Yb = np.divmod(ib, np.maximum(W[lbc], 1))
        ok &= (X // m_[lbc] == Xb) & (Yb // w[lbc] == Y)
        port = (Yb % w[lbc]) * p_[lbc]
        cable = ia * up[lbc - 1] + port
        size = self.trees * cables[lbc]
        link = np.asarray(self.link_offset, np.int64)[np.minimum(lbc, len(self.link_offset) - 1)] + \
            (size if down else 0) + ta * cables[lbc] + cable
        return np.where(ok, link, -1)

    # -- routing ---------------------------------------------------------------------------------------------------
    def path_links(self, src: object, dst: object) -> np.ndarray:
        """Links of each flow, in order, -1 padded to `max_hops` columns.

        Rank -> rank: within a domain over NVLink (up, down); across domains over NIC and fat-tree (up/down
        routing, destination-mod-k), with a PXN NVLink hop first in a per-rail fabric when the rails differ.
        Any other pair must be adjacent (see `link_between`) and takes one link.
        """
        s, d = np.broadcast_arrays(as_index_array(src, "src"), as_index_array(dst, "dst"))
        s, d = s.ravel(), d.ravel()
        if s.size and (min(s.min(), d.min()) < 0 or max(s.max(), d.max()) >= self.num_nodes):
            raise ValueError(f"nodes must be in [0, {self.num_nodes})")
        N = self.world_size
        out = np.full((s.size, self.max_hops), -1, dtype=np.int64)
        both = (s < N) & (d < N)
        other = ~both
        if other.any():
            out[other, 0] = self.link_between(s[other], d[other])
        sd, dd = self._domains_of(s), self._domains_of(d)
        intra = both & (sd == dd) & (s != d)
        out[intra, 0] = s[intra]
        out[intra, 1] = N + d[intra]
        inter = both & (sd != dd)
        if inter.any():
            if self.tree is None:
                raise ValueError(f"{self.name} has no fabric between domains")
            self._fabric_paths(s[inter], d[inter], np.flatnonzero(inter), out)
        return out

    def hop_list(self, src: object, dst: object) -> tuple[np.ndarray, np.ndarray]:
        """`path_links` flattened: (flow of each hop, link of each hop), flow by flow, each path in order; the
        same hops as the non-negative entries of path_links(src, dst) read row by row, without the
        (flows, max_hops) table (the analytic simulator's call, over hundreds of thousands of flows)."""
        s, d = np.broadcast_arrays(as_index_array(src, "src"), as_index_array(dst, "dst"))
        s, d = s.ravel(), d.ravel()
        if s.size and (min(s.min(), d.min()) < 0 or max(s.max(), d.max()) >= self.num_nodes):
            raise ValueError(f"nodes must be in [0, {self.num_nodes})")
        N, F = self.world_size, s.size
        both = (s < N) & (d < N)
        other = np.flatnonzero(~both)
        sd, dd = self._domains_of(s), self._domains_of(d)
        intra = np.flatnonzero(both & (sd == dd) & (s != d))
        inter = np.flatnonzero(both & (sd != dd))
        count = np.zeros(F, np.int64)
        count[other] = 1
        count[intra] = 2
        route = None
        if inter.size:
            if self.tree is None:
                raise ValueError(f"{self.name} has no fabric between domains")
            route = self._fabric_route(s[inter], d[inter])
            count[inter] = route[0] + 2 * route[4]  # the PXN hops, then up and down a levels
        offs = np.cumsum(count) - count
        hl = np.empty(int(count.sum()), np.int64)
        if other.size:
            hl[offs[other]] = self._adjacent_links(s[other], d[other], sd[other], dd[other])
        if intra.size:
            hl[offs[intra]] = s[intra]
            hl[offs[intra] + 1] = N + d[intra]
        if route is not None:  # the rows of _fabric_cols, written in place
            first, proxy, ts, td, a, up, down = route
            base = offs[inter]
            pxn = np.flatnonzero(first)
            if pxn.size:
                hl[base[pxn]] = s[inter][pxn]
                hl[base[pxn] + 1] = N + proxy[pxn]
            base = base + first
            for lv in range(1, self.levels + 1):
                on = np.flatnonzero(up[:, lv - 1] >= 0)
                hl[base[on] + lv - 1] = self._cable_link(lv, ts[on], up[on, lv - 1], False)
                hl[base[on] + 2 * a[on] - lv] = self._cable_link(lv, td[on], down[on, lv - 1], True)
        return np.repeat(np.arange(F, dtype=np.int64), count), hl

    def rail_link_steps(self) -> tuple[int, ...] | None:
        """Per fabric level l = 1..L (entry l - 1): how far rail j's copy of a level-l link lies from rail 0's,
        per rail (the link ids of rail j are rail 0's + j x step), where the rails of the fabric are copies of
        one another for messages between domains; None where the conditions below fail.

        Holds: a message between ranks in different domains, both on rail j, takes the path of the message
        between the rail-0 GPUs of the same domains (the ranks minus j) with every fabric link moved by j steps
        of its level, and the links of different rails are disjoint. So on such messages each rail is a copy of
        rail 0 (same hops' levels, bandwidths and latencies; loads moved with the links). Conditions, without a
        placement (rank r is slot r, on rail r % R):

        * per-rail fabrics: rail j is tree j (link = level offset + tree x cables + cable): step = cables;
        * one single-level tree: a NIC's host slot is rail x E + endpoint: step E at the NIC;
        * one tree of 2 or 3 levels with rail-aligned leaves (host slot = (block x R + rail) x H + slot, leaf =
          block x R + rail): the rail moves the host by H and the leaf by 1. The nearest common ancestor stays
          where it is when every subtree above the leaves holds whole blocks (R divides M[l] / H, l >= 2); the
          leaf's up port (dst % up[1]) stays when up[1] divides H; the spine's up port (dst // up[1] % up[2] =
          leaf % up[2] when up[1] = H) moves by j without wrapping when R divides up[2], and then names the rail
          (port % R = j), so spine-core cables of different rails differ. Steps: H at the NIC, up[1] at
          leaf-spine, 1 at spine-core. Deeper trees (a port choice that stays put above the spine would put
          every rail on the same cables) are not covered."""
        if self.tree is None or self._slot is not None or self.G % self.R:
            return None
        ft, R, L = self.tree, self.R, self.tree.levels
        if self.per_rail:
            steps = [0] + [ft.cables[lv] for lv in range(1, L + 1)]
        elif L == 1:
            steps = [0, self.E]
        elif L <= 3:
            H = self.H
            if ft.M[1] != H or any((ft.M[lv] // H) % R for lv in range(2, L + 1)) or H % ft.up[1]:
                return None
            if L == 3 and (ft.up[1] != H or ft.up[2] % R):
                return None
            steps = [0, H, ft.up[1], 1][:L + 1]
        else:
            return None
        return tuple(int(x) for x in steps[1:])

    def rail_leaf_step(self) -> int | None:
        """How far rail j's leaf of a rank lies from rail 0's: for rank r on rail 0, rank r + j (rail j, same
        domain) hangs off leaf node leaf_of(r) + j x step, for every j < R; None where the conditions below fail.

        Holds without a placement (rank r is slot r, on rail r % R, with R dividing G, so r + j is the GPU of
        rail j beside r and its NIC's endpoint e is r's):

        * per-rail fabrics: rail j's NIC is host e of tree j, so its leaf is j trees of n[1] leaves on;
        * a tree of 2 levels or more (M[1] = H host slots a leaf): host slot (block x R + rail) x H + slot, so
          the leaf (host // H = block x R + rail) moves by 1 per rail.

        A single-level tree (one switch for every rail) is not covered. A rank's cable to its leaf is a level-1
        link of one block per direction (one bandwidth and latency), so a message between rank r + j and its
        leaf crosses a link with the attributes of rank r's in the same direction."""
        if self.tree is None or self._slot is not None or self.G % self.R:
            return None
        if self.per_rail:
            return int(self.tree.n[1])
        if self.blocked and self.tree.M[1] == self.H:
            return 1
        return None

    def adjacent_links(self, src: object, dst: object) -> np.ndarray:
        """link_between(src, dst) (the one link joining each adjacent pair; raises for others), a rank and its
        own NVSwitch or leaf found without link_between's search: the link hop_list gives a message with a
        switch at one end."""
        s, d = np.broadcast_arrays(as_index_array(src, "src"), as_index_array(dst, "dst"))
        s, d = s.ravel(), d.ravel()
        if s.size and (min(s.min(), d.min()) < 0 or max(s.max(), d.max()) >= self.num_nodes):
            raise ValueError(f"nodes must be in [0, {self.num_nodes})")
        return self._adjacent_links(s, d)

    def _adjacent_links(self, s: np.ndarray, d: np.ndarray, sd: np.ndarray | None = None,
                        dd: np.ndarray | None = None) -> np.ndarray:
        """link_between(s, d), the pairs of a rank and its own domain switch (NVLS's messages: most of the
        analytic simulator's pairs that are not two ranks) without link_between's general search; `sd`, `dd`:
        _domains_of(s) and _domains_of(d), when known."""
        N = self.world_size
        sd = self._domains_of(s) if sd is None else sd
        dd = self._domains_of(d) if dd is None else dd
        up = (s < N) & (d == self.nvswitch_base + sd)  # rank -> its switch: the rank's link up
        down = (d < N) & (s == self.nvswitch_base + dd)  # switch -> rank: the rank's link down
        out = np.where(up, s, N + d)
        rest = np.flatnonzero(~(up | down))
        if rest.size and self.tree is not None:
            # a rank and its leaf switch (a SHARP tree's climb and descent): the rank's cable up or down, as
            # link_between finds it. Where every pair is of this kind (SHARP's messages alone) the index arrays
            # are all the pairs in order: the arrays themselves, not gathers of them
            every = rest.size == s.size
            rs, rd = (s, d) if every else (s[rest], d[rest])
            base = self.fabric_base
            from_rank = (rs < N) & (rd >= base)
            near_mask = from_rank | ((rd < N) & (rs >= base))
            all_near = bool(near_mask.all())
            near = rest if every and all_near else np.flatnonzero(near_mask)
            if near.size:
                climb, rank, other = (from_rank, np.where(from_rank, rs, rd), np.where(from_rank, rd, rs)) \
                    if all_near else (from_rank[near], np.where(from_rank[near], rs[near], rd[near]),
                                      np.where(from_rank[near], rd[near], rs[near]))
                t, h = self._fabric_host(rank)
                leaf = base + self.node_offset[1] + t * self.tree.n[1] + h // self.tree.M[1]
                hit = leaf == other
                down_step = self.trees * self.tree.cables[1]  # the down cable's id past the up cable's
                if all_near and bool(hit.all()):
                    up_link = self._cable_link(1, t, h, False)
                    out[rest] = np.where(climb, up_link, up_link + down_step)
                    rest = rest[:0]
                else:
                    ok = np.flatnonzero(hit)
                    at = near[ok]  # positions in rest
                    up_link = self._cable_link(1, t[ok], h[ok], False)
                    out[rest[at]] = np.where(climb[ok], up_link, up_link + down_step)
                    keep = np.ones(rest.size, bool)
                    keep[at] = False
                    rest = rest[keep]
        if rest.size:
            out[rest] = self.link_between(s[rest], d[rest])
        return out

    def link_blocks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The links as blocks of consecutive ids with the same attributes: (first id, bandwidth, latency, tier)
        of each block, in increasing ids (link l is in the last block starting at or below l)."""
        return self._block_start, self._block_bw, self._block_lat, self._block_tier

    def link_attributes(self, links: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(link_bandwidth, link_latency, link_tier) of `links` in one lookup."""
        blk = self._block(links)[1]
        return self._block_bw[blk], self._block_lat[blk], self._block_tier[blk]

    def _fabric_paths(self, s: np.ndarray, d: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
        out[rows] = self._fabric_cols(s, d)

    def _fabric_route(self, s: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, ...]:
        """The fabric routes of rank flows s -> d in different domains: (hops before the NIC: 2 where a PXN
        NVLink hop to the destination's rail comes first, else 0; the rank whose NIC the flow leaves from (the
        proxy on the destination's rail, or s); source and destination fabric trees; the fat-tree route's NCA
        level, up cables and down cables as FatTree.route gives them)."""
        assert self.tree is not None
        first = np.zeros(s.size, dtype=np.int64)
        if self.per_rail:
            ss = self._slots(s)
            rs, rd = ss % self.G % self.R, self._slots(d) % self.G % self.R
            pxn = rs != rd
            proxy = np.where(pxn, ss - rs + rd, ss)  # the slot on the destination's rail
            if self._rank_at is not None:
                proxy = self._rank_at[proxy]
                if np.any(proxy < 0):
                    f = int(np.flatnonzero(proxy < 0)[0])
                    raise ValueError(f"{self.name}: rank {int(s[f])} reaches rail {int(rd[f])} through the GPU of "
                                     "that rail in its domain (PXN) and that slot is empty in this placement; "
                                     "use rail_fabric='single' for domains with empty slots")
            s = proxy
            first = 2 * pxn
        ts, hs = self._fabric_host(s)
        td, hd = self._fabric_host(d)
        assert np.array_equal(ts, td), "a flow between fabric trees needs a PXN hop"
        return (first, s, ts, td, *self.tree.route(hs, hd))

    def _fabric_cols(self, s: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Fabric paths of rank flows s -> d in different domains: (flows, max_hops) links, -1 padded."""
        N, L = self.world_size, self.levels
        cols = np.full((s.size, self.max_hops), -1, dtype=np.int64)
        first, proxy, ts, td, a, up, down = self._fabric_route(s, d)
        pxn = first > 0
        if pxn.any():
            cols[pxn, 0] = s[pxn]
            cols[pxn, 1] = N + proxy[pxn]
        # in order: up cables of levels 1..a, then down cables of levels a..1 (no gaps)
        for lv in range(1, L + 1):
            on = np.flatnonzero(up[:, lv - 1] >= 0)
            cols[on, first[on] + lv - 1] = self._cable_link(lv, ts[on], up[on, lv - 1], False)
            cols[on, first[on] + 2 * a[on] - lv] = self._cable_link(lv, td[on], down[on, lv - 1], True)
        return cols


__all__ = ["ClusterLinks"]
