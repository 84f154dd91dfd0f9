"""NCCL's runtime as the simulator models it: protocols, channels, chunk sizes and per-step latencies.

A GPU cluster preset runs collectives the way NCCL does (`ClusterSpec.runtime = "nccl"`); a host (the loopback
preset, `fully_connected`) has no runtime and its messages cost only their links. Every constant below is NCCL's,
read from its source (github.com/NVIDIA/nccl, cited per constant); `docs/in-network.md` says what the model
leaves out.

Vocabulary.

* A *protocol* is how a message is encoded on the wire. LL ("low latency") writes 8-byte words of 4 data bytes
  and a 4-byte flag, so a receiver polls the data itself: half the bandwidth, the shortest steps. LL128 writes
  128-byte lines of 120 data bytes and an 8-byte flag (15/16 of the bandwidth). Simple writes the data, then a
  flag after a memory fence: the full bandwidth, the longest steps. `efficiency(protocol)` is the data fraction.
* A *latency class* is NCCL's row of its latency tables (ring, tree, collnet_direct, collnet_chain, nvls,
  nvls_tree, pat): a schedule names its class in `params["latency_class"]` (ring's constants otherwise).
* *Per-call latency* (`call_latency`): NCCL's base latency of the class and protocol (kernel launch and setup),
  plus, for the in-network classes, the synchronisation of the switch operation (NVLS 25 us inside the domain,
  18-31 us through a fabric switch), paid once per call as NCCL's model pays it.
* *Per-step latency* (`step_latency`): the software cost of one step of the algorithm (flag, fence, proxy),
  per protocol, on NVLink or on the network. NCCL's model multiplies it by the algorithm's depth (ring:
  2(p-1) steps; tree: 2 x (chain + tree levels)); the simulator pays it along the schedule's unpipelined
  critical path (`collectives.simulator.latency`).
* *Channels* are parallel instances of an algorithm over disjoint slices of the buffer, each with its own path
  (one thread block each on the GPU). `channels(multi_domain)` is NCCL's default count.
* *Chunk*: the bytes one channel moves per pipeline step (`chunk_bytes`), from NCCL's buffer and step sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PROTOCOLS = ("LL", "LL128", "Simple")
RUNTIMES = ("nccl",)
GENERATIONS = ("hopper", "blackwell")
LATENCY_CLASSES = ("ring", "tree", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
# classes whose kernels exist for the Simple protocol only (src/graph/tuning.cc, ncclTopoTuneModel: "NVLS and
# NVLSTree only Simple"; CollNet and PAT get busBw 0 for LL/LL128)
SIMPLE_ONLY = ("collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")

US = 1e-6
# src/graph/tuning.cc, ncclTunerConstantsDefaults.baseLatencies (us; LL, LL128, Simple)
BASE_LATENCY_US: dict[str, tuple[float, float, float]] = {
    "tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "collnet_direct": (0, 0, 0), "collnet_chain": (0, 0, 0),
    "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0), "pat": (8.0, 8.0, 8.0),
}
# src/graph/tuning.cc, ncclTunerConstantsDefaults.hwLatencies (us per step; LL, LL128, Simple): NVLINK and NET rows
STEP_LATENCY_US: dict[str, dict[str, tuple[float, float, float]]] = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "collnet_direct": (0, 0, 3.7),
               "collnet_chain": (0, 0, 2.8), "nvls": (0, 0, 25), "nvls_tree": (0, 0, 25), "pat": (0, 0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14), "ring": (2.7, 4.0, 14.0), "collnet_direct": (0, 0, 31),
            "collnet_chain": (0, 0, 30), "nvls": (0, 0, 18), "nvls_tree": (0, 0, 20.9), "pat": (0, 0, 14)},
}
# src/graph/tuning.cc, ncclTopoTuneModel, CollNetDirect: "Add 0.4 us arity serialization latency" per peer of the head
COLLNET_ARITY_US = 0.4
# src/graph/tuning.cc, getNetOverhead (us): the default and Intel x86 (AMD x86: 2.0; the presets' hosts are Intel
# Xeon (DGX H100/H200) and Grace (GB200/GB300), both 1.0). ncclTopoTuneModel: "Inter-node rings still have to
# launch nsteps * net overhead": a multi-node ring's every step costs at least this, x3 for Simple.
NET_OVERHEAD_US = 1.0
# src/include/device.h: NCCL_STEPS buffer slots per connection; default buffers from src/init.cc
# (DEFAULT_LL_BUFFSIZE = NCCL_LL_LINES_PER_THREAD 8 x NCCL_LL_MAX_NTHREADS 512 x NCCL_STEPS x 16-byte lines;
# DEFAULT_LL128_BUFFSIZE = NCCL_LL128_ELEMS_PER_THREAD 120 x NCCL_LL128_MAX_NTHREADS 640 x NCCL_STEPS x 8;
# DEFAULT_BUFFSIZE = 4 MiB)
NCCL_STEPS = 8
BUFFER_BYTES = {"LL": 8 * 512 * NCCL_STEPS * 16, "LL128": 120 * 640 * NCCL_STEPS * 8, "Simple": 1 << 22}
NVLS_CHUNK_BYTES = 128 << 10  # src/transport/nvls.cc, NCCL_NVLS_CHUNKSIZE default
MAX_CHANNELS = 64  # src/include/device.h, MAXCHANNELS
# src/include/device.h: NCCL_LL_MAX_NTHREADS, NCCL_LL128_MAX_NTHREADS, NCCL_SIMPLE_MAX_NTHREADS (a channel's threads)
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
# src/include/comm.h: NCCL_{LL,LL128,SIMPLE}_THREAD_THRESHOLD, bytes per thread before a call takes another channel
# (src/graph/tuning.cc multiplies ring's LL threshold by the rank count)
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
# src/transport/nvls.cc: NVLS_NCHANNELS_SM90 16, NVLS_NCHANNELS_SM100 32 (multi-node), _SM100_NVL 24 (one domain)
NVLS_CHANNELS = {("hopper", False): 16, ("hopper", True): 16, ("blackwell", False): 24, ("blackwell", True): 32}
# src/graph/search.cc, sm90SpeedArrayIntra / sm100SpeedArrayIntra: the fastest per-channel NVLink speed (GB/s) the
# ring search tries first; it fills the GPU's NVLink bandwidth with channels of that speed, then
# ncclTopoDupChannels doubles them
CHANNEL_SPEED = {"hopper": 60e9, "blackwell": 90e9}


def _protocol_index(protocol: str) -> int:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    return PROTOCOLS.index(protocol)


def check_protocol(protocol: object) -> str:
    """`protocol` as one of PROTOCOLS (case-insensitive), or ValueError naming the valid ones."""
    if isinstance(protocol, str):
        for p in PROTOCOLS:
            if p.lower() == protocol.lower():
                return p
    raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")


def efficiency(protocol: str) -> float:
    """Data bytes per wire byte: LL 4 of 8 (a 4-byte flag per 4-byte word), LL128 120 of 128 (an 8-byte flag per
    128-byte line; src/include/device.h NCCL_LL128_LINEELEMS / DATAELEMS), Simple all of them."""
    return (0.5, 120 / 128, 1.0)[_protocol_index(protocol)]


def step_bytes(protocol: str) -> int:
    """Bytes of one buffer slot: the connection's buffer / NCCL_STEPS (src/enqueue.cc, calcCollChunking)."""
    return BUFFER_BYTES[PROTOCOLS[_protocol_index(protocol)]] // NCCL_STEPS


@dataclass(frozen=True)
class NcclRuntime:
    """NCCL's runtime on one cluster: the GPU generation's constants and the cluster's channel counts.

    `ring_channels` / `nvls_channels` are NCCL's defaults for this cluster (see `channels`); `multi_domain`
    is whether the collective spans several scale-up domains (NCCL: nNodes > 1).
    """

    generation: str
    ring_channels: int
    nvls_channels: int
    multi_domain: bool
    rails: int
    gpus_per_domain: int

    # -- protocols -------------------------------------------------------------------------------------------
    def protocols(self, latency_class: str) -> tuple[str, ...]:
        """The protocols NCCL runs `latency_class` with."""
        return ("Simple",) if latency_class in SIMPLE_ONLY else PROTOCOLS

    def call_latency(self, latency_class: str, protocol: str) -> float:
        """Seconds every call pays once: NCCL's base latency, plus the in-network classes' switch
        synchronisation (src/graph/tuning.cc, ncclTopoTuneModel: NVLS latency = intraLat (+ interLat across
        nodes); NVLSTree adds intraLat once; CollNet adds interLat once, CollNetDirect its heads' arity
        serialization)."""
        p = _protocol_index(protocol)
        cls = _check_class(latency_class)
        lat = BASE_LATENCY_US[cls][p]
        if cls in ("nvls", "nvls_tree"):
            lat += STEP_LATENCY_US["nvlink"][cls][p]
        if cls == "nvls" and self.multi_domain:
            lat += STEP_LATENCY_US["net"]["nvls"][p]
        if cls in ("collnet_direct", "collnet_chain"):
            lat += STEP_LATENCY_US["net"][cls][p]
        if cls == "collnet_direct":  # NCCL's "0.4 us arity serialization" of a head over its domain's peers, twice
            lat += 2 * (self.gpus_per_domain - 1) * COLLNET_ARITY_US
        return lat * US

    def step_latency(self, latency_class: str, protocol: str, kind: str) -> float:
        """Seconds one step of a rank-to-rank message costs in software, on "nvlink" or the "net" (NCCL's
        hwLatencies). Steps of the in-network classes' switch operations are in `call_latency`; their
        rank-to-rank steps use their own row where NCCL has one (nvls_tree's tree, collnet's intra-node
        NVLink steps), ring's otherwise. A ring's NVLink step across domains costs at least NCCL's network
        overhead (NET_OVERHEAD_US, x3 for Simple: src/graph/tuning.cc, ncclTopoTuneModel, ring's
        `intraLat = std::max(intraLat, netOverhead)` when nNodes > 1)."""
        p = _protocol_index(protocol)
        cls = _check_class(latency_class)
        if kind not in STEP_LATENCY_US:
            raise ValueError(f"kind must be one of {', '.join(STEP_LATENCY_US)}, got {kind!r}")
        if cls == "ring" and kind == "nvlink" and self.multi_domain:
            overhead = NET_OVERHEAD_US * (3 if PROTOCOLS[p] == "Simple" else 1)
            return max(STEP_LATENCY_US[kind][cls][p], overhead) * US
        if cls == "nvls" or (cls == "nvls_tree" and kind == "nvlink") or \
                (cls in ("collnet_direct", "collnet_chain") and kind == "net"):
            cls = "ring"
        row = STEP_LATENCY_US[kind][cls]
        if row[p] == 0:  # a Simple-only class timed with another protocol: ring's row
            row = STEP_LATENCY_US[kind]["ring"]
        return row[p] * US

    # -- channels and chunks ---------------------------------------------------------------------------------
    def channels(self, latency_class: str = "ring") -> int:
        """NCCL's default channel count for `latency_class` on this cluster."""
        if latency_class in ("nvls", "nvls_tree"):
            return self.nvls_channels
        return self.ring_channels

    def chunk_bytes(self, latency_class: str, protocol: str, nbytes: int, channels: int) -> int:
        """Bytes one channel moves per pipeline step for a call of `nbytes` (src/enqueue.cc, calcCollChunking):
        the protocol's step (LL and LL128 carry only their data share), NVLS's and NVLSTree's 128 KiB chunk
        halved down to 16-32 KiB while the call is small against channels x heads, CollNetChain's 256 KiB and
        CollNetDirect's step halved down to 32-128 KiB while the call is small against the pipeline depth."""
        cls = _check_class(latency_class)
        proto = PROTOCOLS[_protocol_index(protocol)]
        chunk = step_bytes(proto)
        if proto == "LL":
            chunk //= 2
        elif proto == "LL128":
            chunk = chunk * 15 // 16
        nbytes, channels = max(int(nbytes), 0), max(int(channels), 1)
        heads = self.gpus_per_domain
        if cls == "nvls":
            ops = channels * heads
            chunk = NVLS_CHUNK_BYTES
            for factor, floor in ((64, 65536), (8, 32768), (2, 16384)):
                if nbytes < factor * ops * chunk and chunk > floor:
                    chunk = floor
        elif cls == "nvls_tree":
            ops = channels * heads
            chunk = NVLS_CHUNK_BYTES
            for factor, floor in ((32, 262144), (16, 131072), (4, 65536), (1, 32768)):
                if nbytes < factor * ops * chunk and chunk > floor:
                    chunk = floor
        elif cls in ("collnet_direct", "collnet_chain"):
            depth = 2 if cls == "collnet_direct" else self.gpus_per_domain
            chunk = min(256 << 10, chunk) if cls == "collnet_chain" else chunk
            for factor, floor in ((64, 131072), (8, 65536), (1, 32768)):
                while nbytes // (channels * chunk) < depth * factor and chunk > floor:
                    chunk //= 2
        return max(int(chunk), 1)

    def call_channels(self, latency_class: str, protocol: str, nbytes: int, world_size: int, channels: int) -> int:
        """The channels a ring or tree call of `nbytes` runs on, of the `channels` it may use: NCCL drops channels
        while the call has less than threadThreshold bytes per thread of each (src/enqueue.cc, ring/tree
        channel tuning: `while (nBytes < nc * nt * threadThreshold) nc--`, down to one), so small calls run on
        one channel. Other classes keep theirs."""
        cls = _check_class(latency_class)
        proto = PROTOCOLS[_protocol_index(protocol)]
        nc = max(int(channels), 1)
        if cls not in ("ring", "tree"):
            return nc
        per_channel = MAX_THREADS[proto] * THREAD_THRESHOLD[proto] * (world_size if cls == "ring" and proto == "LL"
                                                                       else 1)
        while nc > 1 and int(nbytes) < nc * per_channel:
            nc -= 1
        return nc

    def pieces(self, latency_class: str, protocol: str, nbytes: int, channels: int | None = None) -> int:
        """Pipeline steps a call of `nbytes` takes: the buffer over channels x chunk (at least 1)."""
        ch = self.channels(latency_class) if channels is None else max(int(channels), 1)
        chunk = self.chunk_bytes(latency_class, protocol, nbytes, ch)
        return max(1, math.ceil(int(nbytes) / (ch * chunk)))

    def describe(self) -> str:
        return (f"NCCL runtime ({self.generation}): protocols {', '.join(PROTOCOLS)}; {self.ring_channels} ring/tree "
                f"channels, {self.nvls_channels} NVLS channels")


def _check_class(latency_class: str) -> str:
    if latency_class not in LATENCY_CLASSES:
        raise ValueError(f"latency class must be one of {', '.join(LATENCY_CLASSES)}, got {latency_class!r}")
    return latency_class


def default_ring_channels(generation: str, nvlink_bandwidth: float, rails: int, multi_domain: bool) -> int:
    """NCCL's ring/tree channel count: across domains one channel pair per NIC (src/graph/search.cc finds a
    channel per NIC and ncclTopoDupChannels doubles it; src/graph/connect.cc doubles Hopper+ multi-node rings
    below 16 channels), inside one domain the GPU's NVLink bandwidth over the generation's fastest channel
    speed, doubled; at most MAXCHANNELS."""
    if multi_domain:
        return max(1, min(MAX_CHANNELS, 2 * rails))
    speed = CHANNEL_SPEED[generation]
    return max(1, min(MAX_CHANNELS, 2 * max(1, int(nvlink_bandwidth // speed))))


__all__ = ["BASE_LATENCY_US", "COLLNET_ARITY_US", "GENERATIONS", "LATENCY_CLASSES", "MAX_CHANNELS", "MAX_THREADS", "NCCL_STEPS",
           "NET_OVERHEAD_US",
           "NVLS_CHANNELS", "THREAD_THRESHOLD",
           "PROTOCOLS", "RUNTIMES", "SIMPLE_ONLY", "STEP_LATENCY_US", "NcclRuntime", "check_protocol",
           "default_ring_channels", "efficiency", "step_bytes"]
