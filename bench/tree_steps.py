"""Where a double binary tree's time goes at p = 4 with two ranks per core (docs/benchmarks.md, "Session 10").

    mpiexec -bind-to core -n 4 python bench/tree_steps.py [--mib 32] [--reps 5] [--predict CAL.json]
                                                          [--idle sleep|yield]

At 64 MiB `bench --predict` prices double_binary_tree (chunks=1) at ~0.84x ring, and it measured 1.05-1.27x
while the plan runner's waits yielded the CPU for as long as they lasted; since session 11 they sleep once they
have lasted 1 ms (COLLECTIVES_NAP_AFTER_US=0 restores yielding, to compare). This script times, in one launch:

1. the calls: ring, rabenseifner and double_binary_tree with chunks 1, 2, 4 and 16 (in place, 2 * MIB bytes,
   median of 7 after a barrier), with the prediction from a calibration when `--predict` names one;
2. the tree's steps alone, each on the ranks that run it in the call (ranks r and r + 2 share a core): the
   start's copy-in on all four ranks, the inner nodes' fused reduce of three inputs (their value and both
   children's windows) and its mirror, the other nodes' two-input reduce and mirror, a landing and mirror,
   and the last round's landing on all four. Ranks with nothing to do wait in a non-blocking barrier: with
   `--idle sleep` (default) they sleep between tests and leave their core-mate the whole core, as the model
   assumes; with `--idle yield` they call sched_yield 1000 times between tests, as a waiting rank of the
   transport did before session 11 (the plan runner yielded once per poll, up to 1024 polls per C call).

The steps' times, summed in the order the call runs them on one core, give what the call would take if its
steps cost what they cost alone: with sleeping idle ranks that is the model's price, with yielding ones the
call's time (section "Session 10" of docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=32, help="half the call's buffer, one tree's share (default 32)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--predict", help="a calibration (collectives calibrate --out) to price the calls with")
    ap.add_argument("--idle", choices=("sleep", "yield"), default="sleep",
                    help="how ranks with no step wait while their core-mates run theirs (default sleep)")
    args = ap.parse_args()

    from mpi4py import MPI

    import collectives
    from collectives.transport import shm_program

    comm = collectives.init()
    ctl = MPI.COMM_WORLD.Dup()
    me, p = ctl.rank, ctl.size
    if p != 4:
        raise SystemExit("tree_steps: run with `mpiexec -bind-to core -n 4` (the steps are those of p = 4)")
    half = args.mib << 20
    n = half // 4

    def quiet_barrier(idle: str = "sleep") -> None:
        """A barrier that sleeps while it waits (an idle rank leaves its core to its core-mate), or yields the
        CPU 1000 times between tests (as the transport's waiters do)."""
        req = ctl.Ibarrier()
        while not req.Test():
            if idle == "sleep":
                time.sleep(1e-4)
            else:
                for _ in range(1000):
                    os.sched_yield()

    # 1. the calls
    x = (np.arange(2 * n, dtype=np.float32) % 7)
    cases = [("ring", {}), ("rabenseifner", {})] + [("double_binary_tree", {"chunks": c}) for c in (1, 2, 4, 16)]
    predictor = None
    if args.predict:
        from collectives.benchmark.runner import Predictor

        predictor = Predictor(args.predict, p, np.dtype(np.float32), "sum", 0)
    calls = {}
    for algorithm, params in cases:
        for _ in range(2):
            comm.allreduce(x, out=x, algorithm=algorithm, **params)
        own = []
        for _ in range(7):
            quiet_barrier()
            t0 = time.perf_counter()
            comm.allreduce(x, out=x, algorithm=algorithm, **params)
            own.append(time.perf_counter() - t0)
        calls[(algorithm, params.get("chunks"))] = max(ctl.allgather(statistics.median(own)))

    # 2. the steps alone: buffers 0 = this rank's value, 1 + q = rank q's window
    node = ctl.Split_type(MPI.COMM_TYPE_SHARED)
    win = MPI.Win.Allocate_shared(half, 1, comm=node)
    windows = [np.frombuffer(win.Shared_query(q)[0], np.float32, n) for q in range(p)]
    windows[me][:] = 1
    value = np.ones(n, np.float32)
    kernel = shm_program.kernel_for(np.dtype(np.float32), "sum", 0)
    left, right = (me - 1) % p, (me + 1) % p
    mirror = [("copy", 1 + me, 0, 0, n)]
    reduce3 = [("reduce", 0, [0, 1 + left, 1 + right], 0, n)]
    reduce2 = [("reduce", 0, [0, 1 + left], 0, n)]
    land = [("copy", 0, 1 + right, 0, n)]
    inner, outer, everyone = {1, 2}, {0, 3}, {0, 1, 2, 3}
    steps = {  # in the call's order on a core (core 0: ranks 0 and 2)
        "copy-in, all four ranks": (everyone, mirror),
        "3-input reduce + mirror, ranks 1 and 2": (inner, reduce3 + mirror),
        "2-input reduce + mirror, ranks 0 and 3": (outer, reduce2 + mirror),
        "landing + mirror, ranks 1 and 2": (inner, land + mirror),
        "landing, all four ranks": (everyone, land),
    }
    parts = {  # the same operations one at a time, for the per-operation costs
        "copy alone, ranks 1 and 2": (inner, mirror),
        "landing alone, ranks 1 and 2": (inner, land),
        "2-input reduce alone, ranks 1 and 2": (inner, reduce2),
        "3-input reduce alone, ranks 1 and 2": (inner, reduce3),
    }
    timed = {}
    for name, (ranks, program) in {**steps, **parts}.items():
        line = shm_program.StraightLine(program, [value] + windows, 4, kernel) if me in ranks else None
        spans = []
        for rep in range(args.reps + 1):
            quiet_barrier()
            t0 = time.perf_counter()
            if line is not None:
                line()
            t1 = time.perf_counter()
            quiet_barrier(args.idle)  # where the idle ranks spend the step
            ends = [t for t in ctl.allgather((t0, t1) if line is not None else None) if t]
            if rep:  # the first pass touches the pages
                spans.append(max(b for _, b in ends) - min(a for a, _ in ends))
        timed[name] = statistics.median(spans)
    # collective frees, on success only: after an error this rank exits and mpiexec ends the others
    quiet_barrier()
    win.Free()
    node.Free()

    if me == 0:
        print(f"# allreduce of {2 * args.mib} MiB, 4 ranks (median of 7, in place)")
        ring = calls[("ring", None)]
        for (algorithm, chunks), t in calls.items():
            label = algorithm + (f" chunks={chunks}" if chunks else "")
            predicted = ""
            if predictor is not None:
                params = {"chunks": chunks} if chunks else {}
                predicted = f"   predicted {predictor.predict('allreduce', algorithm, params, 2 * half) * 1e3:7.1f} ms"
            print(f"{label:30s} {t * 1e3:7.1f} ms  ({t / ring:4.2f}x ring){predicted}")
        print(f"# the tree's steps alone, {args.mib} MiB each (median of {args.reps}; idle ranks {args.idle})")
        for name, t in timed.items():
            print(f"{name:42s} {t * 1e3:7.2f} ms")
        total = sum(timed[name] for name in steps)
        tree = calls[("double_binary_tree", 1)]
        print(f"steps in the call's order: {total * 1e3:.1f} ms; the call (chunks=1): {tree * 1e3:.1f} ms "
              f"({tree / total:.2f}x the steps)")


if __name__ == "__main__":
    main()
