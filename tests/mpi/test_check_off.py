"""check="off" still catches a count mismatch on one host: on a signature's first call for calls of MPI's own
collective (plans.Plan.size_check_pending), on every call for the plan runner's (docs/reliability.md). And a rank
whose peers ran ahead of it through calls that sign nothing still finishes its call."""

from __future__ import annotations

import launcher
import pytest

PROGRAM = """
import sys
import numpy as np, collectives
from collectives.errors import CallMismatchError
comm = collectives.init(check="off")
y = comm.allreduce(np.ones(4, np.float32), algorithm=sys.argv[1])  # a signature both ranks run first
assert (y == comm.size).all()
n = 3 if comm.rank == 0 else 2
try:
    y = comm.allreduce(np.ones(n, np.float32), algorithm=sys.argv[1])
    print(f"rank {comm.rank}: no error, result {y}", flush=True)
except CallMismatchError as exc:
    assert "count differs (rank 0: 3; rank 1: 2)" in str(exc), exc
    print(f"rank {comm.rank}: mismatch", flush=True)
y = comm.allreduce(np.ones(4, np.float32), algorithm=sys.argv[1])  # the communicator goes on
assert (y == comm.size).all()
"""


@pytest.mark.parametrize("algorithm", ["native", "one_shot"])
def test_a_count_mismatch_raises_with_checks_off(tmp_path, algorithm):
    proc = launcher.run_source(2, PROGRAM, algorithm, directory=tmp_path, env={"COLLECTIVES_TIMEOUT": "20"})
    out = proc.stdout  # the ranks' lines may interleave
    assert "rank 0: mismatch" in out and "rank 1: mismatch" in out and "no error" not in out, out


RUN_AHEAD = """
import sys, time
import numpy as np, collectives
comm = collectives.init(check="off")
last = comm.size - 1
x = np.arange(1000, dtype=np.float32) * (comm.rank == 0)
comm.broadcast(x, root=0, algorithm="one_shot")  # the plan exists and the windows have grown on every rank
if comm.rank == last:
    work = comm.broadcast(x, root=0, algorithm="one_shot", async_op=True)  # call #2 started: its signature is out
    time.sleep(1.0)  # the peers finish #2, run #3 and start #4, which overwrites their signature of #2
    work.wait(timeout=15)
else:
    comm.broadcast(x, root=0, algorithm="one_shot")
comm.allreduce(np.ones(0, np.float32))  # #3 moves no data: nobody waits for anybody, nothing is signed
y = comm.broadcast(np.arange(1000, dtype=np.float32) * (comm.rank == 0), root=0, algorithm="one_shot")
assert (y == np.arange(1000)).all(), y[:8]
print(f"rank {comm.rank}: ok", flush=True)
"""


@pytest.mark.parametrize("c_runner", ["1", "0"])
def test_a_rank_whose_peers_ran_ahead_finishes_its_call(tmp_path, c_runner):
    """The last rank's one_shot broadcast #2 ends by checking every peer's signature of #2; the peers finished #2
    without waiting for that check, ran #3 (which signs nothing with check="off") and signed #4 in the same slot
    as #2. A peer that signed a later call has finished this one (csrc/plan.c, coll_ctrl_compare): before that
    rule the last rank waited for a signature of #2 that was gone, until its timeout."""
    proc = launcher.run_source(3, RUN_AHEAD, directory=tmp_path,
                               env={"COLLECTIVES_TIMEOUT": "15", "COLLECTIVES_SHM_C": c_runner})
    assert all(f"rank {r}: ok" in proc.stdout for r in range(3)), proc.stdout
