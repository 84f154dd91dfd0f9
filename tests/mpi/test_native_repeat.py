"""MPI's own collective repeated on the same buffers runs as a persistent request (executors.NativeExecutor),
decided by every rank alike from the flags their host agreement carries; also with the arena's Python fallback
(no C extension). tests/mpi/programs/check_calls.py covers every collective, changing buffers and mixed plans."""

from __future__ import annotations

import launcher
import pytest

PROGRAM = """
import sys
import numpy as np
import collectives.transport.shm.arena as arena_mod
if sys.argv[1] == "python":
    arena_mod.lib = None  # the arena's numpy stores and loads instead of csrc/plan.c's helpers
import collectives
comm = collectives.init()
p, r = comm.size, comm.rank
x = np.arange(4 * p, dtype=np.int32) + 100 * r
out = np.empty_like(x)
kinds = []
for i in range(5):
    x[0] = i  # new values in the same buffers each call
    comm.alltoall(x, out=out, algorithm="native")
    xs = [np.arange(4 * p, dtype=np.int32) + 100 * q for q in range(p)]
    for xq in xs:
        xq[0] = i
    want = np.concatenate([xq[4 * r:4 * r + 4] for xq in xs])
    assert np.array_equal(out, want), (i, out, want)
    kinds.append(type(comm._ctx.native_request).__name__)
try:
    comm.allreduce(np.ones(3 + (r == p - 1), np.float32), algorithm="native")
    print(f"rank {r}: no mismatch error", flush=True)
except collectives.CallMismatchError:
    pass
y = comm.allreduce(np.ones(4, np.float32), algorithm="native")
assert (y == p).all()
print(f"rank {r}: {' '.join(kinds)}", flush=True)
"""


@pytest.mark.parametrize("arena", ["c", "python"])
def test_repeated_native_calls_run_a_persistent_request(tmp_path, arena):
    proc = launcher.run_source(3, PROGRAM, arena, directory=tmp_path, env={"COLLECTIVES_TIMEOUT": "20"})
    # the first call has nothing to repeat; the second initialises the request, the later ones start it
    for r in range(3):
        assert f"rank {r}: NoneType Prequest Prequest Prequest Prequest" in proc.stdout, proc.stdout
    assert "no mismatch error" not in proc.stdout, proc.stdout
