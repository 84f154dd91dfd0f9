"""Allreduce over MPI: the library's schedules vs MPI's own Allreduce, size by size, in the same run.

    mpiexec -n 4 python bench/bench_mpi.py [--sizes 8 1M 64M] [--algorithms auto ring direct:chunks=2]
            [--dtype float32] [--trials 7] [--seconds 0.04] [--check] [--all] [--comm-check off] [--inplace]

Noise-robust: for every size the candidates (MPI's own Allreduce, `auto`, each algorithm) are measured in
*interleaved* trials (native, auto, algo1, ..., then again), each trial a timed loop of the same number of calls
on every rank; a trial's time is the slowest rank's mean per call. busbw = bytes * 2(p-1)/p / time (NCCL's
convention) from the median trial; a ratio is the median over trials of t_native / t_candidate, paired within
the trial (slow drifts of a shared machine cancel).

Prints a markdown table (size, native busbw, best algorithm and its busbw and ratio, auto's busbw, ratio and
choice); --all adds one column per algorithm. --check exits with status 1 unless the targets hold: the best
algorithm >= 1.2x native for 1-16 MiB, auto >= 0.9x native at every size measured.
`--comm-check` sets the communicator's call agreement (collectives.init(check=...)); default: the library's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import collectives.algorithms as algorithms
import numpy as np
from mpi4py import MPI

from collectives.kernels._dtypes import SUPPORTED_DTYPES, dtype_name
from collectives.transport import init

DEFAULT_SIZES = ["8", "64", "512", "4K", "32K", "128K", "256K", "512K", "1M", "2M", "4M", "8M", "16M", "32M",
                 "64M"]
DEFAULT_ALGOS = ["auto", "ring", "rabenseifner", "direct", "recursive_doubling"]
BEST_RANGE = (1 << 20, 16 << 20)  # sizes where the best algorithm must reach BEST_TARGET
BEST_TARGET, AUTO_TARGET = 1.2, 0.9


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


def human(n: int) -> str:
    for unit, m in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}"
    return f"{n} B"


def parse_algo(spec: str) -> tuple[str, dict]:
    name, _, rest = spec.partition(":")
    params = {k: int(v) for k, v in (kv.split("=") for kv in rest.split(",") if kv)}
    return name, params


def label(name: str, params: dict) -> str:
    return name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")


def calibrate(mpi, fn, budget: float) -> int:
    """Calls per trial, the same on every rank: about `budget` seconds on the slowest rank."""
    fn()  # warm-up: builds and caches the schedule, grows buffers
    mpi.Barrier()
    t = time.perf_counter()
    fn()
    fn()
    one = mpi.allreduce((time.perf_counter() - t) / 2, op=MPI.MAX)
    return max(2, min(2000, int(budget / max(one, 1e-7))))


def trial(mpi, fn, iters: int) -> float:
    mpi.Barrier()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return mpi.allreduce((time.perf_counter() - t) / iters, op=MPI.MAX)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES)
    ap.add_argument("--algorithms", nargs="+", default=DEFAULT_ALGOS,
                    help="'auto' and registered algorithms, with parameters as name:key=value,...")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--trials", type=int, default=7, help="interleaved trials per size (median reported)")
    ap.add_argument("--seconds", type=float, default=0.04, help="time per trial per candidate")
    ap.add_argument("--check", action="store_true", help="exit 1 unless the speed targets hold")
    ap.add_argument("--all", action="store_true", help="one column per algorithm too")
    ap.add_argument("--inplace", action="store_true", help="in-place calls (MPI_IN_PLACE / out=x) for everyone")
    ap.add_argument("--comm-check", default=None, choices=["metadata", "full", "off"],
                    help="the communicator's call agreement (default: COLLECTIVES_CHECK or the library default)")
    args = ap.parse_args()
    comm = init(check=args.comm_check) if args.comm_check else init()
    mpi, p, rank = comm.mpi_comm, comm.size, comm.rank
    dtype = {dtype_name(d): d for d in SUPPORTED_DTYPES}[args.dtype]
    specs = [parse_algo(a) for a in args.algorithms]
    specs = [(n, prm) for n, prm in specs if n == "auto" or n in algorithms.names("allreduce")]
    has_auto = any(n == "auto" for n, _ in specs)
    algos = [(n, prm) for n, prm in specs if n != "auto"]
    out = sys.stdout
    if rank == 0:
        mode = getattr(comm, "check", "n/a")
        print(f"allreduce {args.dtype}, {p} ranks, {MPI.Get_library_version().splitlines()[0].strip()}; busbw GB/s, "
              f"median of {args.trials} interleaved trials; call agreement: {mode}"
              f"{'; in place' if args.inplace else ''}", file=out)
        cols = ["size", "native GB/s", "best algorithm", "best GB/s", "best/native"]
        if has_auto:
            cols += ["auto GB/s", "auto/native", "auto chose"]
        if args.all:
            cols += [f"{label(n, prm)} GB/s (x)" for n, prm in algos]
        print("| " + " | ".join(cols) + " |", file=out)
        print("|" + "|".join("---:" if i and c != "best algorithm" and c != "auto chose" else "---"
                             for i, c in enumerate(cols)) + "|", file=out, flush=True)
    missed = []
    for s in args.sizes:
        nbytes = parse_size(s)
        n = max(1, nbytes // dtype.itemsize)
        nbytes = n * dtype.itemsize
        x = np.ones(n, dtype)
        out_buf = np.empty_like(x)
        factor = nbytes * 2 * (p - 1) / p if p > 1 else nbytes

        if args.inplace:  # both in place: MPI_IN_PLACE vs out=x (no copy of the input into the output)
            cands: list[tuple[str, object]] = [("native", lambda b=out_buf: mpi.Allreduce(MPI.IN_PLACE, b, MPI.SUM))]
            for name, prm in specs:
                cands.append((label(name, prm), lambda name=name, prm=prm, b=out_buf: comm.allreduce(
                    b, out=b, algorithm=name, **prm)))
        else:
            cands = [("native", lambda x=x, b=out_buf: mpi.Allreduce(x, b, MPI.SUM))]
            for name, prm in specs:
                cands.append((label(name, prm),
                              lambda name=name, prm=prm, x=x, b=out_buf: comm.allreduce(x, out=b, algorithm=name,
                                                                                      **prm)))
        iters = [calibrate(mpi, fn, args.seconds) for _, fn in cands]
        times: list[list[float]] = [[] for _ in cands]
        for _ in range(args.trials):
            for i, (_, fn) in enumerate(cands):
                times[i].append(trial(mpi, fn, iters[i]))
        choice = None
        if has_auto:
            comm.allreduce(x, out=out_buf, algorithm="auto")
            choice = comm.last_choice
        if rank != 0:
            continue
        med = [statistics.median(t) for t in times]
        ratio = [statistics.median(tn / tc for tn, tc in zip(times[0], t, strict=True)) for t in times]
        bw = [factor / m / 1e9 for m in med]
        names = [c[0] for c in cands]
        algo_idx = [i for i, nm in enumerate(names) if nm not in ("native", "auto")]
        best = max(algo_idx, key=lambda i: ratio[i]) if algo_idx else None
        row = [human(nbytes), f"{bw[0]:.3f}"]
        row += [names[best], f"{bw[best]:.3f}", f"{ratio[best]:.2f}x"] if best is not None else ["-", "-", "-"]
        if has_auto:
            a = names.index("auto")
            row += [f"{bw[a]:.3f}", f"{ratio[a]:.2f}x", choice.algorithm if choice else "?"]
            if ratio[a] < AUTO_TARGET:
                missed.append(f"{human(nbytes)}: auto {ratio[a]:.2f}x < {AUTO_TARGET}x")
        if args.all:
            row += [f"{bw[i]:.3f} ({ratio[i]:.2f}x)" for i in algo_idx]
        if best is not None and BEST_RANGE[0] <= nbytes <= BEST_RANGE[1] and ratio[best] < BEST_TARGET:
            missed.append(f"{human(nbytes)}: best ({names[best]}) {ratio[best]:.2f}x < {BEST_TARGET}x")
        print("| " + " | ".join(row) + " |", file=out, flush=True)
    if rank == 0 and has_auto and choice is not None:
        print(f"\nauto's reason at the last size: {choice.reason}", file=out)
    status = 0
    if rank == 0 and args.check:
        if missed:
            print("\nTARGETS MISSED:\n  " + "\n  ".join(missed), file=out)
            status = 1
        else:
            print(f"\ntargets hold: best >= {BEST_TARGET}x native for 1-16 MiB, auto >= {AUTO_TARGET}x everywhere",
                  file=out)
    status = mpi.bcast(status, root=0)
    comm.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
