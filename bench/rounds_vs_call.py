"""calibrate's window rounds against the call they price, alternated in one launch (docs/benchmarks.md,
"Session 10").

    mpiexec -bind-to core -n 2 python bench/rounds_vs_call.py [--mib 4] [--pairs 15]

Each pair measures calibrate's copy and reduce rounds at one size (`calibrate.window_exchange`, as
`collectives calibrate` does) and then times ring allreduce of that size in place (median of 20 after a barrier,
the slowest rank, as `collectives bench --stat median`), seconds apart, with the cores' distance probed first.
The ring's price from those rounds is (p - 1) x (copy round + reduce round): the two columns differ by what
the calibration does not carry over to the call, apart from a change of the host's state between them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=4, help="allreduce size (default 4 MiB)")
    ap.add_argument("--pairs", type=int, default=15)
    args = ap.parse_args()

    from mpi4py import MPI

    import collectives
    from collectives.benchmark.calibrate import window_exchange
    from collectives.benchmark.host_state import CoreDistance

    comm = collectives.init()
    ctl = MPI.COMM_WORLD.Dup()
    p = ctl.size
    size = args.mib << 20
    x = np.arange(size // 4, dtype=np.float32) % 7
    distance = CoreDistance(ctl)

    def ring_time() -> float:
        for _ in range(5):
            comm.allreduce(x, out=x, algorithm="ring")
        own = np.empty(20)
        for k in range(own.size):
            ctl.Barrier()
            t0 = time.perf_counter()
            comm.allreduce(x, out=x, algorithm="ring")
            own[k] = time.perf_counter() - t0
        slowest = np.empty_like(own)
        ctl.Allreduce(own, slowest, MPI.MAX)
        return statistics.median(slowest.tolist())

    if ctl.rank == 0:
        print(f"# {args.mib} MiB, {p} ranks: core-to-core one way, calibrate's rounds (us per piece), ring's price "
              "from them and ring measured (us)")
    for pair in range(args.pairs):
        apart = distance.measure()
        rounds, _ = window_exchange(ctl, sizes=[size])
        copy, reduce = rounds["copy_round"][0][1], rounds["reduce_round"][0][1]
        measured = ring_time()
        if ctl.rank == 0:
            price = (p - 1) * (copy + reduce)
            where = f"{apart * 1e9:5.0f} ns" if apart is not None else "    -   "
            print(f"{pair:3d}  {where}  copy {copy * 1e6:7.1f}  reduce {reduce * 1e6:7.1f}  price {price * 1e6:7.0f}  "
                  f"ring {measured * 1e6:7.0f}  ({price / measured - 1:+.0%})", flush=True)
    distance.close()


if __name__ == "__main__":
    main()
