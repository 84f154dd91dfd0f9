"""Measure which algorithm auto should run on this host: `collectives calibrate --decisions FILE`.

For each collective and size, MPI's own collective (called through the communicator, as auto would run it) and
every registered algorithm that runs here without a topology (plus a pipelined ring or tree where the buffer is large enough to pipeline) are timed against each
other in interleaved trials (compare.py), through the communicator's own path with its call agreement on, as a
user's call runs; the fastest (median over trials) wins the size. Consecutive sizes with the same winner make
one row of the decision table (collectives/decisions.py) that auto reads.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import decisions, registry
from ..kernels._dtypes import dtype_name
from .compare import COLLECTIVES, buffers, calls, compare, label

SIZES = [8, 64, 512, 4 << 10, 32 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20,
         16 << 20, 32 << 20, 64 << 20]
PIPELINE_PIECE = 512 << 10  # a pipelined candidate's pieces: about this many bytes of each rank's block


def candidate_specs(collective: str, nbytes: int, p: int) -> list[tuple[str, dict]]:
    """The library's candidates for each rank's `nbytes` of input: every registered algorithm that needs no
    topology, and the pipelined variant of ring (allreduce, reduce_scatter, allgather) or binomial (broadcast,
    reduce) when pieces of PIPELINE_PIECE fit several times."""
    out = [(name, {}) for name in registry.names(collective) if not registry.info(name).needs_topology]
    block = nbytes // p if collective in ("allreduce", "reduce_scatter") else nbytes
    chunks = min(32, block // PIPELINE_PIECE)
    pipelined = "ring" if collective in ("allreduce", "reduce_scatter", "allgather") else "binomial"
    if chunks >= 2 and pipelined in registry.names(collective):
        out.append((pipelined, {"chunks": int(chunks)}))
    return out


def measure(comm, collectives=COLLECTIVES, sizes=SIZES, dtype=None, trials: int = 5, seconds: float = 0.02,
            log=None) -> list[dict]:
    """Decision tables (decisions.py's document format) for this communicator's rank count and host (collective
    over comm). `log(text)` is told each collective and size as it goes (rank 0 prints it)."""
    import numpy as np

    dtype = np.dtype(np.float32) if dtype is None else np.dtype(dtype)
    p, mpi = comm.size, comm.mpi_comm
    host = comm.host
    transport = "shm" if comm.shared_memory else "net"
    tables = []
    for collective in collectives:
        winners = []
        for nbytes in sizes:
            n = max(1, nbytes // dtype.itemsize)
            if collective in ("reduce_scatter", "alltoall"):  # an equal block per rank
                n = max(1, n // p) * p
            elems = n * p if collective == "allgather" else n  # compare.buffers takes nccl-tests' sizes
            x, out = buffers(collective, elems, p, dtype)
            # MPI's own collective as auto would run it: through the communicator's plan, with its call agreement
            # (raw MPI, candidate 0, is only the yardstick: at 8 B the agreement costs several times the call)
            specs = [*candidate_specs(collective, x.nbytes, p), ("native", {})]
            result = compare(mpi, calls(comm, collective, x, out, specs), trials, seconds)
            best = max(range(1, len(result.labels)), key=result.ratio)
            name, params = specs[best - 1]
            winners.append((x.nbytes, name, params))
            if log is not None:
                log(f"{collective} {x.nbytes} B per rank: {label(name, params)} "
                    f"({result.median(best) * 1e6:.1f} us; MPI's own {result.median(0) * 1e6:.1f} us)")
        rows: list[list] = []
        for nbytes, name, params in winners:
            if rows and rows[-1][1] == name and rows[-1][2] == params:
                continue
            if rows:
                rows[-1][0] = nbytes  # the previous winner holds below the first size this one won
            rows.append([None, name, params])
        tables.append({"collective": collective, "transport": transport, "ranks": p,
                       "oversubscribed": host.oversubscribed, "rows": rows})
    return tables


def save(tables: list[dict], path: str | Path, source: str) -> Path:
    """Write `tables` into the decisions file at `path`, replacing the tables of the same collective, transport,
    rank count and oversubscription it already holds (so runs at several rank counts accumulate)."""
    path = Path(path)
    kept: list[dict] = []
    if path.exists():
        old = json.loads(path.read_text())
        decisions.parse(old, str(path))  # refuse to overwrite what is not a decisions file
        keys = {(t["collective"], t["transport"], t["ranks"], t["oversubscribed"]) for t in tables}
        kept = [t for t in old.get("tables", []) if (t["collective"], t["transport"], t["ranks"],
                                                       t["oversubscribed"]) not in keys]
    doc = decisions.document(kept + tables, source)
    decisions.parse(doc, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def describe(comm, dtype) -> str:
    """Where a table was measured, for its `source`."""
    from ..transport.mpi_library import MPI

    h = comm.host
    return (f"collectives calibrate --decisions: {comm.size} ranks, {h.ranks_per_host} per host on {h.cores} cores, "
            f"{dtype_name(dtype)}, {MPI.Get_library_version().splitlines()[0].strip()}")


__all__ = ["SIZES", "candidate_specs", "describe", "measure", "save"]
