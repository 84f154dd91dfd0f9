"""The contract of each collective: buffer sizes, where inputs go and where outputs come from.

Every executor reads these rules and no executor knows a particular algorithm. Under the position invariant
(see ops.py) the work buffer holds the collective's logical vector:

| collective     | input (per rank) | work buffer | rank r's input lands at | rank r's output is   |
|----------------|------------------|-------------|-------------------------|----------------------|
| allreduce      | count            | count       | [0, count)              | [0, count)           |
| reduce_scatter | count = p*k      | p*k         | [0, p*k)                | [r*k, (r+1)*k)       |
| allgather      | count = k        | p*k         | [r*k, (r+1)*k)          | [0, p*k)             |
| broadcast      | count            | count       | root only: [0, count)   | [0, count)           |
| reduce         | count            | count       | [0, count)              | root only: [0, count)|
"""

from __future__ import annotations

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")
ROOTED = ("broadcast", "reduce")
REDUCING = ("allreduce", "reduce_scatter", "reduce")


def check_collective(collective: str) -> None:
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; valid collectives: {', '.join(COLLECTIVES)}")


def check_shape(collective: str, world_size: int, count: int, root: int | None = None) -> None:
    """Raise ValueError naming what is wrong with (collective, world_size, count, root)."""
    check_collective(collective)
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be an integer >= 0 (elements of each rank's input), got {count!r}")
    if collective == "reduce_scatter" and count % world_size:
        raise ValueError(
            f"reduce_scatter count is each rank's input (p*k elements) and must divide by world_size={world_size}; "
            f"got count={count}")
    if collective in ROOTED:
        if root is None or not (0 <= root < world_size):
            raise ValueError(f"{collective} root must be in [0, {world_size}), got {root!r}")


def work_size(collective: str, world_size: int, count: int) -> int:
    return count * world_size if collective == "allgather" else count


def input_range(collective: str, world_size: int, count: int, rank: int, root: int | None) -> tuple[int, int] | None:
    """Where rank's input lands in the work buffer (None: its input is not read)."""
    if collective == "allgather":
        return rank * count, (rank + 1) * count
    if collective == "broadcast":
        return (0, count) if rank == root else None
    return 0, count


def output_range(collective: str, world_size: int, count: int, rank: int, root: int | None) -> tuple[int, int] | None:
    """Where rank's output is read from the work buffer (None: it has no output)."""
    if collective == "reduce_scatter":
        k = count // world_size
        return rank * k, (rank + 1) * k
    if collective == "allgather":
        return 0, count * world_size
    if collective == "reduce":
        return (0, count) if rank == root else None
    return 0, count


def output_count(collective: str, world_size: int, count: int) -> int:
    """Elements of each rank's output array."""
    if collective == "reduce_scatter":
        return count // world_size
    if collective == "allgather":
        return count * world_size
    return count
