"""Named clusters with their sources, and JSON persistence (save/load, the loopback calibration file).

Every number below comes from ../shared/reference/hardware.md (which names the public source of each fact);
numbers hardware.md leaves open are parameters, and the comment says so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import environment
from .base import FullyConnected, Topology
from .cluster import Cluster, ClusterSpec, check_names, cluster

GBIT = 1e9 / 8  # bytes/s in one Gb/s

# Latencies are not in hardware.md as wire figures; these are model defaults (parameters):
# NVLink hop GPU <-> NVSwitch 0.5 us; NIC 1 us per end; cable 0.1 us; switch port-to-port 0.2 us
# (hardware.md: "no authoritative figure; secondary sources give 130-400 ns. A parameter").
_LATENCIES = dict(nvlink_latency=0.5e-6, nic_latency=1.0e-6, fabric_latency=0.1e-6, switch_latency=0.2e-6)


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str
    params: dict[str, Any]
    size_alias: str  # the override that sets the size ("racks", "nodes", "ranks")
    size_field: str  # the ClusterSpec field it sets
    loader: Callable[[], dict[str, Any]] | None = None  # extra defaults read at build time (calibration)


_PRESETS: dict[str, Preset] = {}


def _add(preset: Preset) -> None:
    _PRESETS[preset.name] = preset


_add(Preset(
    "gb300-nvl72",
    "Azure ND GB300 v6: NVL72 racks (18 VMs x 4 GPUs), 800 Gb/s per GPU, 144-port Quantum-X800 fat-tree",
    dict(
        name="gb300-nvl72",
        description="Azure ND GB300 v6, NVL72 racks on a non-blocking Quantum-X800 fat-tree",
        # Microsoft announcement (hardware.md): 4 GPUs per VM, 18 VMs = 72 GPUs = one NVLink domain per rack;
        # first cluster > 4,600 GPUs, growing to hundreds of thousands: default 4,608 racks = 331,776 GPUs.
        domains=4608, gpus_per_domain=72, gpus_per_host=4,
        # NVL72 reference architecture: NVLink 5, 1.8 TB/s bidirectional per GPU = 900 GB/s per direction.
        nvlink_bandwidth=900e9, nvls=True,
        # NCCL src/graph/tuning.cc derates NVLS bandwidth by 0.74 on Blackwell.
        nvls_derate=0.74,
        # Announcement: 800 Gb/s per GPU (ConnectX-8). Open point: one Azure health baseline lists 4 x 400 Gb/s
        # ports per 4-GPU VM; nic_bandwidth and nic_planes are parameters, default 800 Gb/s in one plane.
        nic_bandwidth=800 * GBIT, nic_planes=1,
        # Non-blocking fat-tree of Quantum-X800 Q3400: 144 ports x 800 Gb/s (XDR), SHARP from 3.11.
        radix=144, oversubscription=1.0, switch="Quantum-X800 Q3400", sharp="x800",
        **_LATENCIES,
    ),
    "racks", "domains"))

_add(Preset(
    "gb200-nvl72",
    "GB200 NVL72 racks, 400 Gb/s ConnectX-7 per GPU, 64-port Quantum-2 fat-tree, SHARPv3",
    dict(
        name="gb200-nvl72",
        description="GB200 NVL72 racks on a non-blocking Quantum-2 fat-tree",
        # DGX SuperPOD GB200 reference architecture: 72 GPUs per rack (18 compute trays x 4), 18 NVLink switch
        # chips, 1.8 TB/s bidirectional per GPU; 4 x ConnectX-7 400 Gb/s per tray (one per GPU).
        # Default size: 8 racks (576 GPUs, one DGX SuperPOD GB200 scalable unit).
        domains=8, gpus_per_domain=72, gpus_per_host=4,
        nvlink_bandwidth=900e9, nvls=True, nvls_derate=0.74,  # Blackwell derate, NCCL tuning.cc
        nic_bandwidth=400 * GBIT, nic_planes=1,
        # Quantum-2 QM9700: 64 x 400 Gb/s (NDR), SHARPv3.
        radix=64, oversubscription=1.0, switch="Quantum-2 QM9700", sharp="v3",
        **_LATENCIES,
    ),
    "racks", "domains"))

_add(Preset(
    "dgx-h100",
    "DGX H100 nodes (8 GPUs, NVLink 4), 8 x 400 Gb/s rails, 64-port Quantum-2, scalable units of 32 nodes",
    dict(
        name="dgx-h100",
        description="DGX SuperPOD H100: rail-aligned Quantum-2 fat-tree",
        # DGX SuperPOD H100 reference architecture: 8 GPUs, 4 NVSwitch chips, NVLink 4: 18 links x 25 GB/s =
        # 450 GB/s per direction (900 GB/s bidirectional) per GPU; 8 x ConnectX-7 400 Gb/s, one per GPU (rails).
        # Default size: one scalable unit of 32 nodes (8 leaf + 4 spine QM9700, as the model builds it).
        domains=32, gpus_per_domain=8, gpus_per_host=8,
        nvlink_bandwidth=450e9, nvls=True,
        nvls_derate=0.85,  # NCCL src/graph/tuning.cc, Hopper
        nic_bandwidth=400 * GBIT, nic_planes=1,
        radix=64, oversubscription=1.0, switch="Quantum-2 QM9700", sharp="v3",
        **_LATENCIES,
    ),
    "nodes", "domains"))

ENV_CALIBRATION = "COLLECTIVES_CALIBRATION"


def calibration_path() -> Path:
    """Where `preset("loopback")` looks for its calibration: $COLLECTIVES_CALIBRATION, else
    $XDG_CACHE_HOME/collectives/loopback.json (~/.cache/collectives/loopback.json)."""
    env = environment.get(ENV_CALIBRATION)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "collectives" / "loopback.json"


def _loopback_calibration() -> dict[str, Any]:
    path = calibration_path()
    if not path.is_file():
        return {}
    data = _read_json(path)
    if data.get("kind", "cluster") != "cluster":
        raise ValueError(f"{path}: the loopback calibration must describe a cluster, not {data.get('kind')!r}")
    data = {k: v for k, v in data.items() if k not in ("kind", "format", "calibration")}
    check_names(data, ClusterSpec.fields(), f"calibration file {path}")
    return data


_add(Preset(
    "loopback",
    "this host: ranks as processes over shared memory (numbers from calibration, else defaults)",
    dict(
        name="loopback",
        description="one host, ranks over shared memory (uncalibrated defaults)",
        # One domain, no fabric, no switch that reduces. Defaults until `collectives calibrate` writes the
        # calibration file (see calibration_path()): 10 GB/s copies, 1 us per message, 5 GB/s reductions.
        domains=1, gpus_per_domain=4, nvlink_bandwidth=10e9, nvlink_latency=0.5e-6, nvls=False, levels=0,
        sharp=None, reduce_bandwidth=5e9,
    ),
    "ranks", "gpus_per_domain", loader=_loopback_calibration))


def presets() -> dict[str, str]:
    """Preset names and one-line descriptions."""
    return {name: p.summary for name, p in _PRESETS.items()}


def preset_parameters(name: str) -> dict[str, Any]:
    """The cluster parameters a preset starts from (before overrides)."""
    p = _get(name)
    params = dict(p.params)
    if p.loader is not None:
        params.update(p.loader())
    return params


def _get(name: str) -> Preset:
    if name not in _PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(_PRESETS)}")
    return _PRESETS[name]


def preset(name: str, **overrides: Any) -> Cluster:
    """A named cluster; any `ClusterSpec` field can be overridden, and the size by its alias:
    `racks=` (gb300-nvl72, gb200-nvl72), `nodes=` (dgx-h100), `ranks=` (loopback)."""
    p = _get(name)
    params = preset_parameters(name)
    valid = (*ClusterSpec.fields(), p.size_alias)
    check_names(overrides, valid, f"preset {name!r}")
    overrides = dict(overrides)
    if p.size_alias in overrides:
        if p.size_field in overrides:
            raise ValueError(f"give the size of {name!r} once: {p.size_alias}= or {p.size_field}=")
        overrides[p.size_field] = overrides.pop(p.size_alias)
    params.update(overrides)
    return cluster(**params)


# -- persistence ---------------------------------------------------------------------------------------------
FORMAT = "collectives.topology/1"


def from_dict(data: dict[str, Any]) -> Topology:
    """Rebuild a topology from `Topology.to_dict()` output (a "calibration" entry, the raw measurements
    `collectives calibrate` keeps next to the parameters, is metadata and ignored here)."""
    data = {k: v for k, v in data.items() if k not in ("format", "calibration")}
    kind = data.pop("kind", "cluster")
    if kind == "cluster":
        return cluster(**data)
    if kind == "fully_connected":
        check_names(data, ("n", "latency", "bandwidth", "reduce_bandwidth", "name"), "fully_connected")
        return FullyConnected(**data)
    raise ValueError(f"unknown topology kind {kind!r} (known: cluster, fully_connected)")


def save(topology: Topology, path: str | os.PathLike[str]) -> Path:
    """Write `topology` as JSON (its parameters, not its arrays) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": FORMAT, **topology.to_dict()}, indent=2, sort_keys=False) + "\n")
    return path


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a topology file holds a JSON object")
    fmt = data.get("format", FORMAT)
    if fmt != FORMAT:
        raise ValueError(f"{path}: unknown format {fmt!r} (expected {FORMAT!r})")
    return data


def load(path: str | os.PathLike[str]) -> Topology:
    """Read a topology written by `save`."""
    return from_dict(_read_json(Path(path)))


__all__ = ["ENV_CALIBRATION", "FORMAT", "calibration_path", "from_dict", "load", "preset", "preset_parameters",
           "presets", "save"]
