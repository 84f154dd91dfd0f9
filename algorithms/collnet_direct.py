"""CollNet direct (NCCL's CollNetDirect): every GPU reaches SHARP through its own NIC, pipelined.

Vocabulary (_hierarchy.py, sharp.py). D domains of G GPUs, every GPU with a NIC; the buffer is cut into
*pieces* that stream through three stages one round apart, each piece into G *shards* (shard j belongs to the
GPUs of local index j, the *inter group* j on NIC rail j):

* direct reduce-scatter inside the domain (lag 0): every GPU sends shard j of the piece straight to GPU j over
  NVLink, for every j but its own; GPU j reduce-receives the G - 1 copies in that round (one fused reduction);
* SHARP allreduce of shard j over rail j's aggregation tree (lags 1 .. 2L): up the switches, reduced in the
  network, and back by multicast;
* direct allgather inside the domain (lag 2L + 1): GPU j sends its shard to every other GPU of the domain.

Per GPU: (G-1)/G·D each way over NVLink, D/G each way over its NIC (the switches reduce across domains). The
stages overlap across pieces (NCCL src/device/all_reduce.h, runRing's CollNetDirect variant: scatter to the
heads, the network, gather back). Pieces default to NCCL's chunking (topology/runtime.py). When SHARP refuses
the call (sharp.py lists why) the schedule is the host `fallback` algorithm with a note.
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import Schedule, recv, recv_reduce, send
from collectives.topology.capabilities import dtype_name

from ._hierarchy import Shards, members, rail_trees
from ._innetwork import collnet_setup, finish
from ._pipeline import lane, memo, pipelined_phase
from ._uneven import serves_uneven
from .sharp import allreduce_lanes, build_forest


def direct_lanes(gpus: np.ndarray, lag: int, shard, reduce: bool) -> list:
    """Inside every domain (rows of `gpus`, (D, G) members): at offset o = 1..G-1 GPU j sends to GPU j + o.
    reduce: it sends that GPU's shard and reduce-receives its own shard from GPU j - o (all G - 1 in one round:
    one fused reduction); else (allgather) it sends its own shard and stores GPU j - o's."""
    D, G = gpus.shape
    j = np.tile(np.arange(G, dtype=np.int64), D)
    d = np.repeat(np.arange(D, dtype=np.int64), G)
    flat = gpus.ravel()
    lanes = []
    for o in range(1, G):
        to, frm = gpus[d, (j + o) % G], gpus[d, (j - o) % G]
        out_shard = (j + o) % G if reduce else j
        in_shard = j if reduce else (j - o) % G
        lanes.append(lane(send, flat, to, lag, lambda k, at, s=out_shard: shard(k, s[at])))
        lanes.append(lane(recv_reduce if reduce else recv, flat, frm, lag, lambda k, at, s=in_shard: shard(k, s[at])))
    return lanes


@register("collnet_direct", ("allreduce",), needs_topology=True,
          summary="NCCL's CollNetDirect: direct reduce-scatter to the GPUs of each rail, SHARP allreduce of each "
                  "shard over its rail, direct allgather; pipelined over `chunks` pieces")
@serves_uneven("collnet_direct")
def build_collnet_direct(collective: str, world_size: int, count: int, *, root=None, topology=None,
                         dtype="float32", op: str = "sum", chunks: int | None = None, protocol: str = "Simple",
                         trees_in_use: int = 0, sat_lock: str = "granted", fallback: str = "ring") -> Schedule:
    fell_back, setup = collnet_setup("collnet_direct", collective, world_size, count, topology,
                                     lambda: rail_trees(topology), dtype=dtype, op=op, chunks=chunks,
                                     protocol=protocol, trees_in_use=trees_in_use, sat_lock=sat_lock,
                                     fallback=fallback)
    if fell_back is not None:
        return fell_back
    c, trees, plan, fabric, notes = setup
    G = topology.gpus_per_domain
    shards = Shards(c, G)

    def stages():  # independent of the size: kept across a sweep's sizes
        gpus = topology.domain_groups()
        nodes = members(topology, False, fabric)
        forest = build_forest(trees, nodes)
        data = lambda k, v: shards.shard(k, forest.tree[v])  # noqa: E731  (rail j's tree reduces shard j)
        L = int(forest.depth.max())
        lanes = direct_lanes(gpus, 0, shards.shard, reduce=True)
        lanes += allreduce_lanes(forest, data, 1)
        lanes += direct_lanes(gpus, 1 + 2 * L, shards.shard, reduce=False)
        return nodes, lanes

    nodes, lanes = memo(topology, ("collnet_direct",), stages)
    phase = pipelined_phase("direct reduce-scatter + SHARP allreduce + direct allgather, pipelined", nodes,
                            shards.table(count), lanes, c, piece_invariant=True)
    params = {"chunks": c, "dtype": dtype_name(dtype), "op": op, "latency_class": "collnet_direct",
              **{f"sharp_{k}": v for k, v in plan.items()}}
    sched = Schedule("collnet_direct", collective, world_size, count, [phase], params=params, notes=notes)
    finish(sched, topology, fabric)
    return sched
