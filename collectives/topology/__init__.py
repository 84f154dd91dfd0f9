"""Cluster topologies: where ranks sit, which switches can reduce, and which links each flow crosses.

A `Cluster` is GPUs (ranks) in scale-up domains whose switch may reduce and multicast (NVLS), each GPU's NIC on
a rail of a fat-tree whose switches may aggregate (SHARP). Ranks are nodes 0..N-1; the domain switches and the
fat-tree switches are nodes after them, with stable ids and labels, so schedule builders can give them
programs. Links are directed and numbered; `path_links`, `link_bandwidth`, `link_latency`, `link_tier` and
`link_endpoints` are vectorized over numpy arrays, so the analytic simulator can map a whole round of a
331,776-GPU schedule to link loads with one `np.bincount`. Nothing is stored per GPU: a full-size preset
builds in microseconds.

- cluster.py: the model (read its docstring first), `cluster(...)`, `sharp_tree(...)`;
- fattree.py: the fat-tree wiring and destination-mod-k routing;
- capabilities.py: what NVLS and SHARP offload, and the SHARP limits by generation;
- base.py: the `Topology` interface, link tiers, and `fully_connected` (the closed-form topology);
- presets.py: `preset(name, **overrides)`, `presets()`, `save`/`load` (JSON) and the loopback calibration file.
"""

from .base import TIER_CODE, TIERS, FullyConnected, Topology, fully_connected
from .capabilities import NVLS_OPS, SHARP_GENERATIONS, NvlsSpec, SharpSpec
from .cluster import Cluster, ClusterSpec, RankLocation, SharpLevel, SharpTree, cluster
from .fattree import FatTree
from .presets import (
    ENV_CALIBRATION,
    calibration_path,
    from_dict,
    load,
    preset,
    preset_parameters,
    presets,
    save,
)

__all__ = [
    "ENV_CALIBRATION", "NVLS_OPS", "SHARP_GENERATIONS", "TIERS", "TIER_CODE", "Cluster", "ClusterSpec", "FatTree",
    "FullyConnected", "NvlsSpec", "RankLocation", "SharpLevel", "SharpSpec", "SharpTree", "Topology",
    "calibration_path", "cluster", "from_dict", "fully_connected", "load", "preset", "preset_parameters",
    "presets", "save",
]
