"""CollNet chain (NCCL's CollNetChain): a chain inside every domain to one GPU per channel, SHARP across.

Vocabulary (_hierarchy.py, sharp.py, double_binary_tree.py). D domains of G GPUs; *channel* c carries *slice* c
of the buffer (G channels, one per NIC rail); its *head* in every domain is GPU c, whose NIC is on rail c. The
buffer is cut into *pieces* that stream through three stages one round apart:

* reduce up the chain (lags 0 .. G - 2): channel c's chain in a domain runs GPU c + 1, c + 2, ..., c (mod G),
  tail to head; each GPU reduce-receives the slice from the one before and passes the partial sum on, so the
  head holds slice c reduced over its domain;
* SHARP allreduce of slice c over rail c's aggregation tree (the heads), up and back by multicast;
* broadcast down the chain from the head (one round per GPU).

Per GPU: about D each way over NVLink (one slice per channel, G channels), D/G each way over its NIC. The stages
overlap across pieces (NCCL src/device/all_reduce.h, runTreeUpDown's CollNetChain variant). Pieces default
to NCCL's chunking (topology/runtime.py). When SHARP refuses the call (sharp.py lists why) the schedule is the
host `fallback` algorithm with a note.
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import Schedule
from collectives.topology.capabilities import dtype_name

from ._hierarchy import Shards, members, rail_trees
from ._innetwork import collnet_setup, finish
from ._pipeline import memo, pipelined_phase
from ._uneven import serves_uneven
from .double_binary_tree import Tree, tree_down_lanes, tree_up_lanes
from .sharp import allreduce_lanes, build_forest


def chain(G: int) -> Tree:
    """A chain of G nodes as a tree: node q's parent is q + 1, node G - 1 (the head) the root."""
    q = np.arange(G, dtype=np.int64)
    return Tree.from_parents(np.where(q + 1 < G, q + 1, -1), max_children=1)


@register("collnet_chain", ("allreduce",), needs_topology=True,
          summary="NCCL's CollNetChain: per channel a chain reduce inside each domain to its head GPU, SHARP "
                  "allreduce of the heads over their rail, chain broadcast back; pipelined")
@serves_uneven("collnet_chain")
def build_collnet_chain(collective: str, world_size: int, count: int, *, root=None, topology=None,
                        dtype="float32", op: str = "sum", chunks: int | None = None, protocol: str = "Simple",
                        trees_in_use: int = 0, sat_lock: str = "granted", fallback: str = "ring") -> Schedule:
    fell_back, setup = collnet_setup("collnet_chain", collective, world_size, count, topology,
                                     lambda: rail_trees(topology), dtype=dtype, op=op, chunks=chunks,
                                     protocol=protocol, trees_in_use=trees_in_use, sat_lock=sat_lock,
                                     fallback=fallback)
    if fell_back is not None:
        return fell_back
    c, trees, plan, fabric, notes = setup
    D, G = topology.num_domains, topology.gpus_per_domain
    slices = Shards(c, G)

    def stages():  # independent of the size: kept across a sweep's sizes
        nodes = members(topology, False, fabric)
        forest = build_forest(trees, nodes)
        L = int(forest.depth.max())
        d = np.arange(D, dtype=np.int64)[:, None]
        q = np.arange(G, dtype=np.int64)[None, :]
        dom = topology.domain_groups()
        link = chain(G)
        up, down = [], []
        for ch in range(G):  # channel ch: chain tail GPU ch + 1, ..., head GPU ch, in every domain at once
            order = dom[d, (ch + 1 + q) % G]  # (D, G): member at chain position q of domain d
            data = lambda k, r, ch=ch: slices.shard(k, ch)  # noqa: E731
            up += tree_up_lanes(link, order, data, 0)
            down += tree_down_lanes(link, order, data, G - 1 + 2 * L)
        data = lambda k, v: slices.shard(k, forest.tree[v])  # noqa: E731  (rail ch's tree: channel ch's heads)
        return nodes, up + allreduce_lanes(forest, data, G - 1) + down

    nodes, lanes = memo(topology, ("collnet_chain",), stages)
    phase = pipelined_phase("chain reduce + SHARP allreduce + chain broadcast, pipelined", nodes,
                            slices.table(count), lanes, c, piece_invariant=True)
    params = {"chunks": c, "channels": G, "dtype": dtype_name(dtype), "op": op, "latency_class": "collnet_chain",
              **{f"sharp_{k}": v for k, v in plan.items()}}
    sched = Schedule("collnet_chain", collective, world_size, count, [phase], params=params, notes=notes)
    finish(sched, topology, fabric)
    return sched
