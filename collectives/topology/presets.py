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

# Latencies are not in hardware.md as wire figures; these are model defaults (parameters): NIC 1 us per end;
# cable 0.1 us; switch port-to-port 0.2 us (hardware.md: "no authoritative figure; secondary sources give 130-400
# ns. A parameter"). An NVLink path GPU -> NVSwitch -> GPU is composed the same way: a cable each way and one
# switch's port-to-port latency, 0.1 + 0.2 + 0.1 = 0.4 us, i.e. two hops of 0.2 us. It stays below NCCL's whole
# NVLink step (LL: 0.6 us, wire included; src/graph/tuning.cc hwLatencies), which a wire figure must.
_LATENCIES = dict(nvlink_latency=0.2e-6, nic_latency=1.0e-6, fabric_latency=0.1e-6, switch_latency=0.2e-6)


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


# NVLink as NCCL sees it: the application-level per-link bandwidth x links per GPU (src/graph/topo.h:
# SM90_NVLINK_BW 20.6 GB/s for Hopper's NVLink 4, SM100_NVLINK_BW 40.1 GB/s for Blackwell's NVLink 5; 18 links per
# GPU on both, hardware.md). NCCL logs the Blackwell figure as "maxBw 721.8" (NVIDIA/nccl#1807).
_HOPPER_NVLINK = dict(nvlink_links=18, nvlink_link_bandwidth=20.6e9, nvlink_bandwidth=18 * 20.6e9, gpu="hopper")
_BLACKWELL_NVLINK = dict(nvlink_links=18, nvlink_link_bandwidth=40.1e9, nvlink_bandwidth=18 * 40.1e9,
                         gpu="blackwell")
# InfiniBand moves 4 KiB MTU packets with 26 bytes of headers (LRH 8, BTH 12, ICRC 4, VCRC 2: the InfiniBand
# Architecture Specification): 4096 / 4122 of the line rate is payload. (RoCEv2 over Ethernet: 82 bytes with
# preamble, inter-frame gap, Ethernet, IP, UDP, BTH and ICRC: 4096 / 4178.)
IB_EFFICIENCY = 4096 / 4122
ROCE_EFFICIENCY = 4096 / 4178
_NCCL = dict(runtime="nccl", nic_efficiency=IB_EFFICIENCY, **_LATENCIES)


def _dgx(name: str, summary: str, description: str, source: str, nvlink: dict, nic_gbit: int, switch: str,
         radix: int, sharp: str) -> None:
    """A DGX node preset: 8 GPUs on one NVSwitch board, one NIC per GPU (8 rails), `nodes=N`."""
    _add(Preset(name, summary, dict(
        name=name, description=f"{description} ({source})",
        # default size: one scalable unit of 32 nodes (DGX SuperPOD reference architectures)
        domains=32, gpus_per_domain=8, gpus_per_host=8, nvls=True, **nvlink,
        nic_bandwidth=nic_gbit * GBIT, nic_planes=1,
        radix=radix, oversubscription=1.0, switch=switch, sharp=sharp, **_NCCL,
    ), "nodes", "domains"))


_add(Preset(
    "gb300-nvl72",
    "Azure ND GB300 v6: NVL72 racks (18 VMs x 4 GPUs), 800 Gb/s per GPU, 144-port Quantum-X800 fat-tree",
    dict(
        name="gb300-nvl72",
        description="Azure ND GB300 v6, NVL72 racks on a non-blocking Quantum-X800 fat-tree",
        # Microsoft announcement (hardware.md): 4 GPUs per VM, 18 VMs = 72 GPUs = one NVLink domain per rack;
        # first cluster > 4,600 GPUs, growing to hundreds of thousands: default 4,608 racks = 331,776 GPUs.
        domains=4608, gpus_per_domain=72, gpus_per_host=4,
        # NVL72 reference architecture: NVLink 5, 18 links per GPU (one to each switch chip), 1.8 TB/s
        # bidirectional; NCCL's application-level 40.1 GB/s per link (see _BLACKWELL_NVLINK).
        nvls=True, **_BLACKWELL_NVLINK,
        # Announcement: 800 Gb/s per GPU (ConnectX-8). Open point: one Azure health baseline lists 4 x 400 Gb/s
        # ports per 4-GPU VM; nic_bandwidth and nic_planes are parameters, default 800 Gb/s in one plane.
        nic_bandwidth=800 * GBIT, nic_planes=1,
        # Non-blocking fat-tree of Quantum-X800 Q3400: 144 ports x 800 Gb/s (XDR), SHARP from 3.11.
        radix=144, oversubscription=1.0, switch="Quantum-X800 Q3400", sharp="x800",
        **_NCCL,
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
        domains=8, gpus_per_domain=72, gpus_per_host=4, nvls=True, **_BLACKWELL_NVLINK,
        nic_bandwidth=400 * GBIT, nic_planes=1,
        # Quantum-2 QM9700: 64 x 400 Gb/s (NDR), SHARPv3.
        radix=64, oversubscription=1.0, switch="Quantum-2 QM9700", sharp="v3",
        **_NCCL,
    ),
    "racks", "domains"))

# DGX H100 (hardware.md, DGX SuperPOD H100 reference architecture): 8 GPUs, 4 NVSwitch chips, NVLink 4 (18
# links), 8 x ConnectX-7 400 Gb/s, one per GPU (rails); rail-aligned Quantum-2 QM9700 (64 x 400 Gb/s, SHARPv3).
_dgx("dgx-h100", "DGX H100 nodes (8 GPUs, NVLink 4), 8 x 400 Gb/s rails, 64-port Quantum-2, scalable units of 32",
     "DGX SuperPOD H100: rail-aligned Quantum-2 fat-tree", "DGX SuperPOD H100 reference architecture",
     _HOPPER_NVLINK, 400, "Quantum-2 QM9700", 64, "v3")
# DGX H200 (NVIDIA DGX H200 datasheet): the H100 board with HBM3e: 8 GPUs, 4 NVSwitch chips, NVLink 4 (900 GB/s
# bidirectional per GPU), 8 x ConnectX-7 400 Gb/s; the same Quantum-2 SuperPOD fabric.
_dgx("dgx-h200", "DGX H200 nodes (8 GPUs, NVLink 4), 8 x 400 Gb/s rails, 64-port Quantum-2",
     "DGX H200: rail-aligned Quantum-2 fat-tree", "NVIDIA DGX H200 datasheet", _HOPPER_NVLINK, 400,
     "Quantum-2 QM9700", 64, "v3")
# DGX B200 (NVIDIA DGX B200 datasheet): 8 B200 GPUs, 2 NVSwitch chips, NVLink 5 (1.8 TB/s bidirectional per GPU),
# 8 x single-port ConnectX-7 400 Gb/s; Quantum-2 SuperPOD fabric.
_dgx("dgx-b200", "DGX B200 nodes (8 GPUs, NVLink 5), 8 x 400 Gb/s rails, 64-port Quantum-2",
     "DGX B200: rail-aligned Quantum-2 fat-tree", "NVIDIA DGX B200 datasheet", _BLACKWELL_NVLINK, 400,
     "Quantum-2 QM9700", 64, "v3")
# DGX B300 (NVIDIA DGX B300 datasheet): 8 Blackwell Ultra GPUs, NVLink 5 (1.8 TB/s bidirectional per GPU),
# 8 x ConnectX-8 800 Gb/s; Quantum-X800 Q3400 (144 x 800 Gb/s XDR, SHARP from 3.11; hardware.md).
_dgx("dgx-b300", "DGX B300 nodes (8 GPUs, NVLink 5), 8 x 800 Gb/s rails, 144-port Quantum-X800",
     "DGX B300: rail-aligned Quantum-X800 fat-tree", "NVIDIA DGX B300 datasheet", _BLACKWELL_NVLINK, 800,
     "Quantum-X800 Q3400", 144, "x800")

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


def preset(name: str, *, defaults_only: bool = False, **overrides: Any) -> Cluster:
    """A named cluster; any `ClusterSpec` field can be overridden, and the size by its alias:
    `racks=` (gb300-nvl72, gb200-nvl72), `nodes=` (dgx-h100, dgx-h200, dgx-b200, dgx-b300), `ranks=` (loopback).

    E.g. `preset("gb200-nvl72", racks=3, gpus_per_domain=4)`: three 4-GPU NVLink partitions, one per rack;
    `preset("dgx-h100", domain_sizes=[3, 2])`: a job of 3 + 2 ranks on two of its 8-GPU nodes (`placement=` names
    each domain's ranks instead). Giving
    nvlink_links or nvlink_link_bandwidth recomputes nvlink_bandwidth; giving nvlink_bandwidth alone drops the
    link breakdown. `defaults_only=True` ignores what a loader would read (the loopback calibration file): the
    same model on every host, for choices every rank must make alike."""
    p = _get(name)
    params = dict(p.params) if defaults_only else preset_parameters(name)
    valid = (*ClusterSpec.fields(), p.size_alias, "domain_sizes")
    check_names(overrides, valid, f"preset {name!r}")
    overrides = dict(overrides)
    if p.size_alias in overrides:
        if p.size_field in overrides:
            raise ValueError(f"give the size of {name!r} once: {p.size_alias}= or {p.size_field}=")
        overrides[p.size_field] = overrides.pop(p.size_alias)
    rows = overrides.get("placement") or overrides.get("domain_sizes")
    if rows is not None and "domains" not in overrides:
        overrides["domains"] = len(rows)  # a job's placement on the preset's machines: as many domains as it uses
    links = {"nvlink_links", "nvlink_link_bandwidth"}
    if "nvlink_bandwidth" not in overrides and links & set(overrides):
        n, per_link = overrides.get("nvlink_links", params.get("nvlink_links")), \
            overrides.get("nvlink_link_bandwidth", params.get("nvlink_link_bandwidth"))
        if n is not None and per_link is not None:
            overrides["nvlink_bandwidth"] = n * per_link  # the per-GPU figure follows the links
    elif "nvlink_bandwidth" in overrides and not links & set(overrides):
        overrides.update(nvlink_links=None, nvlink_link_bandwidth=None)  # a figure given whole replaces the links
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
