"""The cost rules both simulators apply: one place, so the event and analytic answers can only differ where their
execution strategies do (see the package docstring).

Per message: it starts when both ends have entered its round (rendezvous), or, under NCCL's runtime and when it
fits one slot of the receiver's buffer, when its sender has, up to NCCL_STEPS rounds ahead of its receiver
(`credit`, recurrence.py); it streams cut-through over its path, so it
arrives after the sum of the hop latencies plus its bytes over the slowest (effective) bandwidth of its path, plus
any queueing; the sender is done once its bytes have left (start + serialization). Per node and round: the round
ends when every send has left and every receive has landed, plus the time to reduce the received bytes
(ranks: the kernel's throughput `topology.reduce_throughput(dtype)`; switch nodes reduce in line, at the rate
their ports deliver, so they add no separate term).

On a cluster that runs NCCL's runtime (`topology.runtime`, topology/runtime.py) three rules change:
- the protocol's wire format: a message between two ranks carries data at `efficiency(protocol)` of each hop's
  rate (LL 1/2, LL128 15/16, Simple 1);
- the reduction streams with the transfer (NCCL's kernels reduce a chunk's slices as they arrive): a node's
  round ends no earlier than its last received byte and than its first received byte plus the time to reduce
  everything it receives in the round, instead of the sum of the two;
- per call, NCCL's latency of the schedule's latency class (`params["latency_class"]`) is added: its base and
  switch-synchronisation latency once, its per-step latency along the unpipelined critical path (latency.py).

Effective bandwidth of a hop (the in-network model):
- a message to or from an NVSwitch node (NVLS reduce or multicast) runs at the NVLink rate x `nvls.derate`
  (NCCL's derate: 0.85 Hopper, 0.74 Blackwell);
- a message to or from a fabric switch (SHARP) runs at link rate x `sharp.sat_efficiency` under SAT; under LLT
  (operations smaller than `sharp.sat_threshold`) at most `ost_quota` OSTs of `ost_size` bytes are in flight per
  round trip of the hop, so the hop's rate is min(link rate, quota x ost_size / (2 x hop latency)).
"""

from __future__ import annotations

import copy

import numpy as np

from ..topology import TIERS
from ..topology.capabilities import dtype_name
from ..topology.runtime import NCCL_STEPS, check_protocol, efficiency, step_bytes

_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
             "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8}


def itemsize(dtype: object) -> int:
    name = dtype_name(dtype)
    if name in _ITEMSIZE:
        return _ITEMSIZE[name]
    return int(np.dtype(name).itemsize)


class CostRules:
    """Hop bandwidths, reduction rates and labels for one (topology, dtype, operation size, protocol).

    `protocol` is NCCL's (LL, LL128, Simple) on a cluster with a runtime, and must be None elsewhere;
    `sharp_protocol` is SHARP's (llt or sat, by operation size) when the fabric aggregates.
    """

    def __init__(self, topology, dtype: object = "float32", op_bytes: int = 0, protocol: str | None = None) -> None:
        self.topology = topology
        self.dtype = dtype_name(dtype)
        self.itemsize = itemsize(dtype)
        self.host_rate = float(topology.reduce_throughput(dtype))
        self.world_size = int(topology.world_size)
        self.num_nodes = int(topology.num_nodes)
        nv, sh = topology.nvls, topology.sharp
        self.nvls_factor = float(nv.derate) if nv is not None and nv.enabled else 1.0
        lo = getattr(topology, "nvswitch_base", self.num_nodes)
        hi = getattr(topology, "fabric_base", self.num_nodes)
        self.nvswitch_range = (int(lo), int(hi))
        self.fabric_start = int(hi)
        self.sharp = sh if sh is not None and sh.enabled else None
        self.sharp_protocol = self.sharp.protocol(int(op_bytes)) if self.sharp is not None else None
        self.runtime = getattr(topology, "runtime", None)
        if protocol is not None and self.runtime is None:
            raise ValueError(f"protocol {protocol!r} needs a cluster that runs NCCL's runtime; {topology.name!r} has "
                             "none (its messages cost only their links)")
        self.protocol = None if protocol is None else check_protocol(protocol)
        # data per wire byte of rank-to-rank messages; switch operations run NCCL's Simple kernels only
        self.efficiency = efficiency(self.protocol) if self.protocol is not None else 1.0
        self.overlap_reduce = self.runtime is not None
        # a message waits for its receiver to have freed the buffer it lands in: under a runtime, NCCL's
        # connection buffer of NCCL_STEPS slots of `slot_bytes` data bytes (src/include/device.h, src/enqueue.cc);
        # elsewhere one round (rendezvous: both ends in the round). See `credit` and recurrence.py.
        self.credit_slots = NCCL_STEPS if self.runtime is not None else 1
        proto = self.protocol or "Simple"
        self.slot_bytes = float(step_bytes(proto) * efficiency(proto)) if self.runtime is not None else np.inf

    def credit(self, nbytes) -> np.ndarray:
        """Rounds a message of `nbytes` may run ahead of its receiver, as an int array: a message of round k
        starts no earlier than its receiver's end of round k - credit. Under NCCL's runtime a message that fits
        one slot of the receiver's connection buffer (`slot_bytes`: a step) is written into a free slot, and the
        receiver has NCCL_STEPS of them (src/include/device.h), so it gets NCCL_STEPS rounds; a larger one
        streams through the buffer at the pace the receiver drains it, as it does without a runtime: 1 round
        (rendezvous: it starts once both ends are in its round)."""
        nbytes = np.asarray(nbytes, np.float64)
        if self.credit_slots == 1:
            return np.ones(nbytes.shape, np.int64)
        return np.where(nbytes <= self.slot_bytes, self.credit_slots, 1).astype(np.int64)

    def at_full_rate(self) -> CostRules:
        """These rules with the protocol's wire efficiency left out (shared costing, see analytic._round_cost)."""
        if self.efficiency == 1.0:
            return self
        if getattr(self, "_full", None) is None:
            full = copy.copy(self)
            full.protocol, full.efficiency = None, 1.0
            self._full = full
        return self._full

    @property
    def key(self) -> tuple:
        """What the effective bandwidths depend on beyond the topology (part of the analytic cache key; the
        protocol's efficiency is applied when a structure is evaluated, so it is not part of it)."""
        return (self.dtype, self.sharp_protocol, self.overlap_reduce)

    def reduce_end(self, ser, red):
        """How long after its start + latency a lone message into a reducing receiver has landed and been
        reduced, given its serialization `ser` and the receiver's reduction time `red` for the round: streamed
        (max) under a runtime, else one after the other (the per-flow duration the analytic model ranks rounds
        by; the event and dataflow models apply the rule per node, see the module docstring)."""
        return np.maximum(ser, red) if self.overlap_reduce else ser + red

    def is_nvswitch(self, nodes: np.ndarray) -> np.ndarray:
        lo, hi = self.nvswitch_range
        return (nodes >= lo) & (nodes < hi)

    def is_fabric_switch(self, nodes: np.ndarray) -> np.ndarray:
        return nodes >= self.fabric_start

    def hop_bandwidth(self, src: np.ndarray, dst: np.ndarray, links: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(effective bandwidth (F, H), in-network factor applied (F, H)) of each hop of each flow; inf where the
        hop is padding."""
        on = links >= 0
        bw = np.full(links.shape, np.inf)
        if on.any():
            bw[on] = self.topology.link_bandwidth(links[on])
        # the factor is the message's (it depends on its two ends), but for SHARP's LLT cap (per hop): computed
        # per message and broadcast over its hops, it is the same value at every hop
        factor = np.ones(np.broadcast_shapes(np.shape(src), np.shape(dst)))
        nvs = self.is_nvswitch(src) | self.is_nvswitch(dst)
        if self.nvls_factor != 1.0 and nvs.any():
            factor[np.broadcast_to(nvs, factor.shape)] = self.nvls_factor
        fab = self.is_fabric_switch(src) | self.is_fabric_switch(dst)
        per_hop = self.sharp is not None and self.sharp_protocol != "sat" and bool(fab.any())
        if self.sharp is not None and self.sharp_protocol == "sat" and fab.any():
            factor[np.broadcast_to(fab, factor.shape)] = self.sharp.sat_efficiency
        if per_hop:
            factor = np.array(np.broadcast_to(factor, links.shape))
            fab = np.broadcast_to(fab, links.shape)
            lat = np.zeros(links.shape)
            lat[on] = self.topology.link_latency(links[on])
            cap = self.sharp.ost_quota * self.sharp.ost_size / np.maximum(2 * lat, 1e-12)
            f = np.where(on, np.minimum(1.0, cap / np.where(on, bw, 1.0)), 1.0)
            factor[fab] = f[fab]
        if self.efficiency != 1.0:
            p2p = (src < self.world_size) & (dst < self.world_size)
            factor = np.where(p2p, factor * self.efficiency, factor)
        factor = np.broadcast_to(factor, links.shape)
        return bw * factor, factor

    def hop_factor(self, src: np.ndarray, dst: np.ndarray, bw: np.ndarray, lat: np.ndarray) -> np.ndarray:
        """The in-network factor of `hop_bandwidth` for a flat list of used hops: hop h belongs to a message
        src[h] -> dst[h] and crosses a link of raw bandwidth bw[h] and latency lat[h] (same rules, same floats)."""
        factor = np.ones(bw.shape)
        nvs = self.is_nvswitch(src) | self.is_nvswitch(dst)
        if self.nvls_factor != 1.0 and nvs.any():
            factor[nvs] = self.nvls_factor
        fab = self.is_fabric_switch(src) | self.is_fabric_switch(dst)
        if self.sharp is not None and fab.any():
            if self.sharp_protocol == "sat":
                factor[fab] = self.sharp.sat_efficiency
            else:
                cap = self.sharp.ost_quota * self.sharp.ost_size / np.maximum(2 * lat[fab], 1e-12)
                factor[fab] = np.minimum(1.0, cap / bw[fab])
        return factor

    def path_latency(self, links: np.ndarray) -> np.ndarray:
        lat = np.zeros(links.shape)
        on = links >= 0
        if on.any():
            lat[on] = self.topology.link_latency(links[on])
        return lat

    def reduce_rate(self, nodes: np.ndarray) -> np.ndarray:
        """Bytes/s at which each node reduces what it receives (inf: switches reduce in line)."""
        return np.where(nodes < self.world_size, self.host_rate, np.inf)

    def tier_counts(self, links: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Sum of weights[f] over every hop of every flow, per link tier: (len(TIERS),)."""
        on = links >= 0
        if not on.any():
            return np.zeros(len(TIERS))
        tiers = self.topology.link_tier(links[on]).astype(np.int64)
        w = np.broadcast_to(weights.reshape(-1, 1), links.shape)[on]
        return np.bincount(tiers, weights=w, minlength=len(TIERS))[:len(TIERS)]

    def link_name(self, link: int) -> str:
        return self.topology.link_label(int(link))

    def node_name(self, node: int) -> str:
        return self.topology.node_label(int(node))

    def aggregation_name(self, src: int, dst: int) -> str:
        """Readable name of the in-network resource a switch-touching message runs through."""
        sw = dst if dst >= self.world_size else src
        if self.is_nvswitch(np.array([sw]))[0]:
            return f"switch aggregation: NVLS at {self.node_name(sw)} (derate {self.nvls_factor:g})"
        proto = (self.sharp_protocol or "sat").upper()
        return f"switch aggregation: SHARP {proto} at {self.node_name(sw)}"


__all__ = ["CostRules", "itemsize"]
