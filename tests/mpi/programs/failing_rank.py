"""Run under mpiexec: `collectives ARGS...` with one rank failing on its own mid-measurement.

    mpiexec -n 2 python failing_rank.py calibrate|bench RANK COLLECTIVES-ARGS...

`calibrate`: RANK's measurement of the transport's rounds raises (benchmark.calibrate.window_rounds); `bench`: RANK's
timed loop raises (benchmark.runner.Bench.measure). The other ranks are inside collectives at that moment: the
subcommand must end the whole job at once (cli/job_errors.py), not leave them waiting for a timeout.
"""

from __future__ import annotations

import sys

from mpi4py import MPI

from collectives.benchmark import calibrate, runner
from collectives.cli import main

where, failing, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rank = MPI.COMM_WORLD.Get_rank()


def fail_here(original):
    def wrapper(*a, **k):
        if rank == failing:
            raise RuntimeError(f"injected failure on rank {rank}")
        return original(*a, **k)
    return wrapper


if where == "calibrate":
    calibrate.window_rounds = fail_here(calibrate.window_rounds)
else:
    runner.Bench.measure = fail_here(runner.Bench.measure)
sys.exit(main(args))
