"""NVLS: the scale-up domain's switch reduces and multicasts (NVLink SHARP), as a switch node of the schedule.

Vocabulary. The domain's N GPUs and its switch form one *NVLS group*; the buffer is cut into N *slices* (slice j
is GPU j's) and, for pipelining, into *pieces* that stream through the switch one round apart. In a piece,
GPU j's *part* is its share: 1/N of the piece for allreduce (piece-major table: a piece is N parts), the
piece's overlap with slice j for reduce_scatter and allgather (slice-major table, so that GPU j's slice is
exactly its contract block).

* reduce (lag 0): every GPU sends the piece to the switch, which reduce-receives all N copies in one round
  (one fused reduction: `multimem.ld_reduce`, NCCL src/device/reduce_kernel.h);
* scatter (next lag): the switch sends GPU j its part;
* gather: GPU j sends its part to the switch;
* multicast (next lag): the switch sends the piece to every GPU (`multimem.st`; the sender's own part too).

reduce_scatter = reduce + scatter: per GPU D sent, D/N received. allgather = gather + multicast: D/N sent, D
received. allreduce = all four, per piece (NCCL's two-shot NVLS): (1 + 1/N)·D each way per GPU, against
2(N-1)/N·D for a ring. The four stages overlap across pieces, so the switch's two directions are busy at once.

Pieces: `chunks` by default follows NCCL (topology/runtime.py, chunk_bytes: 16-128 KiB per channel, 16 channels
on Hopper) on clusters that run NCCL's runtime, else 1. Only op/dtype pairs the switch offloads run on it
(topology.nvls.refusal); otherwise, and when the domain's switch cannot reduce, the schedule is the host
`fallback` algorithm inside the domain, and schedule.notes and params["fallback_reason"] say why. NVLS spans one
domain: a multi-domain cluster needs `hierarchical` or `nvls_tree`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from collectives.registry import register
from collectives.schedule import ChunkTable, Schedule, check_chunks, recv, recv_reduce, send

from ._innetwork import check_topology, fallback_schedule, finish, nbytes_of, runtime_pieces
from ._pipeline import Lane, lane, memo, pipelined_phase
from ._uneven import serves_uneven


class DomainRows(NamedTuple):
    """The member arrays the NVLS stages' lanes read, made once for (D, N) GPU members and (D,) switch members
    and shared by the lanes of every stage built from them (lanes are only read)."""

    switches: np.ndarray  # (D,) switch members
    flat: np.ndarray  # the GPU members, domain by domain
    switch_of: np.ndarray  # per flat GPU: its domain's switch
    local: np.ndarray  # per flat GPU: its index in its domain
    columns: np.ndarray  # (N, D): row j is GPU j of every domain (contiguous, as a lane keeps its members)


def domain_rows(gpus: np.ndarray, switches: np.ndarray) -> DomainRows:
    """DomainRows of (D, N) GPU members `gpus` and (D,) switch members `switches`."""
    gpus = np.asarray(gpus, np.int64)
    D, N = gpus.shape
    switches = np.asarray(switches, np.int64)
    return DomainRows(switches, gpus.ravel(), np.repeat(switches, N), np.tile(np.arange(N, dtype=np.int64), D),
                      np.ascontiguousarray(gpus.T))


def _lags(lag: int, n: int) -> np.ndarray:
    """Every member's lag, one array for the lanes of a stage (as lane() writes out a scalar lag)."""
    return np.full(n, lag, np.int64)


def reduce_lanes(gpus, switches, lag: int, piece, rows: DomainRows | None = None,
                 count: int | None = None) -> list[Lane]:
    """Every GPU sends `piece(k)` to its switch, which reduce-receives the N copies in the same round. `rows`:
    domain_rows(gpus, switches), where the caller builds several stages over them; `count`: the chunk count of
    every piece (or part, in the stages that move parts), where the caller knows it is one number."""
    r = domain_rows(gpus, switches) if rows is None else rows
    whole = lambda k, at: piece(k)  # noqa: E731  (every member moves the same chunk range)
    lanes = [lane(send, r.flat, r.switch_of, _lags(lag, r.flat.size), whole, count=count)]
    at_switch = _lags(lag, r.switches.size)
    lanes += [lane(recv if i == 0 else recv_reduce, r.switches, column, at_switch, whole, count=count)
              for i, column in enumerate(r.columns)]
    return lanes


def scatter_lanes(gpus, switches, lag: int, part, rows: DomainRows | None = None,
                  count: int | None = None) -> list[Lane]:
    """The switch sends GPU j its part `part(k, j)` of piece k; GPU j stores it."""
    r = domain_rows(gpus, switches) if rows is None else rows
    at_switch = _lags(lag, r.switches.size)
    lanes = [lane(send, r.switches, column, at_switch, lambda k, at, i=i: part(k, i), count=count)
             for i, column in enumerate(r.columns)]
    lanes.append(lane(recv, r.flat, r.switch_of, _lags(lag, r.flat.size), lambda k, at: part(k, r.local[at]),
                      count=count))
    return lanes


def gather_lanes(gpus, switches, lag: int, part, rows: DomainRows | None = None,
                 count: int | None = None) -> list[Lane]:
    """GPU j sends its part `part(k, j)` to the switch, which stores every GPU's part."""
    r = domain_rows(gpus, switches) if rows is None else rows
    lanes = [lane(send, r.flat, r.switch_of, _lags(lag, r.flat.size), lambda k, at: part(k, r.local[at]),
                  count=count)]
    at_switch = _lags(lag, r.switches.size)
    lanes += [lane(recv, r.switches, column, at_switch, lambda k, at, i=i: part(k, i), count=count)
              for i, column in enumerate(r.columns)]
    return lanes


def multicast_lanes(gpus, switches, lag: int, piece, rows: DomainRows | None = None,
                    count: int | None = None) -> list[Lane]:
    """The switch sends `piece(k)` to every GPU of its domain (one multicast: every GPU, the senders' too)."""
    r = domain_rows(gpus, switches) if rows is None else rows
    whole = lambda k, at: piece(k)  # noqa: E731
    at_switch = _lags(lag, r.switches.size)
    lanes = [lane(send, r.switches, column, at_switch, whole, count=count) for column in r.columns]
    lanes.append(lane(recv, r.flat, r.switch_of, _lags(lag, r.flat.size), whole, count=count))
    return lanes


def slice_part(n: int, pieces: int):
    """In a slice-major table (blocks = n slices, sub = pieces), piece k is chunks [k n, (k+1) n) and GPU j's
    part is its overlap with slice j, [j pieces, (j+1) pieces) (empty in most pieces when pieces > 1)."""

    def piece(k):
        return k * n, n

    def part(k, j):
        lo = np.maximum(j * pieces, k * n)
        hi = np.minimum((j + 1) * pieces, (k + 1) * n)
        return lo, np.maximum(hi - lo, 0)

    return piece, part


def nvls_members(topology) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(node ids of the members: every rank, then every domain switch; GPU members (D, G); switch members (D,))."""
    N, D = topology.world_size, topology.num_domains
    nodes = np.concatenate([np.arange(N, dtype=np.int64), topology.nvswitches()])
    return nodes, topology.domain_groups(), N + np.arange(D, dtype=np.int64)


def nvls_phase(collective: str, topology, work: int, pieces: int):
    """The NVLS phase of `collective` in every domain of `topology` at once (work: the work buffer)."""
    # the members do not depend on the size: kept across a sweep's sizes (the arrays are only read)
    nodes, gpus, switches = memo(topology, ("nvls members",), lambda: nvls_members(topology))
    n = topology.gpus_per_domain
    if collective == "allreduce":  # piece-major: piece k = parts k n .. k n + n - 1, part j = 1/n of the piece
        table = ChunkTable.whole(work, pieces, n, groups=1)
        piece = lambda k: (k * n, n)  # noqa: E731
        part = lambda k, j: (k * n + j, 1)  # noqa: E731

        def allreduce_lanes():
            rows = domain_rows(gpus, switches)
            return reduce_lanes(gpus, switches, 0, piece, rows, n) + \
                scatter_lanes(gpus, switches, 1, part, rows, 1) + gather_lanes(gpus, switches, 2, part, rows, 1) + \
                multicast_lanes(gpus, switches, 3, piece, rows, n)

        lanes = memo(topology, ("nvls allreduce",), allreduce_lanes)
        return pipelined_phase("NVLS allreduce", nodes, table, lanes, pieces, piece_invariant=True)
    table = ChunkTable.whole(work, n, pieces)  # slice j: every domain's GPU j (the same range in every domain)
    piece, part = slice_part(n, pieces)
    if collective == "reduce_scatter":
        lanes = memo(topology, ("nvls reduce-scatter", pieces), lambda: reduce_lanes(gpus, switches, 0, piece) +
                     scatter_lanes(gpus, switches, 1, part))
        return pipelined_phase("NVLS reduce-scatter", nodes, table, lanes, pieces)
    lanes = memo(topology, ("nvls allgather", pieces), lambda: gather_lanes(gpus, switches, 0, part) +
                 multicast_lanes(gpus, switches, 1, piece))
    return pipelined_phase("NVLS allgather", nodes, table, lanes, pieces)


@register("nvls", ("allreduce", "reduce_scatter", "allgather"), needs_topology=True,
          summary="NVLink SHARP in one domain: the switch reduces (reduce-scatter) and multicasts (allgather); "
                  "allreduce pipelines both per piece; `chunks` pieces (default: NCCL's chunking)")
@serves_uneven("nvls")
def build_nvls(collective: str, world_size: int, count: int, *, root=None, topology=None, dtype="float32",
               op: str = "sum", chunks: int | None = None, protocol: str = "Simple",
               fallback: str = "ring") -> Schedule:
    check_topology("nvls", topology, world_size)
    if topology.num_domains != 1:
        raise ValueError(f"nvls reduces inside one NVLink domain, and {topology.name!r} has "
                         f"{topology.num_domains} domains: use nvls_tree, or hierarchical with intra=nvls, to "
                         "reduce across domains (Python: algorithm='hierarchical', intra='nvls'; command line: "
                         "--algorithms nvls_tree or --algorithms hierarchical:intra=nvls)")
    reason = topology.nvls.refusal(op, dtype)
    if reason is not None:
        return fallback_schedule("nvls", "NVLS", reason, fallback, [], collective=collective, world_size=world_size,
                                 count=count, root=None, chunks=chunks, dtype=str(dtype), op=op, topology=topology)
    work = count * world_size if collective == "allgather" else count
    if chunks is None:
        c = runtime_pieces(topology, "nvls", nbytes_of(work, dtype))
    else:
        c = check_chunks("nvls", chunks)
    sched = Schedule("nvls", collective, world_size, count, [nvls_phase(collective, topology, work, c)],
                     params={"chunks": c, "dtype": str(dtype), "op": op, "latency_class": "nvls",
                             "accumulator": topology.nvls.accumulator(dtype), **_channels(topology)})
    finish(sched, topology, topology.nvswitches())
    return sched


def _channels(topology) -> dict:
    rt = getattr(topology, "runtime", None)
    return {"channels": rt.nvls_channels} if rt is not None else {}


__all__ = ["DomainRows", "domain_rows", "gather_lanes", "multicast_lanes", "nvls_members", "nvls_phase",
           "reduce_lanes", "scatter_lanes", "slice_part"]
