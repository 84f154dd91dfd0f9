"""The contract of each collective: buffer sizes, where inputs go, where outputs come from, and what they hold.

Every executor reads these rules and no executor knows a particular algorithm. By default a node's work buffer
holds the collective's logical vector (the position invariant, see ops.py); alltoall, whose output permutes its
input, keeps an input region and an output region side by side:

| collective     | input (per rank) | work buffer | rank r's input lands at | rank r's output is        |
|----------------|------------------|-------------|-------------------------|---------------------------|
| allreduce      | count            | count       | [0, count)              | [0, count)                |
| reduce_scatter | count = p*k      | p*k         | [0, p*k)                | [r*k, (r+1)*k)            |
| allgather      | count = k        | p*k         | [r*k, (r+1)*k)          | [0, p*k)                  |
| broadcast      | count            | count       | root only: [0, count)   | [0, count)                |
| reduce         | count            | count       | [0, count)              | root only: [0, count)     |
| alltoall       | count = p*k      | 2*p*k       | [0, p*k)                | [p*k, 2*p*k)              |
| alltoallv      | row r of counts  | R + C       | [0, R_r)                | [R, R + C_r)              |

alltoall: rank r's input is p blocks of k, block d for rank d; its output is p blocks, block s from rank s.
alltoallv: a p x p `counts` matrix (counts[s, d] elements go from rank s to rank d, known when the schedule is
built); rank r's input is counts[r, 0], ..., counts[r, p-1] elements in that order (R_r = its row's sum), its
output counts[0, r], ..., counts[p-1, r] (C_r = its column's sum); R and C are the largest row and column sums,
and `count` is R. A schedule may declare other regions (`schedule.regions`: an out-of-place input, scratch).

`output_blocks` says what each output element must hold: which ranks contributed and which element of their
inputs it stands for (the verifier checks both, so data moved to the wrong place fails).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall", "alltoallv")
ROOTED = ("broadcast", "reduce")
REDUCING = ("allreduce", "reduce_scatter", "reduce")
ALLTOALL = ("alltoall", "alltoallv")


def check_collective(collective: str) -> None:
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; valid collectives: {', '.join(COLLECTIVES)}")


def check_counts(counts, world_size: int) -> np.ndarray:
    """An alltoallv counts matrix as a (p, p) int64 array, or ValueError saying what is wrong."""
    try:
        arr = np.asarray(counts)
    except Exception:  # noqa: BLE001 - anything numpy cannot read is a bad matrix
        arr = np.zeros(0)
    if arr.shape != (world_size, world_size) or arr.dtype.kind not in "iu":
        raise ValueError(f"alltoallv counts must be a {world_size} x {world_size} matrix of integers (counts[s, d]: "
                         f"elements rank s sends to rank d), got {_shape_text(arr)}")
    if (arr < 0).any():
        s, d = (int(x) for x in np.argwhere(arr < 0)[0])
        raise ValueError(f"alltoallv counts must be >= 0, got counts[{s}, {d}] = {int(arr[s, d])}")
    return arr.astype(np.int64, copy=False)


def _shape_text(arr: np.ndarray) -> str:
    return f"shape {arr.shape} of {arr.dtype}" if arr.size else "nothing usable"


def alltoallv_count(counts: np.ndarray) -> int:
    """`count` of an alltoallv: the largest rank input (row sum)."""
    return int(counts.sum(axis=1).max(initial=0))


def check_shape(collective: str, world_size: int, count: int, root: int | None = None, counts=None) -> None:
    """Raise ValueError naming what is wrong with (collective, world_size, count, root, counts)."""
    check_collective(collective)
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if not isinstance(count, (int, np.integer)) or count < 0:
        raise ValueError(f"count must be an integer >= 0 (elements of each rank's input), got {count!r}")
    if collective in ("reduce_scatter", "alltoall") and count % world_size:
        raise ValueError(
            f"{collective} count is each rank's input (p*k elements) and must divide by world_size={world_size}; "
            f"got count={count}")
    if collective in ROOTED:
        if root is None or not (0 <= root < world_size):
            raise ValueError(f"{collective} root must be in [0, {world_size}), got {root!r}")
    if collective == "alltoallv":
        if counts is None:
            raise ValueError("alltoallv needs counts: a p x p matrix, counts[s, d] = elements rank s sends to rank d")
        m = check_counts(counts, world_size)
        if count != alltoallv_count(m):
            raise ValueError(f"alltoallv count must be the largest rank input (row sum of counts), "
                             f"{alltoallv_count(m)}, got {count}")
    elif counts is not None:
        raise ValueError(f"counts is for alltoallv only; {collective} takes count (got counts too)")


def block_size(collective: str, world_size: int, count: int) -> int:
    """k: elements per rank block of the contract (reduce_scatter and alltoall: count // p; allgather: count)."""
    if collective in ("reduce_scatter", "alltoall"):
        return count // world_size
    return count


def input_count(collective: str, world_size: int, count: int, rank: int, counts=None) -> int:
    """Elements of rank's input array."""
    if collective == "alltoallv":
        return int(np.asarray(counts)[rank].sum())
    return count


def output_count(collective: str, world_size: int, count: int, rank: int | None = None, counts=None) -> int:
    """Elements of each rank's output array (alltoallv: of `rank`'s; None: the largest)."""
    if collective == "reduce_scatter":
        return count // world_size
    if collective == "allgather":
        return count * world_size
    if collective == "alltoallv":
        cols = np.asarray(counts).sum(axis=0)
        return int(cols.max(initial=0) if rank is None else cols[rank])
    return count


def work_size(collective: str, world_size: int, count: int, counts=None) -> int:
    if collective == "allgather":
        return count * world_size
    if collective in ALLTOALL:
        return count + output_count(collective, world_size, count, None, counts)
    return count


def input_range(collective: str, world_size: int, count: int, rank: int, root: int | None,
                counts=None) -> tuple[int, int] | None:
    """Where rank's input lands in the work buffer (None: its input is not read)."""
    if collective == "allgather":
        return rank * count, (rank + 1) * count
    if collective == "broadcast":
        return (0, count) if rank == root else None
    if collective == "alltoallv":
        return 0, input_count(collective, world_size, count, rank, counts)
    return 0, count


def output_range(collective: str, world_size: int, count: int, rank: int, root: int | None,
                 counts=None) -> tuple[int, int] | None:
    """Where rank's output is read from the work buffer (None: it has no output)."""
    if collective == "reduce_scatter":
        k = count // world_size
        return rank * k, (rank + 1) * k
    if collective == "allgather":
        return 0, count * world_size
    if collective == "reduce":
        return (0, count) if rank == root else None
    if collective in ALLTOALL:
        return count, count + output_count(collective, world_size, count, rank, counts)
    return 0, count


class OutputBlock(NamedTuple):
    """Elements [offset, offset + length) of a rank's output hold element `index` on of the inputs of `ranks`
    (None: every rank, reduced)."""

    offset: int
    length: int
    ranks: tuple[int, ...] | None
    index: int


def output_blocks(collective: str, world_size: int, count: int, rank: int, root: int | None,
                  counts=None) -> list[OutputBlock]:
    """What rank's output must hold, block by block (empty when it has no output)."""
    p = world_size
    if collective == "reduce" and rank != root:
        return []
    if collective in ("allreduce", "reduce"):
        return [OutputBlock(0, count, None, 0)]
    if collective == "broadcast":
        return [OutputBlock(0, count, (int(root),), 0)]
    if collective == "reduce_scatter":
        k = count // p
        return [OutputBlock(0, k, None, rank * k)]
    if collective == "allgather":
        return [OutputBlock(q * count, count, (q,), 0) for q in range(p)]
    if collective == "alltoall":
        k = count // p
        return [OutputBlock(s * k, k, (s,), rank * k) for s in range(p)]
    m = np.asarray(counts)
    col = m[:, rank]
    out_at = np.concatenate(([0], np.cumsum(col)[:-1]))
    in_at = m[:, :rank].sum(axis=1)  # where block `rank` starts in each source's input
    return [OutputBlock(int(out_at[s]), int(col[s]), (s,), int(in_at[s])) for s in range(p)]


def displacements(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(send, recv) displacements of an alltoallv: send[s, d] is where block d starts in rank s's input,
    recv[s, d] where block s starts in rank d's output (exclusive prefix sums along rows and columns)."""
    m = np.asarray(counts, dtype=np.int64)
    send = np.cumsum(m, axis=1) - m
    recv = np.cumsum(m, axis=0) - m
    return send, recv
