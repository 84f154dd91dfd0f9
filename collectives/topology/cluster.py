"""A GPU cluster: scale-up domains (NVLink + a switch that may reduce: NVLS) joined by a rail-aligned fat-tree.

The model (what the schedule builders and the simulators may rely on):

- **Ranks and placement.** The cluster has D x G GPU *slots*: slot s is GPU `local = s % G` of domain `s // G`
  (G = gpus_per_domain). By default rank r occupies slot r (equal, consecutive domains). A `placement` (spec
  field: row d lists domain d's ranks in local slot order) puts ranks anywhere: round-robin (a permutation), or
  domains of unequal size (a domain of fewer ranks leaves its last slots empty: 3 + 2 ranks is D = 2, G = 3).
  The fabric, rails and switches are those of the D x G slots whatever the placement; a rank's NIC sits on rail
  `local % R` (R = rails, default G: GPU j of every domain on rail j). `domain_groups()` is the (D, G) rank table
  (-1 in empty slots).
- **Scale-up domain.** One switch node per domain (all NVSwitch chips of the domain as one non-blocking
  crossbar). Each GPU has an up link (GPU -> switch) and a down link (switch -> GPU) of `nvlink_bandwidth` per
  direction; GPU -> GPU in a domain crosses both. With `nvls`, the switch reduces and multicasts (`.nvls`).
- **Scale-out fabric.** Each GPU's NIC (`nic_bandwidth` per direction, striped over `nic_planes` identical
  planes) enters a leaf switch of a fat-tree of radix-`radix` switches (see fattree.py for the wiring and the
  destination-mod-k routing). Leaves are rail-aligned: a leaf holds the NICs of one rail only.
  `rail_fabric="single"` (default): one fat-tree; leaf (block b, rail j) holds rail j of a block of
  `leaf_down` consecutive rail endpoints (NVL72: 72 racks), and the leaves of a block are consecutive, so with
  72 rails and 72 leaves per pod a pod is one block of racks. Cross-rail traffic climbs to a spine.
  `rail_fabric="per-rail"`: every rail is its own fat-tree (fewer levels); cross-rail traffic first crosses
  NVLink to the GPU of the destination's rail in the source domain (PXN, as NCCL does), then that rail's tree.
- **Planes.** A fabric link stands for the same cable in every plane (traffic is striped evenly, as NCCL does),
  so its bandwidth is the sum over planes; switch counts and SHARP limits are per plane (`describe()` shows
  the physical totals).
- **Node ids.** Ranks 0..N-1, then one NVSwitch node per domain (N + d), then the fabric switches level by
  level (leaf, spine, core, ...), tree by tree, index by index: stable for given parameters.
- **Link ids.** NVLink up links [0, N) (rank r: id r), NVLink down links [N, 2N) (id N + r), then per fabric
  level l = 1..L (1 = NIC cables, 2 = leaf-spine, 3 = spine-core) a block of up links and a block of down links,
  each tree by tree, cable by cable. Links of unused leaf ports exist but carry nothing.
- **Latency.** A link's latency includes the switch it enters: NVLink hops `nvlink_latency` each; NIC up
  `nic_latency + switch_latency`, NIC down `nic_latency`; fabric hops `fabric_latency + switch_latency`.

Nothing here is per GPU: construction is arithmetic (a placement adds two index arrays), and every query is
vectorized over numpy arrays; without a placement, rank -> slot is the identity and costs nothing.
"""


from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .base import TIER_CODE, Topology, _fmt_reduce, as_index_array, floor_divmod
from .capabilities import SHARP_GENERATIONS, NvlsSpec, SharpSpec, nvls_derate
from .cluster_links import ClusterLinks
from .fattree import FatTree
from .runtime import NVLS_CHANNELS, NcclRuntime, default_ring_channels
from .sharp_tree import ClusterSharpTrees, SharpLevel, SharpTree
from .spec import FABRIC_TIERS, LEVEL_NAMES, ClusterSpec, check_names


class RankLocation(NamedTuple):
    """Where ranks sit (arrays, one entry per rank asked about)."""

    domain: np.ndarray
    local: np.ndarray  # GPU index inside the domain
    rail: np.ndarray
    leaf: np.ndarray  # node id of the leaf switch (-1 without a fabric)
    nvswitch: np.ndarray  # node id of the domain's switch


def _strings(labels: list[str]) -> np.ndarray:
    """`labels` as an object array of the str objects themselves (numpy would make a list of str a unicode
    array, whose elements read back as np.str_)."""
    out = np.empty(len(labels), object)
    out[:] = labels
    return out


class Cluster(ClusterLinks, ClusterSharpTrees, Topology):
    """A cluster built from a `ClusterSpec` (see the module docstring for the model)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = s = spec
        self.name = s.name
        G, R, D = s.gpus_per_domain, s.num_rails, s.domains
        self.G, self.R, self.D = G, R, D
        # rank -> slot and slot -> rank (-1: empty slot), or None for the identity (no placement)
        self._slot: np.ndarray | None = None
        self._rank_at: np.ndarray | None = None
        if s.placement is not None:
            rows = s.placement
            slot_table = np.full((D, G), -1, dtype=np.int64)
            for d, row in enumerate(rows):
                slot_table[d, :len(row)] = row
            self._rank_at = slot_table.ravel()
            used = np.flatnonzero(self._rank_at >= 0)
            self._slot = np.empty(used.size, dtype=np.int64)
            self._slot[self._rank_at[used]] = used
        self.world_size = N = D * G if self._slot is None else int(self._slot.size)
        self.per_rail_slot = G // R  # GPUs of one rail in a domain
        self.E = D * self.per_rail_slot  # endpoints per rail
        self.reduce_bandwidth = s.reduce_bandwidth
        self.per_rail = s.rail_fabric == "per-rail"
        k, H = s.radix, s.leaf_down
        self.H = H
        trees = R if self.per_rail else 1
        flat_hosts = self.E if self.per_rail else R * self.E
        if s.levels == 0:
            self.tree: FatTree | None = None
        elif (s.levels is None and flat_hosts <= k) or s.levels == 1:
            self.tree = FatTree(flat_hosts, trees, k, H, levels=1)
        else:
            blocks = -(-self.E // H)
            hosts = blocks * H * (1 if self.per_rail else R)
            self.tree = FatTree(hosts, trees, k, H, levels=s.levels)
        self.blocked = self.tree is not None and self.tree.levels >= 2
        self.trees = trees
        L = self.levels
        # node ids
        self.nvswitch_base = N
        self.fabric_base = N + D
        self.node_offset = [0] * (L + 2)  # level l's first node id relative to fabric_base
        for lv in range(1, L + 1):
            self.node_offset[lv + 1] = self.node_offset[lv] + trees * self.tree.n[lv]  # type: ignore[union-attr]
        self.num_nodes = self.fabric_base + self.node_offset[L + 1]
        # link blocks: (start, tier, bandwidth, latency, kind, level, direction)
        fbw = s.fabric_bandwidth
        per_port = s.nic_bandwidth / s.nic_planes
        eff = s.nic_efficiency  # the network's links carry packets: their payload share of the line rate
        blocks_: list[tuple[int, int, float, float, str, int, int]] = [
            (0, TIER_CODE["nvlink"], s.nvlink_bandwidth, s.nvlink_latency, "nvlink", 0, 0),
            (N, TIER_CODE["nvlink"], s.nvlink_bandwidth, s.nvlink_latency, "nvlink", 0, 1),
        ]
        start = 2 * N
        self.link_offset = [0] * (L + 1)  # first link id of level l's up block (down block follows)
        for lv in range(1, L + 1):
            size = trees * self.tree.cables[lv]  # type: ignore[union-attr]
            self.link_offset[lv] = start
            if lv == 1:
                bw = s.nic_bandwidth * eff
                lat_up, lat_down = s.nic_latency + s.switch_latency, s.nic_latency
            else:
                port = fbw if fbw is None or not isinstance(fbw, (list, tuple)) else fbw[min(lv - 2, len(fbw) - 1)]
                bw = (per_port if port is None else float(port)) * s.nic_planes * eff
                lat_up = lat_down = s.fabric_latency + s.switch_latency
            tier = TIER_CODE[FABRIC_TIERS[lv - 1]]
            blocks_.append((start, tier, bw, lat_up, "fabric", lv, 0))
            blocks_.append((start + size, tier, bw, lat_down, "fabric", lv, 1))
            start += 2 * size
        self.num_links = start
        self._blocks = blocks_
        self._block_start = np.array([b[0] for b in blocks_], dtype=np.int64)
        self._block_tier = np.array([b[1] for b in blocks_], dtype=np.int8)
        self._block_bw = np.array([b[2] for b in blocks_], dtype=np.float64)
        self._block_lat = np.array([b[3] for b in blocks_], dtype=np.float64)
        self.max_hops = 2 + 2 * L + (2 if self.per_rail else 0)

    # -- basic facts -------------------------------------------------------------------------------------------
    @property
    def levels(self) -> int:
        """Fat-tree levels (0: no fabric)."""
        return 0 if self.tree is None else self.tree.levels

    @property
    def level_names(self) -> tuple[str, ...]:
        return LEVEL_NAMES[:self.levels]

    @property
    def num_domains(self) -> int:
        return self.D

    @property
    def gpus_per_domain(self) -> int:
        return self.G

    @property
    def num_rails(self) -> int:
        return self.R

    @property
    def placed(self) -> bool:
        """Whether ranks sit other than rank r in slot r (a `placement`: unequal or non-consecutive domains)."""
        return self._slot is not None

    @property
    def domain_sizes(self) -> tuple[int, ...]:
        """Ranks per domain."""
        if self._rank_at is None:
            return (self.G,) * self.D
        return tuple((self._rank_at.reshape(self.D, self.G) >= 0).sum(axis=1).tolist())

    @property
    def nvls(self) -> NvlsSpec:
        s = self.spec
        derate = nvls_derate(s.gpu, s.gpus_per_domain) if s.nvls_derate is None else float(s.nvls_derate)
        return NvlsSpec(s.nvls, s.nvlink_bandwidth, s.nvlink_latency, derate, s.gpus_per_domain)

    @property
    def runtime(self) -> NcclRuntime | None:
        """How collectives run here (topology/runtime.py): NCCL's protocols and channels, or None (a host)."""
        s = self.spec
        if s.runtime is None:
            return None
        gen = s.gpu or "hopper"
        multi = self.D > 1
        ring = s.channels if s.channels is not None else default_ring_channels(gen, s.nvlink_bandwidth, self.R, multi)
        nvls = s.nvls_channels if s.nvls_channels is not None else NVLS_CHANNELS[gen, multi]
        return NcclRuntime(gen, int(ring), int(nvls), multi, self.R, self.G)

    @property
    def sharp(self) -> SharpSpec:
        s = self.spec
        gen = SHARP_GENERATIONS.get(s.sharp or "v3", SHARP_GENERATIONS["v3"])

        def pick(value: object, key: str) -> Any:
            return gen[key] if value is None else value

        return SharpSpec(
            generation=s.sharp if self.tree is not None else None, switch=s.switch or str(gen["switch"]),
            llt_trees=pick(s.sharp_llt_trees, "llt_trees"), sat_trees=pick(s.sharp_sat_trees, "sat_trees"),
            sat_scope=pick(s.sharp_sat_scope, "sat_scope"), max_sat_flows=pick(s.sharp_max_sat_flows, "max_sat_flows"),
            ost_size=pick(s.sharp_ost_size, "ost_size"), ost_quota=s.sharp_ost_quota,
            sat_threshold=s.sharp_sat_threshold, min_nodes=s.sharp_min_nodes, accumulator=s.sharp_accumulator,
            sat_efficiency=s.sharp_sat_efficiency, multicast=s.sharp_multicast, v3_dtypes=bool(gen["v3_dtypes"]))

    # -- ranks -------------------------------------------------------------------------------------------------
    def _ranks(self, ranks: object) -> np.ndarray:
        r = as_index_array(ranks, "ranks")
        if r.size and (r.min() < 0 or r.max() >= self.world_size):
            raise ValueError(f"ranks must be in [0, {self.world_size})")
        return r

    def _slots(self, r: np.ndarray) -> np.ndarray:
        """Slots of ranks (checked ranks): the identity without a placement."""
        return r if self._slot is None else self._slot[r]

    def _domains_of(self, nodes: np.ndarray) -> np.ndarray:
        """Domain of each node that is a rank (any value elsewhere: callers mask non-ranks out)."""
        if self._slot is None:
            return nodes // self.G
        return self._slot[np.clip(nodes, 0, self.world_size - 1)] // self.G

    def rank_domain(self, ranks: object) -> np.ndarray:
        return self._slots(self._ranks(ranks)) // self.G

    def rank_local(self, ranks: object) -> np.ndarray:
        return self._slots(self._ranks(ranks)) % self.G

    def rank_rail(self, ranks: object) -> np.ndarray:
        return self._slots(self._ranks(ranks)) % self.G % self.R

    def nvswitch_of(self, ranks: object) -> np.ndarray:
        """Node id of each rank's domain switch."""
        return self.nvswitch_base + self.rank_domain(ranks)

    def _fabric_host(self, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tree, host slot) of ranks' NICs."""
        d, j = floor_divmod(self._slots(r), self.G)
        g, rail = floor_divmod(j, self.R)
        e = d * self.per_rail_slot + g  # endpoint index within the rail
        if self.per_rail:
            return rail, e
        if not self.blocked:
            return np.zeros_like(r), rail * self.E + e
        b, slot = floor_divmod(e, self.H)
        return np.zeros_like(r), (b * self.R + rail) * self.H + slot

    def _host_rank(self, tree: np.ndarray, host: np.ndarray) -> np.ndarray:
        """Inverse of `_fabric_host`; -1 for unused host slots."""
        if self.per_rail:
            rail, e = tree, host
        elif not self.blocked:
            rail, e = np.divmod(host, self.E)
        else:
            leaf, slot = np.divmod(host, self.H)
            b, rail = np.divmod(leaf, self.R)
            e = b * self.H + slot
        valid = (e < self.E) & (rail < self.R)
        d, g = np.divmod(e, self.per_rail_slot)
        slot = np.where(valid, d * self.G + g * self.R + rail, -1)
        if self._rank_at is None:
            return slot
        return np.where(valid, self._rank_at[np.maximum(slot, 0)], -1)

    def leaf_of(self, ranks: object) -> np.ndarray:
        """Node id of each rank's leaf switch."""
        if self.tree is None:
            raise ValueError(f"{self.name} has no fabric (levels=0)")
        t, h = self._fabric_host(self._ranks(ranks))
        return self.fabric_base + self.node_offset[1] + t * self.tree.n[1] + h // self.tree.M[1]

    def locate(self, ranks: object) -> RankLocation:
        r = self._ranks(ranks)
        leaf = self.leaf_of(r) if self.tree is not None else np.full(r.shape, -1, dtype=np.int64)
        slot = self._slots(r)
        return RankLocation(slot // self.G, slot % self.G, slot % self.G % self.R, leaf,
                            self.nvswitch_base + slot // self.G)

    def domain_groups(self) -> np.ndarray:
        """(domains, gpus_per_domain) ranks: row d is domain d in local slot order, -1 in empty slots."""
        if self._rank_at is None:
            return np.arange(self.world_size, dtype=np.int64).reshape(self.D, self.G)
        return self._rank_at.reshape(self.D, self.G).copy()

    def rail_groups(self) -> np.ndarray:
        """(rails, endpoints per rail) ranks: row j is rail j, in domain order (-1 in empty slots)."""
        ranks = self.domain_groups().reshape(self.D, self.per_rail_slot, self.R)
        return ranks.transpose(2, 0, 1).reshape(self.R, self.E)

    # -- switches ---------------------------------------------------------------------------------------------
    def nvswitches(self) -> np.ndarray:
        return np.arange(self.nvswitch_base, self.nvswitch_base + self.D, dtype=np.int64)

    def _level(self, level: int | str) -> int:
        if isinstance(level, str):
            if level not in self.level_names:
                raise ValueError(f"unknown level {level!r}; levels: {', '.join(self.level_names)}")
            return self.level_names.index(level) + 1
        if not 1 <= level <= self.levels:
            raise ValueError(f"fabric levels are 1..{self.levels}, got {level}")
        return int(level)

    def switches(self, level: int | str, tree: int | None = None) -> np.ndarray:
        """Node ids of the fabric switches of `level` (1 or "leaf", 2 or "spine", ...), all trees or one.

        With a single fat-tree every switch exists; leaves whose ports hold no rank are included (they only
        occur when a rail's endpoints do not fill its last leaf)."""
        lv = self._level(level)
        assert self.tree is not None
        n = self.tree.n[lv]
        base = self.fabric_base + self.node_offset[lv]
        if tree is None:
            return np.arange(base, base + self.trees * n, dtype=np.int64)
        if not 0 <= tree < self.trees:
            raise ValueError(f"tree must be in [0, {self.trees})")
        return np.arange(base + tree * n, base + (tree + 1) * n, dtype=np.int64)

    def switch_counts(self) -> dict[str, int]:
        """Switch nodes per level (per plane): {"nvswitch": D, "leaf": ..., "spine": ..., ...}."""
        out = {"nvswitch": self.D}
        for lv, name in enumerate(self.level_names, start=1):
            out[name] = self.trees * self.tree.n[lv]  # type: ignore[union-attr]
        return out

    def _switch_address(self, node: int) -> tuple[int, int, int]:
        """(level, tree, index within tree) of a fabric switch node."""
        rel = node - self.fabric_base
        if rel < 0 or node >= self.num_nodes:
            raise ValueError(f"node {node} is not a fabric switch")
        lv = int(np.searchsorted(self.node_offset[1:self.levels + 2], rel, side="right"))
        t, i = divmod(rel - self.node_offset[lv], self.tree.n[lv])  # type: ignore[union-attr]
        return lv, t, i

    def node_kind(self, node: int) -> str:
        """"rank", "nvswitch", or the fabric level name ("leaf", "spine", "core", ...)."""
        if 0 <= node < self.world_size:
            return "rank"
        if self.nvswitch_base <= node < self.fabric_base:
            return "nvswitch"
        return LEVEL_NAMES[self._switch_address(node)[0] - 1]

    def switch_level(self, node: int) -> int:
        """Fabric level of a fabric switch node (1 = leaf)."""
        return self._switch_address(node)[0]

    def parent(self, node: int, port: int = 0) -> int:
        """The switch a rank's NIC or a fabric switch's up `port` leads to."""
        if 0 <= node < self.world_size:
            return int(self.leaf_of(np.array([node]))[0])
        lv, t, i = self._switch_address(node)
        assert self.tree is not None
        if lv >= self.levels:
            raise ValueError(f"{self.node_label(node)} is at the top level: no parent")
        if not 0 <= port < self.tree.up[lv]:
            raise ValueError(f"ports of {self.node_label(node)} are 0..{self.tree.up[lv] - 1}")
        idx = int(self.tree.parent(lv + 1, np.int64(i), np.int64(port)))
        return self.fabric_base + self.node_offset[lv + 1] + t * self.tree.n[lv + 1] + idx

    def children(self, node: int) -> np.ndarray:
        """Distinct child nodes of a switch: the ranks of a domain or leaf, or the switches below."""
        if self.nvswitch_base <= node < self.fabric_base:
            row = self.domain_groups()[node - self.nvswitch_base]
            return np.sort(row[row >= 0])
        lv, t, i = self._switch_address(node)
        assert self.tree is not None
        child, _ = self.tree.children(lv, i)
        child = np.unique(child)
        if lv == 1:
            ranks = self._host_rank(np.full(child.shape, t), child)
            return ranks[ranks >= 0]
        return self.fabric_base + self.node_offset[lv - 1] + t * self.tree.n[lv - 1] + child

    def node_label(self, node: int) -> str:
        node = int(node)
        if 0 <= node < self.world_size:
            return f"rank {node}"
        if self.nvswitch_base <= node < self.fabric_base:
            return f"nvswitch[domain {node - self.nvswitch_base}]"
        lv, t, i = self._switch_address(node)
        assert self.tree is not None
        name = LEVEL_NAMES[lv - 1]
        rail = f"rail {t}, " if self.per_rail else ""
        if lv == 1:
            if self.blocked and not self.per_rail:
                b, j = divmod(i, self.R)
                return f"leaf[rail {j}, {b}]"
            return f"leaf[{rail}{i}]"
        X, Y = divmod(i, self.tree.W[lv])
        if lv == self.levels:
            return f"{name}[{rail}{Y}]"
        return f"{name}[{rail}pod {X}, {Y}]"

    def node_labels(self, nodes: object) -> dict[int, str]:
        """{node: node_label(node)} in the order given, each kind of node's labels written by one comprehension
        (the fabric switches' addresses computed at once, level by level)."""
        arr = np.asarray(nodes, dtype=np.int64).ravel()
        is_fabric = arr >= self.fabric_base
        if self.tree is None or not is_fabric.any() or int(arr.max()) >= self.num_nodes:
            return {int(n): self.node_label(int(n)) for n in arr.tolist()}
        labels = np.empty(arr.size, object)
        rank = (arr >= 0) & (arr < self.world_size)
        labels[rank] = _strings([f"rank {n}" for n in arr[rank].tolist()])
        nvswitch = (arr >= self.nvswitch_base) & (arr < self.fabric_base)
        labels[nvswitch] = _strings([f"nvswitch[domain {d}]" for d in (arr[nvswitch] - self.nvswitch_base).tolist()])
        labels[is_fabric] = self._fabric_labels(arr[is_fabric])
        other = np.flatnonzero(~(rank | nvswitch | is_fabric))  # (none from the builders: node_label says)
        labels[other] = _strings([self.node_label(n) for n in arr[other].tolist()])
        return dict(zip(arr.tolist(), labels.tolist(), strict=True))

    def _fabric_labels(self, fab: np.ndarray) -> np.ndarray:
        """node_label of fabric switches `fab` (an object array), level by level."""
        lv, t, i = self._switch_addresses(fab)
        out = np.empty(fab.size, object)
        for level in np.unique(lv).tolist():
            on = lv == level
            idx = i[on].tolist()
            rail = [f"rail {x}, " for x in t[on].tolist()] if self.per_rail else [""] * len(idx)
            name = LEVEL_NAMES[level - 1]
            if level == 1 and self.blocked and not self.per_rail:
                R = self.R
                labels = [f"leaf[rail {x % R}, {x // R}]" for x in idx]
            elif level == 1:
                labels = [f"leaf[{r}{x}]" for r, x in zip(rail, idx, strict=True)]
            elif level == self.levels:
                W = int(self.tree.W[level])
                labels = [f"{name}[{r}{x % W}]" for r, x in zip(rail, idx, strict=True)]
            else:
                W = int(self.tree.W[level])
                labels = [f"{name}[{r}pod {x // W}, {x % W}]" for r, x in zip(rail, idx, strict=True)]
            out[on] = _strings(labels)
        return out

    def _rail(self, rail: int | None) -> int:
        if rail is None or not 0 <= int(rail) < self.R:
            raise ValueError(f"rail must be in [0, {self.R}), got {rail}")
        return int(rail)


    # -- persistence and description ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"kind": "cluster", **self.spec.to_dict()}

    def summary(self) -> dict[str, Any]:
        s = self.spec
        sh = self.sharp
        out: dict[str, Any] = {
            "name": s.name, "gpus": self.world_size, "domains": self.D, "gpus_per_domain": self.G,
            "rails": self.R, "rail_fabric": s.rail_fabric, "domain_sizes": list(self.domain_sizes), "nic_planes": s.nic_planes, "levels": self.levels,
            "switches_per_plane": self.switch_counts(), "nodes": self.num_nodes, "links": self.num_links,
        }
        if sh.enabled:
            out["sharp"] = dataclasses.asdict(sh)
        return out

    def describe(self) -> str:
        s, sh, nv = self.spec, self.sharp, self.nvls
        planes = s.nic_planes
        lines = [f"{s.name}: {s.description}" if s.description else s.name]
        host = f" ({self.G // s.gpus_per_host} hosts of {s.gpus_per_host} GPUs each)" if s.gpus_per_host else ""
        if self.placed:
            sizes = self.domain_sizes
            layout = "+".join(map(str, sizes)) if len(sizes) <= 16 else f"{min(sizes)}..{max(sizes)} per domain"
            lines.append(f"  GPUs            {self.world_size:,} ranks placed in {self.D:,} domains x {self.G} "
                         f"slots{host}: {layout}")
        else:
            lines.append(f"  GPUs            {self.world_size:,} = {self.D:,} domains x {self.G}{host}")
        links = (f" ({s.nvlink_links} links x {s.nvlink_link_bandwidth / 1e9:g} GB/s)"
                 if s.nvlink_links is not None else "")
        lines.append(f"  NVLink          {s.nvlink_bandwidth / 1e9:,.1f} GB/s per GPU per direction{links}, "
                     f"{s.nvlink_latency * 1e6:.2f} us per hop")
        lines.append("  NVLS            " + (f"yes, efficiency {nv.derate:g} (effective "
                                                f"{nv.effective_bandwidth / 1e9:,.0f} GB/s)" if s.nvls else "no"))
        rt = self.runtime
        lines.append("  runtime         " + (rt.describe() if rt is not None else "none (messages cost their links)"))
        if self.tree is None:
            lines.append(f"  host reduction  {_fmt_reduce(s.reduce_bandwidth)}")
            lines.append("  fabric          none")
            return "\n".join(lines)
        eff = f", {s.nic_efficiency:g} payload" if s.nic_efficiency != 1 else ""
        lines.append(f"  NIC             {s.nic_bandwidth * 8 / 1e9:,.0f} Gb/s ({s.nic_bandwidth / 1e9:,.1f} GB/s{eff}) "
                     f"per GPU per direction, {planes} plane(s), {self.R} rails, "
                     f"{s.nic_latency * 1e6:.2f} us")
        lines.append(f"  host reduction  {_fmt_reduce(s.reduce_bandwidth)}")
        ft = self.tree
        kind = "one fat-tree, rail-aligned leaves" if not self.per_rail else f"{self.R} fat-trees, one per rail"
        sw = f", {s.switch}" if s.switch else ""
        lines.append(f"  fabric          {kind}; radix {s.radix}{sw}; {self.levels} level(s); "
                     f"oversubscription {s.oversubscription:g}:1")
        counts = self.switch_counts()
        for lv, name in enumerate(self.level_names, start=1):
            n = counts[name]
            detail = f"{ft.m[lv] * ft.p[lv] if lv > 1 else ft.m[1]} ports down"
            if lv < self.levels:
                detail += f", {ft.up[lv]} up"
            if lv > 1 and ft.p[lv] > 1:
                detail += f" ({ft.p[lv]} cables to each child)"
            total = f" ({n * planes:,} in {planes} planes)" if planes > 1 else ""
            lines.append(f"    {name:<13} {n:>9,} switches{total}: {detail}")
        lines.append(f"  link latency    {s.fabric_latency * 1e6:.2f} us + switch {s.switch_latency * 1e6:.2f} us "
                     "per fabric hop")
        for lv in range(2, self.levels + 1):
            bw = self._block_bw[2 + 2 * (lv - 1)]
            lines.append(f"  {FABRIC_TIERS[lv - 1]:<15} {bw / 1e9:,.1f} GB/s per link per direction")
        if sh.enabled:
            flows = "unlimited" if sh.max_sat_flows is None else str(sh.max_sat_flows)
            lines.append(f"  SHARP           {sh.generation} ({sh.switch}): {sh.llt_trees} LLT + {sh.sat_trees} SAT "
                         f"trees per subnet, one active SAT tree per {sh.sat_scope}, SAT flows {flows}")
            lines.append(f"                  OST {sh.ost_size} B x quota {sh.ost_quota}, SAT threshold "
                         f"{sh.sat_threshold} B, min {sh.min_nodes} nodes, accumulate in {sh.accumulator}, "
                         f"results by {'multicast' if sh.multicast else 'unicast'}")
            lines.append(f"                  ops {', '.join(sorted(('sum', 'min', 'max')))}; dtypes "
                         f"{', '.join(sorted(sh.dtypes))}")
        else:
            lines.append("  SHARP           none")
        return "\n".join(lines)


def cluster(domains: int | None = None, gpus_per_domain: int | None = None, *,
            domain_sizes: Sequence[int] | None = None, **params: Any) -> Cluster:
    """Build any cluster: `domains` scale-up domains of `gpus_per_domain` GPUs on a rail-aligned fat-tree.

    Uneven or scattered domains: `domain_sizes=(3, 2)` (consecutive ranks, domains of 3 and 2) or
    `placement=[[0, 2, 4], [1, 3, 5]]` (each domain's ranks, round-robin here); `domains` then defaults to the
    number of domains and `gpus_per_domain` to the largest. Defaults otherwise: 1 domain of 8 GPUs.
    Every other parameter is a `ClusterSpec` field (nic_bandwidth, nvlink_bandwidth, radix, levels,
    oversubscription, rail_fabric, sharp, ...); unknown names raise ValueError listing the valid ones.
    """
    check_names(params, ClusterSpec.fields(), "cluster")
    if isinstance(params.get("fabric_bandwidth"), list):
        params["fabric_bandwidth"] = tuple(params["fabric_bandwidth"])
    if domain_sizes is not None:
        if params.get("placement") is not None:
            raise ValueError("give domain_sizes= or placement=, not both")
        sizes = [int(n) for n in domain_sizes]
        if not sizes or min(sizes) < 1:
            raise ValueError(f"domain_sizes must be positive rank counts, one per domain, got {domain_sizes!r}")
        starts = np.cumsum([0] + sizes)
        params["placement"] = [list(range(a, b)) for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(),
                                                                      strict=True)]
    rows = params.get("placement")
    if rows is not None:
        domains = len(rows) if domains is None else domains
        gpus_per_domain = max((len(row) for row in rows), default=1) if gpus_per_domain is None else gpus_per_domain
    return Cluster(ClusterSpec(domains=1 if domains is None else domains,
                               gpus_per_domain=8 if gpus_per_domain is None else gpus_per_domain, **params))


__all__ = ["Cluster", "ClusterSpec", "RankLocation", "SharpLevel", "SharpTree", "check_names", "cluster"]
