"""NVLS: the scale-up domain's switch reduces and multicasts (NVLink SHARP), as a switch node of the schedule.

Vocabulary (shared with _innetwork.py). The domain's N GPUs and its switch form one *NVLS group*; the buffer
is cut into N *slices* (slice j is GPU j's) and, for pipelining, into `chunks` *pieces*.

* reduce_scatter: every GPU sends each piece whole to the switch, which reduce-receives all N copies in one
  round (one fused reduction: `multimem.ld_reduce`) and in the next round sends GPU j its part of slice j.
  Per GPU: D sent, D/N received.
* allgather: GPU j sends its slice to the switch, which multicasts each piece to every GPU (`multimem.st`):
  D/N sent, D received (the sender's own slice comes back too, as the multicast writes every GPU).
* allreduce: the two fused per piece (NCCL's two-shot NVLS): about (1 + 1/N)·D each way per GPU, against
  2(N-1)/N·D for a ring.

Only op/dtype pairs the switch offloads run on it (topology.nvls.refusal); otherwise, and when the domain's
switch cannot reduce, the schedule is the host `fallback` algorithm inside the domain, and schedule.notes and
params["fallback_reason"] say why. NVLS spans one domain: a multi-domain cluster needs `hierarchical`.
"""

from __future__ import annotations

from collectives.registry import register
from collectives.schedule import ChunkTable, Schedule, check_chunks

from ._innetwork import (
    check_topology,
    fallback_schedule,
    finish,
    nvls_allgather_phase,
    nvls_allreduce_phase,
    nvls_groups,
    nvls_reduce_scatter_phase,
)


def nvls_phases(collective: str, topology, count: int, chunks: int) -> list:
    """The NVLS phases of `collective` run in every domain of `topology` at once (count: the work buffer)."""
    groups = nvls_groups(topology)
    n, d = topology.gpus_per_domain, topology.num_domains
    if collective == "allreduce":
        return [nvls_allreduce_phase("NVLS allreduce", groups, ChunkTable.whole(count, chunks, n, groups=d))]
    table = ChunkTable.whole(count, n, chunks, groups=d)
    if collective == "reduce_scatter":
        return [nvls_reduce_scatter_phase("NVLS reduce-scatter", groups, table)]
    return [nvls_allgather_phase("NVLS allgather", groups, table)]


@register("nvls", ("allreduce", "reduce_scatter", "allgather"), needs_topology=True,
          summary="NVLink SHARP in one domain: the switch reduces (reduce-scatter) and multicasts (allgather); "
                  "allreduce fuses both per piece; `chunks` pieces")
def build_nvls(collective: str, world_size: int, count: int, *, root=None, topology=None, dtype="float32",
               op: str = "sum", chunks: int = 1, fallback: str = "ring") -> Schedule:
    check_topology("nvls", topology, world_size)
    if topology.num_domains != 1:
        raise ValueError(f"nvls reduces inside one NVLink domain, and {topology.name!r} has "
                         f"{topology.num_domains} domains: use algorithm hierarchical with intra=nvls to reduce "
                         "across domains (Python: algorithm='hierarchical', intra='nvls'; command line: "
                         "--algorithms hierarchical:intra=nvls)")
    c = check_chunks("nvls", chunks)
    reason = topology.nvls.refusal(op, dtype)
    if reason is not None:
        return fallback_schedule("nvls", "NVLS", reason, fallback, [], collective=collective, world_size=world_size,
                                 count=count, root=None, chunks=c, dtype=str(dtype), op=op, topology=topology)
    work = count * world_size if collective == "allgather" else count
    sched = Schedule("nvls", collective, world_size, count, nvls_phases(collective, topology, work, c),
                     params={"chunks": c, "dtype": str(dtype), "op": op,
                             "accumulator": topology.nvls.accumulator(dtype)})
    finish(sched, topology, topology.nvswitches())
    return sched
