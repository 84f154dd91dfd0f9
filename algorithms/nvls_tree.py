"""NVLS tree (NCCL's NVLSTree): NVLS inside every domain, a double binary tree across domains, pipelined.

Vocabulary (_hierarchy.py). D domains of G GPUs; the buffer is cut into *pieces* that stream through three
stages one round apart, each piece into G *shards* (shard j belongs to the GPUs of local index j, the *inter
group* j on NIC rail j) and each shard into two *halves*, one per tree:

* reduce-scatter inside the domain by its switch (lags 0-1, nvls.py): every GPU sends the piece to the switch,
  which reduce-receives the G copies and hands GPU j shard j;
* allreduce of shard j across the domains over inter group j (lags 2 .. 2 + 2H - 1): NCCL's double binary tree
  over the domains (double_binary_tree.py), tree b carrying half b; every rail at once;
* allgather inside the domain (lags 2 + 2H, 2 + 2H + 1): GPU j gives its shard to the switch, which multicasts
  the piece to every GPU.

Per GPU: (1 + 1/G)·D each way over NVLink, as NVLS; D/G each way over its NIC, as a tree of 1/G of the buffer.
The stages overlap across pieces, so the network's time hides behind NVLink's (NCCL
src/device/all_reduce.h, runTreeSplit / NVLS tree). Pieces default to NCCL's chunking
(topology/runtime.py: NVLSTree's 32-128 KiB per channel). On one domain it is NVLS; an op or dtype the switch
does not reduce falls back to the host `fallback` algorithm with a note.
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import Schedule, check_chunks

from ._hierarchy import Shards, members
from ._innetwork import check_topology, fallback_schedule, finish, itemsize, runtime_pieces
from ._pipeline import memo, pipelined_phase
from ._uneven import serves_uneven
from .double_binary_tree import double_binary_tree, tree_lanes
from .nvls import domain_rows, gather_lanes, multicast_lanes, reduce_lanes, scatter_lanes


@register("nvls_tree", ("allreduce",), needs_topology=True,
          summary="NCCL's NVLSTree: NVLS reduce-scatter in each domain, double binary tree of each shard across "
                  "domains, NVLS allgather; pipelined over `chunks` pieces (default: NCCL's chunking)")
@serves_uneven("nvls_tree")
def build_nvls_tree(collective: str, world_size: int, count: int, *, root=None, topology=None, dtype="float32",
                    op: str = "sum", chunks: int | None = None, protocol: str = "Simple",
                    fallback: str = "ring") -> Schedule:
    check_topology("nvls_tree", topology, world_size)
    if collective != "allreduce":
        raise ValueError(f"nvls_tree implements allreduce only, not {collective}")
    reason = topology.nvls.refusal(op, dtype)
    if reason is not None:
        return fallback_schedule("nvls_tree", "NVLS", reason, fallback, [], collective=collective,
                                 world_size=world_size, count=count, root=None, chunks=chunks, dtype=str(dtype),
                                 op=op, topology=topology)
    D, G = topology.num_domains, topology.gpus_per_domain
    c = runtime_pieces(topology, "nvls_tree", count * itemsize(dtype), protocol) if chunks is None else \
        check_chunks("nvls_tree", chunks)
    shards = Shards(c, G, 2)

    def stages():  # independent of the size: kept across a sweep's sizes
        gpus = topology.domain_groups()
        switches = world_size + np.arange(D, dtype=np.int64)
        lanes = []
        lag = 0
        if G > 1:  # reduce-scatter by the switch: GPU j ends with shard j
            rows = domain_rows(gpus, switches)  # the member arrays both NVLS stages read
            lanes += reduce_lanes(gpus, switches, 0, shards.piece, rows, shards.piece_count) + \
                scatter_lanes(gpus, switches, 1, shards.shard, rows, shards.sub)
            lag = 2
        if D > 1:  # shard j over inter group j: tree b of the domains carries half b
            trees = double_binary_tree(D)
            H = max(int(t.height.max(initial=0)) for t in trees)
            for b, tree in enumerate(trees):
                lanes += tree_lanes(tree, gpus.T, lambda k, j, b=b: shards.part(k, j, b), lag, height=H)
            lag += 2 * H
        if G > 1:  # allgather by the switch's multicast
            lanes += gather_lanes(gpus, switches, lag, shards.shard, rows, shards.sub) + \
                multicast_lanes(gpus, switches, lag + 1, shards.piece, rows, shards.piece_count)
        return members(topology, G > 1), lanes

    nodes, lanes = memo(topology, ("nvls_tree",), stages)
    phase = pipelined_phase("NVLS reduce-scatter + tree allreduce + NVLS allgather, pipelined", nodes,
                            shards.table(count), lanes, c, piece_invariant=True)
    rt = getattr(topology, "runtime", None)
    params = {"chunks": c, "dtype": str(dtype), "op": op, "latency_class": "nvls_tree",
              "accumulator": topology.nvls.accumulator(dtype)}
    if rt is not None:
        params["channels"] = rt.nvls_channels
    sched = Schedule("nvls_tree", collective, world_size, count, [phase], params=params)
    finish(sched, topology, topology.nvswitches() if G > 1 else ())
    return sched
