"""Copy and reduce rounds between ranks that share a core and ranks that do not.

    mpiexec -bind-to core -n 4 python bench/core_pairs.py [--shifts 1 2] [--repeat 2] [--sizes 1M 4M 16M 64M]

Times `collectives calibrate`'s shared-memory rounds (benchmark.calibrate.window_exchange: mirror a piece into
the window, publish, wait for the peer's publish, land or reduce the piece the peer mirrored; every rank at once)
with each rank's peer `shift` places to its left, alternating the shifts `--repeat` times so that both see the
same states of the machine. Prints, per shift, whether each rank's peer shares its CPU (from the ranks'
affinities: with `-bind-to core` and 4 ranks on 2 cores, rank r runs on core r mod 2, so shift 2 pairs ranks on
one core) and the microseconds per piece (D / p bytes) of a copy round and a reduce round at each size D.
Calibration uses shift 1 only; this shows what a schedule whose partners share a core (Rabenseifner's second
exchange at p = 4) gets that the calibration does not see.
"""

from __future__ import annotations

import argparse
import os
import sys

from collectives.units import human, parse_size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shifts", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=2, help="passes over the shifts (default 2)")
    ap.add_argument("--sizes", nargs="+", default=["1M", "4M", "16M", "64M"])
    args = ap.parse_args(argv)
    from collectives.benchmark.calibrate import window_exchange
    from collectives.transport import init

    sizes = [parse_size(s) for s in args.sizes]
    comm = init(check="off")
    try:
        mpi, p = comm.mpi_comm, comm.size
        if p < 2:
            print("core_pairs.py: run it under mpiexec with 2 or more ranks", file=sys.stderr)
            return 2
        cpus = mpi.allgather(sorted(os.sched_getaffinity(0)))
        rows = []
        for _ in range(args.repeat):
            for shift in args.shifts:
                out, _sync = window_exchange(mpi, sizes, peer_shift=shift)
                rows.append((shift, out))
        if comm.rank == 0:
            print(f"# {p} ranks; CPUs per rank: {cpus}")
            for shift in args.shifts:
                shared = sum(cpus[r] == cpus[(r - shift) % p] and len(cpus[r]) == 1 for r in range(p))
                print(f"# shift {shift}: {shared} of {p} ranks share their one CPU with their peer")
            print("| shift | " + " | ".join(f"{human(d)} copy / reduce (us)" for d in sizes) + " |")
            print("|---:|" + "---:|" * len(sizes))
            for shift, out in rows:
                cells = [f"{a * 1e6:.0f} / {b * 1e6:.0f}" for (_, a), (_, b) in
                         zip(out["copy_round"], out["reduce_round"], strict=True)]
                print(f"| {shift} | " + " | ".join(cells) + " |")
        return 0
    finally:
        comm.close()


if __name__ == "__main__":
    sys.exit(main())
