"""A GPU cluster: scale-up domains (NVLink + a switch that may reduce: NVLS) joined by a rail-aligned fat-tree.

The model (what the schedule builders and the simulators may rely on):

- **Ranks.** Rank r is GPU `local = r % G` of domain `r // G` (G = gpus_per_domain). Its NIC sits on rail
  `local % R` (R = rails, default G: GPU j of every domain on rail j).
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

Nothing here is per GPU: construction is arithmetic, and every query is vectorized over numpy arrays.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .base import TIER_CODE, Topology, _fmt_reduce, as_index_array
from .capabilities import SHARP_GENERATIONS, NvlsSpec, SharpSpec, nvls_derate
from .fattree import FatTree
from .runtime import GENERATIONS, NVLS_CHANNELS, RUNTIMES, NcclRuntime, default_ring_channels

LEVEL_NAMES = ("leaf", "spine", "core", "l4", "l5", "l6")
FABRIC_TIERS = ("nic", "leaf-spine", "spine-core", "fabric-l4", "fabric-l5", "fabric-l6")
RAIL_FABRICS = ("single", "per-rail")


@dataclass(frozen=True)
class ClusterSpec:
    """Every parameter of a cluster (SI units: bytes/s per direction, seconds). See the module docstring."""

    name: str = "cluster"
    description: str = ""
    # scale-up domains
    domains: int = 1
    gpus_per_domain: int = 8
    gpus_per_host: int | None = None  # informational: GPUs per VM / compute tray
    # per GPU per direction; with nvlink_links and nvlink_link_bandwidth it must be their product (NCCL's
    # application-level figure: links x per-link bandwidth, src/graph/topo.h SM90_NVLINK_BW / SM100_NVLINK_BW)
    nvlink_bandwidth: float = 450e9
    nvlink_links: int | None = None
    nvlink_link_bandwidth: float | None = None
    nvlink_latency: float = 0.5e-6
    nvls: bool = True
    # NCCL's NVLS efficiency (src/graph/tuning.cc nvlsEfficiency); None: by generation and domain size
    # (capabilities.nvls_derate)
    nvls_derate: float | None = None
    # NICs
    nic_bandwidth: float = 50e9
    nic_efficiency: float = 1.0  # payload bytes per wire byte (packet headers per MTU)
    nic_latency: float = 1.0e-6
    nic_planes: int = 1
    rails: int | None = None  # default: gpus_per_domain
    # fat-tree
    rail_fabric: str = "single"
    radix: int = 64
    levels: int | None = None  # None: fewest that fit; 0: no fabric (one domain only)
    oversubscription: float = 1.0  # leaf down:up port ratio
    fabric_bandwidth: float | tuple[float, ...] | None = None  # per port per plane, per level >= 2
    fabric_latency: float = 0.1e-6
    switch_latency: float = 0.2e-6
    switch: str = ""  # informational: switch model
    # SHARP (None for generation defaults, see capabilities.SHARP_GENERATIONS)
    sharp: str | None = "v3"
    sharp_llt_trees: int | None = None
    sharp_sat_trees: int | None = None
    sharp_sat_scope: str | None = None
    sharp_max_sat_flows: int | None = None
    sharp_ost_size: int | None = None
    sharp_ost_quota: int = 64  # SHARP_COLL_JOB_QUOTA_OSTS: not in hardware.md, a parameter
    sharp_sat_threshold: int = 16384  # SHARP_COLL_SAT_THRESHOLD (bytes): not in hardware.md, a parameter
    sharp_min_nodes: int = 2  # NCCL: below 2 nodes the collective uses host algorithms
    sharp_accumulator: str = "float32"
    sharp_sat_efficiency: float = 0.95  # SAT runs near link rate (~95%), hardware.md
    sharp_multicast: bool = True
    # host (GPU kernel) reduction throughput, bytes/s: one number or {dtype name: bytes/s, "default": ...}
    reduce_bandwidth: float | dict[str, float] = 1.0e12
    # how collectives run: "nccl" (protocols, channels, NCCL's latencies and chunking: topology/runtime.py) or
    # None (messages cost only their links: a host executor)
    runtime: str | None = None
    gpu: str | None = None  # GPU generation for NCCL's constants: "hopper" or "blackwell"
    channels: int | None = None  # ring/tree channels; None: NCCL's default (runtime.default_ring_channels)
    nvls_channels: int | None = None  # None: NCCL's default by generation (runtime.NVLS_CHANNELS)

    def __post_init__(self) -> None:
        def positive_int(field: str, value: object, minimum: int = 1) -> None:
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}")

        def positive(field: str, value: object, allow_zero: bool = False) -> None:
            if not isinstance(value, (int, float, np.number)) or isinstance(value, bool) or \
                    not (value >= 0 if allow_zero else value > 0) or not math.isfinite(value):
                raise ValueError(f"{field} must be a {'non-negative' if allow_zero else 'positive'} number, "
                                 f"got {value!r}")

        positive_int("domains", self.domains)
        positive_int("gpus_per_domain", self.gpus_per_domain)
        if self.gpus_per_host is not None:
            positive_int("gpus_per_host", self.gpus_per_host)
        positive_int("nic_planes", self.nic_planes)
        positive_int("radix", self.radix, 2)
        if self.radix % 2:
            raise ValueError(f"radix must be even, got {self.radix}")
        rails = self.gpus_per_domain if self.rails is None else self.rails
        positive_int("rails", rails)
        if self.gpus_per_domain % rails:
            raise ValueError(f"rails ({rails}) must divide gpus_per_domain ({self.gpus_per_domain})")
        if self.rail_fabric not in RAIL_FABRICS:
            raise ValueError(f"rail_fabric must be one of {', '.join(RAIL_FABRICS)}, got {self.rail_fabric!r}")
        if self.levels is not None:
            positive_int("levels", self.levels, 0)
            if self.levels == 0 and self.domains > 1:
                raise ValueError("levels=0 (no fabric) needs a single domain")
        positive("oversubscription", self.oversubscription)
        if self.oversubscription < 1:
            raise ValueError(f"oversubscription is the leaf's down:up ratio and must be >= 1, "
                             f"got {self.oversubscription}")
        for f in ("nvlink_bandwidth", "nic_bandwidth", "sharp_sat_efficiency"):
            positive(f, getattr(self, f))
        for f in ("nvlink_latency", "nic_latency", "fabric_latency", "switch_latency"):
            positive(f, getattr(self, f), allow_zero=True)
        for f in ("nvls_derate", "nic_efficiency"):
            value = getattr(self, f)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float, np.number))
                                      or not 0 < value <= 1):
                raise ValueError(f"{f} must be in (0, 1], got {value!r}")
        if (self.nvlink_links is None) != (self.nvlink_link_bandwidth is None):
            raise ValueError("give nvlink_links and nvlink_link_bandwidth together (NVLink bandwidth = links x "
                             f"per-link bandwidth), got nvlink_links={self.nvlink_links!r}, "
                             f"nvlink_link_bandwidth={self.nvlink_link_bandwidth!r}")
        if self.nvlink_links is not None:
            positive_int("nvlink_links", self.nvlink_links)
            positive("nvlink_link_bandwidth", self.nvlink_link_bandwidth)
            product = self.nvlink_links * self.nvlink_link_bandwidth
            if not math.isclose(product, self.nvlink_bandwidth, rel_tol=1e-9):
                raise ValueError(f"nvlink_bandwidth ({self.nvlink_bandwidth:g}) must be nvlink_links x "
                                 f"nvlink_link_bandwidth ({self.nvlink_links} x {self.nvlink_link_bandwidth:g} = "
                                 f"{product:g}); preset() recomputes nvlink_bandwidth when only the links change")
        if self.runtime is not None and self.runtime not in RUNTIMES:
            raise ValueError(f"runtime must be None or one of {', '.join(RUNTIMES)}, got {self.runtime!r}")
        if self.gpu is not None and self.gpu not in GENERATIONS:
            raise ValueError(f"gpu must be None or one of {', '.join(GENERATIONS)}, got {self.gpu!r}")
        for f in ("channels", "nvls_channels"):
            if getattr(self, f) is not None:
                positive_int(f, getattr(self, f))
        if self.fabric_bandwidth is not None:
            values = self.fabric_bandwidth if isinstance(self.fabric_bandwidth, (list, tuple)) else \
                [self.fabric_bandwidth]
            for v in values:
                positive("fabric_bandwidth", v)
        if self.sharp is not None and self.sharp not in SHARP_GENERATIONS:
            raise ValueError(f"sharp must be None or one of {', '.join(SHARP_GENERATIONS)}, got {self.sharp!r}")
        if self.sharp_sat_scope not in (None, "switch", "port"):
            raise ValueError(f"sharp_sat_scope must be 'switch' or 'port', got {self.sharp_sat_scope!r}")
        if self.sharp_accumulator not in ("float32", "input"):
            raise ValueError(f"sharp_accumulator must be 'float32' or 'input', got {self.sharp_accumulator!r}")
        for f in ("sharp_ost_quota", "sharp_min_nodes"):
            positive_int(f, getattr(self, f))
        positive_int("sharp_sat_threshold", self.sharp_sat_threshold, 0)
        rb = self.reduce_bandwidth
        for v in (rb.values() if isinstance(rb, dict) else [rb]):
            positive("reduce_bandwidth", v)
        if self.leaf_down < 1 or self.leaf_down >= self.radix:
            raise ValueError(f"oversubscription {self.oversubscription} leaves {self.leaf_down} host ports on "
                             f"a radix-{self.radix} leaf")

    @property
    def num_rails(self) -> int:
        return self.gpus_per_domain if self.rails is None else int(self.rails)

    @property
    def leaf_down(self) -> int:
        """Host ports of a leaf: radix * o / (o + 1) for oversubscription o (k/2 when non-blocking)."""
        return int(round(self.radix * self.oversubscription / (self.oversubscription + 1)))

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def replace(self, **changes: Any) -> ClusterSpec:
        check_names(changes, self.fields(), "cluster")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if isinstance(d["fabric_bandwidth"], tuple):
            d["fabric_bandwidth"] = list(d["fabric_bandwidth"])
        return d


def check_names(given: dict[str, Any] | Any, valid: tuple[str, ...] | list[str], what: str) -> None:
    unknown = [k for k in given if k not in valid]
    if unknown:
        raise ValueError(f"unknown {what} parameter(s) {', '.join(map(repr, unknown))}; "
                         f"valid: {', '.join(sorted(valid))}")


class RankLocation(NamedTuple):
    """Where ranks sit (arrays, one entry per rank asked about)."""

    domain: np.ndarray
    local: np.ndarray  # GPU index inside the domain
    rail: np.ndarray
    leaf: np.ndarray  # node id of the leaf switch (-1 without a fabric)
    nvswitch: np.ndarray  # node id of the domain's switch


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


def _sorted_unique(x: np.ndarray) -> np.ndarray:
    """np.unique by sorting (numpy's hash-based unique is slow on large int arrays)."""
    x = np.sort(x)
    return x[np.concatenate(([True], x[1:] != x[:-1]))] if x.size else x


def _grouped(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique keys (sorted) and a (K, max count) array of their values, -1 padded; value order preserved."""
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


class Cluster(Topology):
    """A cluster built from a `ClusterSpec` (see the module docstring for the model)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = s = spec
        self.name = s.name
        G, R, D = s.gpus_per_domain, s.num_rails, s.domains
        self.G, self.R, self.D = G, R, D
        self.world_size = N = D * G
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

    def rank_domain(self, ranks: object) -> np.ndarray:
        return self._ranks(ranks) // self.G

    def rank_local(self, ranks: object) -> np.ndarray:
        return self._ranks(ranks) % self.G

    def rank_rail(self, ranks: object) -> np.ndarray:
        return self._ranks(ranks) % self.G % self.R

    def nvswitch_of(self, ranks: object) -> np.ndarray:
        """Node id of each rank's domain switch."""
        return self.nvswitch_base + self.rank_domain(ranks)

    def _fabric_host(self, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tree, host slot) of ranks' NICs."""
        d, j = np.divmod(r, self.G)
        g, rail = np.divmod(j, self.R)
        e = d * self.per_rail_slot + g  # endpoint index within the rail
        if self.per_rail:
            return rail, e
        if not self.blocked:
            return np.zeros_like(r), rail * self.E + e
        b, slot = np.divmod(e, self.H)
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
        return np.where(valid, d * self.G + g * self.R + rail, -1)

    def leaf_of(self, ranks: object) -> np.ndarray:
        """Node id of each rank's leaf switch."""
        if self.tree is None:
            raise ValueError(f"{self.name} has no fabric (levels=0)")
        t, h = self._fabric_host(self._ranks(ranks))
        return self.fabric_base + self.node_offset[1] + t * self.tree.n[1] + h // self.tree.M[1]

    def locate(self, ranks: object) -> RankLocation:
        r = self._ranks(ranks)
        leaf = self.leaf_of(r) if self.tree is not None else np.full(r.shape, -1, dtype=np.int64)
        return RankLocation(r // self.G, r % self.G, r % self.G % self.R, leaf, self.nvswitch_base + r // self.G)

    def domain_groups(self) -> np.ndarray:
        """(domains, gpus_per_domain) ranks: row d is domain d."""
        return np.arange(self.world_size, dtype=np.int64).reshape(self.D, self.G)

    def rail_groups(self) -> np.ndarray:
        """(rails, endpoints per rail) ranks: row j is rail j, in domain order."""
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
            d = node - self.nvswitch_base
            return np.arange(d * self.G, (d + 1) * self.G, dtype=np.int64)
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
        """{node: node_label(node)}, with the fabric switches' addresses computed at once."""
        arr = np.asarray(nodes, dtype=np.int64).ravel()
        fab = arr[arr >= self.fabric_base]
        if self.tree is None or fab.size == 0 or int(fab.max()) >= self.num_nodes:
            return {int(n): self.node_label(int(n)) for n in arr.tolist()}
        out: dict[int, str] = {}
        lv, t, i = self._switch_addresses(fab)
        W = np.asarray(self.tree.W, np.int64)
        X, Y = np.divmod(i, W[lv])
        leaf_split = self.blocked and not self.per_rail
        for n, l_, t_, i_, x, y in zip(fab.tolist(), lv.tolist(), t.tolist(), i.tolist(), X.tolist(), Y.tolist(),
                                       strict=True):
            rail = f"rail {t_}, " if self.per_rail else ""
            if l_ == 1:
                if leaf_split:
                    b, j = divmod(i_, self.R)
                    out[n] = f"leaf[rail {j}, {b}]"
                else:
                    out[n] = f"leaf[{rail}{i_}]"
            elif l_ == self.levels:
                out[n] = f"{LEVEL_NAMES[l_ - 1]}[{rail}{y}]"
            else:
                out[n] = f"{LEVEL_NAMES[l_ - 1]}[{rail}pod {x}, {y}]"
        return {n: out[n] if n in out else self.node_label(n) for n in arr.tolist()}  # in the order given

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
                lower, upper = off, self.nvswitch_base + off // self.G
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
        for a, b, down in ((s, d, False), (d, s, True)):  # a: the lower end, b: the upper end
            lower_rank = (a >= 0) & (a < N)
            # rank <-> its domain switch
            m = lower_rank & (b == self.nvswitch_base + np.where(lower_rank, a, 0) // self.G)
            out[m] = (a[m] + (N if down else 0))
            if self.tree is None:
                continue
            # rank <-> its leaf
            m = lower_rank & (b >= self.fabric_base) & (out < 0)
            if m.any():
                t, h = self._fabric_host(a[m])
                leaf = self.fabric_base + self.node_offset[1] + t * self.tree.n[1] + h // self.tree.M[1]
                ok = leaf == b[m]
                idx = np.flatnonzero(m)[ok]
                out[idx] = self._cable_link(1, t[ok], h[ok], down)
            # switch <-> parent switch
            m = (a >= self.fabric_base) & (b >= self.fabric_base) & (out < 0)
            if m.any():
                f = np.flatnonzero(m)
                out[f] = self._switch_uplinks(a[f], b[f], down)
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
        sd, dd = s // self.G, d // self.G
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
        sd, dd = s // self.G, d // self.G
        intra = np.flatnonzero(both & (sd == dd) & (s != d))
        inter = np.flatnonzero(both & (sd != dd))
        count = np.zeros(F, np.int64)
        count[other] = 1
        count[intra] = 2
        cols = None
        if inter.size:
            if self.tree is None:
                raise ValueError(f"{self.name} has no fabric between domains")
            cols = self._fabric_cols(s[inter], d[inter])
            count[inter] = (cols >= 0).sum(axis=1)
        offs = np.cumsum(count) - count
        hl = np.empty(int(count.sum()), np.int64)
        if other.size:
            hl[offs[other]] = self.link_between(s[other], d[other])
        if intra.size:
            hl[offs[intra]] = s[intra]
            hl[offs[intra] + 1] = N + d[intra]
        if cols is not None:
            r, c = np.nonzero(cols >= 0)
            row_first = np.cumsum(count[inter]) - count[inter]
            hl[offs[inter][r] + (np.arange(r.size) - row_first[r])] = cols[r, c]
        return np.repeat(np.arange(F, dtype=np.int64), count), hl

    def link_attributes(self, links: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(link_bandwidth, link_latency, link_tier) of `links` in one lookup."""
        blk = self._block(links)[1]
        return self._block_bw[blk], self._block_lat[blk], self._block_tier[blk]

    def _fabric_paths(self, s: np.ndarray, d: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
        out[rows] = self._fabric_cols(s, d)

    def _fabric_cols(self, s: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Fabric paths of rank flows s -> d in different domains: (flows, max_hops) links, -1 padded."""
        assert self.tree is not None
        N, L = self.world_size, self.levels
        cols = np.full((s.size, self.max_hops), -1, dtype=np.int64)
        first = np.zeros(s.size, dtype=np.int64)
        if self.per_rail:
            rs, rd = s % self.G % self.R, d % self.G % self.R
            pxn = rs != rd
            proxy = np.where(pxn, s - rs + rd, s)
            cols[pxn, 0] = s[pxn]
            cols[pxn, 1] = N + proxy[pxn]
            s = proxy
            first = 2 * pxn
        ts, hs = self._fabric_host(s)
        td, hd = self._fabric_host(d)
        assert np.array_equal(ts, td), "a flow between fabric trees needs a PXN hop"
        a, up, down = self.tree.route(hs, hd)
        # in order: up cables of levels 1..a, then down cables of levels a..1 (no gaps)
        for lv in range(1, L + 1):
            on = np.flatnonzero(up[:, lv - 1] >= 0)
            cols[on, first[on] + lv - 1] = self._cable_link(lv, ts[on], up[on, lv - 1], False)
            cols[on, first[on] + 2 * a[on] - lv] = self._cable_link(lv, td[on], down[on, lv - 1], True)
        return cols

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
            "rails": self.R, "rail_fabric": s.rail_fabric, "nic_planes": s.nic_planes, "levels": self.levels,
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


def cluster(domains: int = 1, gpus_per_domain: int = 8, **params: Any) -> Cluster:
    """Build any cluster: `domains` scale-up domains of `gpus_per_domain` GPUs on a rail-aligned fat-tree.

    Every other parameter is a `ClusterSpec` field (nic_bandwidth, nvlink_bandwidth, radix, levels,
    oversubscription, rail_fabric, sharp, ...); unknown names raise ValueError listing the valid ones.
    """
    check_names(params, ClusterSpec.fields(), "cluster")
    if isinstance(params.get("fabric_bandwidth"), list):
        params["fabric_bandwidth"] = tuple(params["fabric_bandwidth"])
    return Cluster(ClusterSpec(domains=domains, gpus_per_domain=gpus_per_domain, **params))


__all__ = ["Cluster", "ClusterSpec", "RankLocation", "SharpLevel", "SharpTree", "check_names", "cluster"]
