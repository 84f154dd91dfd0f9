"""The interface every topology offers the schedule builders and the simulators, and the `fully_connected` one.

Conventions shared by all topologies:

- nodes: ranks are 0..world_size-1; switch nodes (if any) follow, with stable ids and labels;
- links are directed and numbered 0..num_links-1; every attribute lookup is vectorized over link ids;
- `path_links(src, dst)` returns an (F, max_hops) int64 array of the links each flow crosses, in order,
  padded with -1; src == dst gives an empty path;
- a link's latency includes the forwarding latency of the switch it enters, so a path's latency is the sum of
  its links' latencies;
- units are SI: seconds, bytes, bytes per second (per direction).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from .capabilities import NvlsSpec, SharpSpec, dtype_name

# Link tiers, with stable codes (index in this tuple) across topologies, so per-tier byte counts compare.
TIERS: tuple[str, ...] = ("nvlink", "nic", "leaf-spine", "spine-core", "fabric-l4", "fabric-l5", "fabric-l6",
                          "direct")
TIER_CODE: dict[str, int] = {name: code for code, name in enumerate(TIERS)}


def floor_divmod(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """np.divmod(x, k) of an integer array by a positive int, the same arrays: numpy divides by a scalar
    quickly (libdivide) but its divmod and remainder do not, so the remainder is x - (x // k) * k."""
    q = x // k
    return q, x - q * k


def as_index_array(x: object, name: str = "ids") -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        if arr.size == 0:
            return arr.astype(np.int64)
        raise TypeError(f"{name} must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


class Topology(ABC):
    """Ranks, switch nodes and directed links, with vectorized routing and link attributes."""

    name: str
    world_size: int
    num_nodes: int
    num_links: int
    max_hops: int
    reduce_bandwidth: float | dict[str, float]

    # -- routing ------------------------------------------------------------------------------------------
    @abstractmethod
    def path_links(self, src: object, dst: object) -> np.ndarray:
        """(F, max_hops) link ids of each flow src[f] -> dst[f] in traversal order, padded with -1."""

    @abstractmethod
    def link_bandwidth(self, links: object) -> np.ndarray:
        """Bandwidth (bytes/s, one direction) of each link."""

    @abstractmethod
    def link_latency(self, links: object) -> np.ndarray:
        """Latency (s) of each link, including the switch it enters."""

    @abstractmethod
    def link_tier(self, links: object) -> np.ndarray:
        """Tier code of each link: an index into `TIERS`."""

    @abstractmethod
    def link_endpoints(self, links: object) -> tuple[np.ndarray, np.ndarray]:
        """(source node, destination node) of each link (-1 for an unused port of the fabric)."""

    @abstractmethod
    def node_label(self, node: int) -> str:
        """A readable name: "rank 5", "nvswitch[domain 3]", "leaf[rail 2, 17]", ..."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """Parameters from which `collectives.topology.from_dict` rebuilds this topology."""

    @abstractmethod
    def describe(self) -> str:
        """A multi-line human summary (what `collectives topo` prints)."""

    @property
    def nvls(self) -> NvlsSpec | None:
        return None

    @property
    def sharp(self) -> SharpSpec | None:
        return None

    @property
    def tiers(self) -> tuple[str, ...]:
        return TIERS

    # -- derived, shared -------------------------------------------------------------------------------------
    def path_latency(self, src: object, dst: object) -> np.ndarray:
        """Sum of link latencies along each flow's path (0 for src == dst)."""
        links = self.path_links(src, dst)
        lat = np.zeros(links.shape, dtype=np.float64)
        on = links >= 0
        lat[on] = self.link_latency(links[on])
        return lat.sum(axis=1)

    def path_bandwidth(self, src: object, dst: object) -> np.ndarray:
        """Slowest link along each flow's path (inf for src == dst)."""
        links = self.path_links(src, dst)
        bw = np.full(links.shape, np.inf)
        on = links >= 0
        bw[on] = self.link_bandwidth(links[on])
        return bw.min(axis=1)

    def link_loads(self, src: object, dst: object, nbytes: object) -> np.ndarray:
        """Bytes each link carries when every flow src[f] -> dst[f] moves nbytes[f]: (num_links,) float64."""
        links = self.path_links(src, dst)
        weights = np.broadcast_to(np.asarray(nbytes, dtype=np.float64).reshape(-1, 1) if np.ndim(nbytes)
                                  else np.float64(nbytes), links.shape)
        on = links >= 0
        return np.bincount(links[on], weights=weights[on], minlength=self.num_links)

    def link_label(self, link: int) -> str:
        a, b = self.link_endpoints(np.array([link]))
        tier = TIERS[int(self.link_tier(np.array([link]))[0])]
        return f"{tier} link {link}: {self.node_label(int(a[0]))} -> {self.node_label(int(b[0]))}"

    def reduce_throughput(self, dtype: object = "float32") -> float:
        """Host (GPU kernel) reduction throughput in bytes/s for `dtype`.

        `reduce_bandwidth` is one number for every dtype or a dict by dtype name ("default" as fallback).
        """
        rb = self.reduce_bandwidth
        if isinstance(rb, dict):
            name = dtype_name(dtype)
            if name in rb:
                return float(rb[name])
            if "default" in rb:
                return float(rb["default"])
            raise KeyError(f"no reduction throughput for dtype {name!r} (known: {', '.join(sorted(rb))})")
        return float(rb)

    def tier_of(self, name: str) -> int:
        if name not in TIER_CODE:
            raise ValueError(f"unknown tier {name!r}; tiers: {', '.join(TIERS)}")
        return TIER_CODE[name]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}: {self.world_size} ranks, {self.num_nodes} nodes>"


class FullyConnected(Topology):
    """n ranks, every ordered pair joined by its own link (latency a, bandwidth B); no switches.

    Link src -> dst has id src * n + dst. For the closed forms of models.md (Hockney alpha-beta-gamma):
    alpha = `latency`, beta = 1 / `bandwidth`, gamma = 1 / `reduce_bandwidth`.
    """

    max_hops = 1

    def __init__(self, n: int, latency: float = 1e-6, bandwidth: float = 10e9,
                 reduce_bandwidth: float | dict[str, float] = 10e9, name: str = "fully-connected") -> None:
        if int(n) < 1:
            raise ValueError(f"a topology needs at least one rank, got n={n}")
        if latency < 0 or bandwidth <= 0:
            raise ValueError("latency must be >= 0 and bandwidth > 0")
        self.name = name
        self.world_size = self.num_nodes = int(n)
        self.num_links = self.world_size ** 2
        self.latency = float(latency)
        self.bandwidth = float(bandwidth)
        self.reduce_bandwidth = reduce_bandwidth

    def _check(self, links: object) -> np.ndarray:
        ids = as_index_array(links, "links")
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_links):
            raise ValueError(f"link ids must be in [0, {self.num_links})")
        return ids

    def path_links(self, src: object, dst: object) -> np.ndarray:
        s, d = np.broadcast_arrays(as_index_array(src, "src"), as_index_array(dst, "dst"))
        s, d = s.ravel(), d.ravel()
        n = self.world_size
        if s.size and (min(s.min(), d.min()) < 0 or max(s.max(), d.max()) >= n):
            raise ValueError(f"nodes must be in [0, {n})")
        return np.where(s == d, -1, s * n + d).reshape(-1, 1)

    def link_bandwidth(self, links: object) -> np.ndarray:
        return np.full(self._check(links).shape, self.bandwidth)

    def link_latency(self, links: object) -> np.ndarray:
        return np.full(self._check(links).shape, self.latency)

    def link_tier(self, links: object) -> np.ndarray:
        return np.full(self._check(links).shape, TIER_CODE["direct"], dtype=np.int8)

    def link_endpoints(self, links: object) -> tuple[np.ndarray, np.ndarray]:
        return np.divmod(self._check(links), self.world_size)

    def node_label(self, node: int) -> str:
        return f"rank {node}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "fully_connected", "n": self.world_size, "latency": self.latency,
                "bandwidth": self.bandwidth, "reduce_bandwidth": self.reduce_bandwidth, "name": self.name}

    def describe(self) -> str:
        return (f"{self.name}: {self.world_size} ranks, every pair on a dedicated link\n"
                f"  link: latency {self.latency * 1e6:.3f} us, bandwidth {self.bandwidth / 1e9:.3f} GB/s\n"
                f"  reduction: {_fmt_reduce(self.reduce_bandwidth)}")


def _fmt_reduce(rb: float | dict[str, float]) -> str:
    if isinstance(rb, dict):
        return ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in rb.items())
    return f"{rb / 1e9:.1f} GB/s"


def fully_connected(n: int, latency: float = 1e-6, bandwidth: float = 10e9,
                    reduce_bandwidth: float | dict[str, float] = 10e9) -> FullyConnected:
    """n ranks, each ordered pair on a dedicated link of `latency` (s) and `bandwidth` (bytes/s); reduction
    throughput `reduce_bandwidth` (bytes/s). The topology of models.md's closed forms."""
    return FullyConnected(n, latency=latency, bandwidth=bandwidth, reduce_bandwidth=reduce_bandwidth)


__all__ = ["TIERS", "TIER_CODE", "FullyConnected", "Topology", "fully_connected"]
