"""How far apart this host's cores are, over time: a cache-line ping-pong between two ranks, and a copy round.

    mpiexec -bind-to core -n 2 python bench/core_to_core.py [--seconds 60] [--every 2] [--size 4M]

Every `--every` seconds rank 0 and a rank on another core bounce a counter in an MPI-3 shared window with the
plan runner's own PUBLISH / WAIT instructions (collectives.benchmark.host_state, the probe `collectives
calibrate` and `bench --predict` use), and print the one-way time, then time `collectives calibrate`'s copy
round at `--size` (benchmark.calibrate.window_exchange). On a physical machine the first number is fixed (tens
of ns between cores of one L3, a few hundred across sockets or chiplets). On a VM the hypervisor may move the
vCPUs: on the 2-vCPU EPYC VM this project is developed on it switched between ~25-60 ns and ~205-250 ns within
seconds, and the copy round with it, which is why `bench/fidelity.py` pairs each launch's prediction with its
own measurement.
"""

from __future__ import annotations

import argparse
import sys
import time

from collectives.units import human, parse_size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to watch (default 60)")
    ap.add_argument("--every", type=float, default=2.0, help="seconds between probes (default 2)")
    ap.add_argument("--size", default="4M", help="buffer size D of the copy round (default 4M; 0: skip it)")
    args = ap.parse_args(argv)
    from collectives.benchmark.calibrate import window_exchange
    from collectives.benchmark.host_state import CoreDistance
    from collectives.transport import init

    comm = init(check="off")
    try:
        mpi = comm.mpi_comm
        distance = CoreDistance(mpi)
        if not distance.possible:
            if comm.rank == 0:
                print("core_to_core.py: needs two ranks on different CPUs of one host and the C plan runner "
                      "(mpiexec -bind-to core -n 2 python bench/core_to_core.py)", file=sys.stderr)
            return 2
        size = parse_size(args.size)
        start = time.perf_counter()
        if comm.rank == 0:
            print("#  time(s)  one-way(ns)" + (f"  copy round at {human(size)} (us per piece)" if size else ""))
        while True:
            one_way = distance.measure()
            copy = window_exchange(mpi, [size], quick=True)[0]["copy_round"][0][1] if size else 0.0
            elapsed = time.perf_counter() - start
            if comm.rank == 0:
                print(f"{elapsed:9.1f}  {one_way * 1e9:11.0f}" + (f"  {copy * 1e6:12.1f}" if size else ""),
                      flush=True)
            if mpi.bcast(elapsed + args.every > args.seconds, root=0):
                break
            time.sleep(args.every)
        distance.close()
    finally:
        comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
