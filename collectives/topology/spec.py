"""ClusterSpec: every parameter of a cluster, checked on construction (the model is in cluster.py's docstring)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .capabilities import SHARP_GENERATIONS
from .runtime import GENERATIONS, RUNTIMES

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
    # which GPU slot each rank occupies: row d lists domain d's ranks in local slot order (fewer than
    # gpus_per_domain leaves the domain's last slots empty); None: rank r in slot r (equal, consecutive domains)
    placement: tuple[tuple[int, ...], ...] | None = None
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
        if self.placement is not None:
            object.__setattr__(self, "placement", check_placement(self.placement, self.domains,
                                                                  self.gpus_per_domain))
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
        if d["placement"] is None:
            del d["placement"]  # the equal, consecutive layout: saved files stay as they were
        else:
            d["placement"] = [list(row) for row in d["placement"]]
        return d


def check_placement(placement: Any, domains: int, gpus_per_domain: int) -> tuple[tuple[int, ...], ...] | None:
    """`placement` as a tuple of rows (domain d's ranks, local slot order), checked: `domains` non-empty rows of
    at most `gpus_per_domain` ranks, every rank 0..N-1 exactly once. None when it is the default layout (rank r
    in slot r of full domains), so equal, consecutive clusters keep their fast arithmetic path."""
    try:
        rows = tuple(tuple(int(r) for r in row) for row in placement)
    except (TypeError, ValueError):
        raise ValueError(f"placement must be a list of rank lists, one per domain, got {placement!r}") from None
    sizes = [len(row) for row in rows]
    if len(rows) != domains:
        raise ValueError(f"placement has {len(rows)} domain(s) but the cluster has domains={domains}")
    if min(sizes, default=0) < 1 or max(sizes, default=0) > gpus_per_domain:
        raise ValueError(f"placement's domains hold {'+'.join(map(str, sizes))} ranks; each must hold 1.."
                         f"{gpus_per_domain} (gpus_per_domain)")
    flat = sorted(r for row in rows for r in row)
    if flat != list(range(len(flat))):
        raise ValueError(f"placement must name every rank 0..{len(flat) - 1} exactly once, got {rows!r}")
    if all(size == gpus_per_domain for size in sizes) and flat == [r for row in rows for r in row]:
        return None
    return rows


def check_names(given: dict[str, Any] | Any, valid: tuple[str, ...] | list[str], what: str) -> None:
    unknown = [k for k in given if k not in valid]
    if unknown:
        raise ValueError(f"unknown {what} parameter(s) {', '.join(map(repr, unknown))}; "
                         f"valid: {', '.join(sorted(valid))}")


__all__ = ["FABRIC_TIERS", "LEVEL_NAMES", "RAIL_FABRICS", "ClusterSpec", "check_names", "check_placement"]
