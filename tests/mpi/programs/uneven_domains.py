"""Run under mpiexec: hierarchical allreduces (and hierarchical reduce_scatter and allgather,
hierarchical_alltoall(v)) on domains given by `--domains` (JSON: a list of domain sizes or of rank lists, passed
to collectives.init as ranks_per_domain), checked against MPI's own Allreduce (Reduce_scatter_block, Allgather,
Alltoall, Alltoallv).

Every case must equal MPI_Allreduce bitwise for int32/int64 and within float32's bound for float32 sums, be
bitwise identical on every rank, and run the schedule asked for (the communicator's topology must show the
domains given). Prints one line `RESULT {json}` on rank 0; exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

import numpy as np
from mpi4py import MPI

from collectives.transport import init

CASES = [
    ("hierarchical", {}),  # NVLS reduce-scatter, SHARP, NVLS allgather: the default stages
    ("hierarchical", {"inter": "ring"}),
    ("hierarchical", {"inter": "double_binary_tree"}),
    ("hierarchical", {"intra": "ring", "inter": "rabenseifner"}),
    ("nvls_tree", {}),
    ("collnet_direct", {}),
    ("collnet_chain", {}),
]
DTYPES = [np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.float32)]
MPI_TYPES = {"int32": MPI.INT32_T, "int64": MPI.INT64_T, "float32": MPI.FLOAT}


def random_input(dtype: np.dtype, n: int, seed: int) -> np.ndarray:
    """n elements: integers in [-100, 100) for integer dtypes, standard normal values otherwise."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-100, 100, n) if dtype.kind == "i" else rng.standard_normal(n)).astype(dtype)


def sum_error_bound(mpi, x: np.ndarray, p: int) -> np.ndarray:
    """Per element, how far a float32 sum of the p ranks' x in another order may be from MPI's: p * eps * sum|x|."""
    return p * np.finfo(np.float32).eps * mpi.allreduce(np.abs(x).astype(np.float64), op=MPI.SUM)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--domains", required=True, help="JSON: ranks_per_domain for collectives.init")
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 7, 1000])
    args = parser.parse_args()
    layout = json.loads(args.domains)
    comm = init(ranks_per_domain=layout)
    p, rank = comm.size, comm.rank
    mpi = comm.mpi_comm
    failures: list[str] = []
    cases = 0
    topo = comm._ctx.topology
    groups = topo.domain_groups()
    seen = sorted((row[row >= 0].tolist() for row in groups), key=min)
    if seen != comm.domains:
        failures.append(f"topology domains {seen} differ from the communicator's {comm.domains}")
    for algorithm, params in CASES:
        for dtype in DTYPES:
            for count in args.counts:
                cases += 1
                x = random_input(dtype, count, 1000 * rank + count)
                try:
                    got = comm.allreduce(x, algorithm=algorithm, **params)
                    ran = comm.last_choice.algorithm if comm.last_choice is not None else None
                    ref = np.empty_like(x)
                    mpi.Allreduce([x, MPI_TYPES[dtype.name]], [ref, MPI_TYPES[dtype.name]], op=MPI.SUM)
                    everyone = mpi.allgather(got.tobytes())
                    if ran != algorithm:
                        failures.append(f"{algorithm} {params}: ran {ran}")
                    if any(b != everyone[0] for b in everyone):
                        failures.append(f"{algorithm} {params} {dtype} n={count}: ranks disagree")
                    if dtype.kind == "i":
                        ok = np.array_equal(got, ref)
                    else:  # float32 sums of p terms in another order: p * eps * sum(|x|)
                        bound = sum_error_bound(mpi, x, p)
                        ok = bool(np.all(np.abs(got.astype(np.float64) - ref) <= bound + 1e-30))
                    if not ok:
                        failures.append(f"{algorithm} {params} {dtype} n={count}: differs from MPI_Allreduce")
                except Exception:  # noqa: BLE001  (reported, then the job fails)
                    failures.append(f"{algorithm} {params} {dtype} n={count}: {traceback.format_exc(limit=3)}")
    for dtype in DTYPES:  # reduce_scatter: the core's allreduce, each extra's block back (algorithms/_uneven.py)
        for k in (1, 300):
            cases += 1
            x = random_input(dtype, p * k, 7 * rank + k)
            try:
                got = comm.reduce_scatter(x, algorithm="hierarchical")
                ref = np.empty(k, dtype)
                mpi.Reduce_scatter_block([x, MPI_TYPES[dtype.name]], [ref, MPI_TYPES[dtype.name]], op=MPI.SUM)
                if dtype.kind == "i":
                    ok = np.array_equal(got, ref)
                else:
                    bound = sum_error_bound(mpi, x, p)
                    ok = bool(np.all(np.abs(got.astype(np.float64) - ref) <= bound[rank * k:(rank + 1) * k] + 1e-30))
                if not ok:
                    failures.append(f"hierarchical reduce_scatter {dtype} k={k}: differs from Reduce_scatter_block")
            except Exception:  # noqa: BLE001
                failures.append(f"hierarchical reduce_scatter {dtype} k={k}: {traceback.format_exc(limit=3)}")
    for params in ({}, {"inter": "ring"}):  # allgather: blocks to their holders in the core, the result to extras
        for dtype in DTYPES:
            for k in (1, 300):
                cases += 1
                x = random_input(dtype, k, 13 * rank + k)
                try:
                    got = comm.allgather(x, algorithm="hierarchical", **params)
                    ref = np.empty(p * k, dtype)
                    mpi.Allgather([x, MPI_TYPES[dtype.name]], [ref, MPI_TYPES[dtype.name]])
                    if got.tobytes() != ref.tobytes():
                        failures.append(f"hierarchical {params} allgather {dtype} k={k}: differs from MPI_Allgather")
                except Exception:  # noqa: BLE001
                    failures.append(f"hierarchical {params} allgather {dtype} k={k}: {traceback.format_exc(limit=3)}")
    for dtype in DTYPES:  # hierarchical_alltoall(v): per-rank tables over the placed domains (_alltoall_placed.py)
        for k in (1, 300):
            cases += 1
            x = random_input(dtype, p * k, 11 * rank + k)
            try:
                got = comm.alltoall(x, algorithm="hierarchical_alltoall")
                ref = np.empty_like(x)
                mpi.Alltoall([x, MPI_TYPES[dtype.name]], [ref, MPI_TYPES[dtype.name]])
                if got.tobytes() != ref.tobytes():
                    failures.append(f"hierarchical_alltoall {dtype} k={k}: differs from MPI_Alltoall")
            except Exception:  # noqa: BLE001
                failures.append(f"hierarchical_alltoall {dtype} k={k}: {traceback.format_exc(limit=3)}")
    cases += 1
    send_counts = np.random.default_rng(rank).integers(0, 5, p)
    x = np.arange(int(send_counts.sum()), dtype=np.int64) + 1000 * rank
    try:
        recv_counts = np.array(mpi.alltoall(send_counts.tolist()))
        got = comm.alltoallv(x, send_counts, recv_counts, algorithm="hierarchical_alltoall")
        ref = np.empty(int(recv_counts.sum()), np.int64)
        mpi.Alltoallv([x, (send_counts, np.cumsum(send_counts) - send_counts), MPI.INT64_T],
                      [ref, (recv_counts, np.cumsum(recv_counts) - recv_counts), MPI.INT64_T])
        if not np.array_equal(got, ref):
            failures.append("hierarchical_alltoall alltoallv: differs from MPI_Alltoallv")
    except Exception:  # noqa: BLE001
        failures.append(f"hierarchical_alltoall alltoallv: {traceback.format_exc(limit=3)}")
    failures = [f for fs in mpi.allgather(failures) for f in fs]
    if rank == 0:
        result = {"world_size": p, "domains": comm.domains, "cases": cases, "failures": len(failures),
                  "messages": failures[:10], "domain_sizes": list(topo.domain_sizes)}
        print("RESULT " + json.dumps(result), flush=True)
    comm.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
