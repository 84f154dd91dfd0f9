"""Run under `mpiexec -n 2`: bad calls raise before any communication; a missing peer raises a timeout error.

Prints `RESULT {json}` on rank 0; exit status 1 on any failure.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
from mpi4py import MPI

from collectives.transport import CollectiveTimeoutError, CommunicatorClosedError, init

comm = init(timeout=30.0)  # generous: a loaded CI host may start one rank seconds late; the
# missing-peer case below passes its own short timeout
x = np.arange(4, dtype=np.float64)
BAD = {
    "complex dtype": lambda: comm.allreduce(np.zeros(4, complex)),
    "object dtype": lambda: comm.allreduce(np.array([None] * 4)),
    "unknown op": lambda: comm.allreduce(x, op="xor"),
    "avg on integers": lambda: comm.allreduce(np.zeros(4, np.int32), op="avg"),
    "out wrong size": lambda: comm.allreduce(x, out=np.zeros(5)),
    "out wrong dtype": lambda: comm.allreduce(x, out=np.zeros(4, np.float32)),
    "out not contiguous": lambda: comm.allreduce(x, out=np.zeros(8)[::2]),
    "out read-only": lambda: comm.allreduce(x, out=np.frombuffer(bytes(32))),
    "out overlaps x": lambda: (lambda a: comm.allreduce(a[:4], out=a[2:6]))(np.zeros(8)),
    "broadcast read-only": lambda: comm.broadcast(np.frombuffer(bytes(32))),
    "root out of range": lambda: comm.broadcast(x.copy(), root=comm.size),
    "negative root": lambda: comm.reduce(x, root=-1),
    "unknown algorithm": lambda: comm.allreduce(x, algorithm="nope"),
    "algorithm lacks collective": lambda: comm.allgather(x, algorithm="binomial"),
    "native bfloat16": lambda: comm.allreduce(np.zeros(4, "float32").astype(__import__("ml_dtypes").bfloat16),
                                              algorithm="native"),
    "reduce_scatter not divisible": lambda: comm.reduce_scatter(np.zeros(comm.size * 2 + 1)),
    "params with auto": lambda: comm.allreduce(x, chunks=2),
    "bad builder parameter": lambda: comm.allreduce(x, algorithm="ring", chunks=0),
    "negative timeout": lambda: comm.allreduce(x, timeout=-1),
    "zero timeout": lambda: comm.allreduce(x, algorithm="ring", timeout=0),
    "NaN timeout": lambda: comm.barrier(timeout=float("nan")),
    "timeout not a number": lambda: comm.reduce_scatter(np.zeros(comm.size), timeout="soon"),
}
failures, raised = [], {}
for name, call in BAD.items():
    before = x.copy()
    try:
        call()
        failures.append(f"{name}: no error")
    except (TypeError, ValueError) as exc:
        raised[name] = type(exc).__name__
    if not np.array_equal(x, before):
        failures.append(f"{name}: the input changed")
# the communicator still works after refused calls
if not np.array_equal(comm.allreduce(x, algorithm="ring"), x * comm.size):
    failures.append("allreduce after refused calls gave a wrong result")
# the same through auto's shared-memory runner shortcut (check off; the first call creates the arena everywhere)
fast = init(check="off", timeout=30.0)
fast.allreduce(x)
fast.mpi_comm.Barrier()
if fast.rank == 0:
    t = time.monotonic()
    try:
        fast.allreduce(x, timeout=0.5)
        failures.append("runner shortcut, missing peer: no timeout")
    except CollectiveTimeoutError as exc:
        waited = time.monotonic() - t
        expected = fast.last_choice.algorithm
        if not (0.4 < waited < 5) or exc.algorithm != expected or 1 not in exc.peers or "awaiting rank 1" not in str(exc):
            failures.append(f"runner shortcut timeout after {waited:.2f} s lacks details: {exc}")
        raised["runner timeout"] = str(exc)
# a peer that never calls: rank 0 raises CollectiveTimeoutError naming the call, then the comm refuses calls
comm.mpi_comm.Barrier()
if comm.rank == 0:
    t = time.monotonic()
    try:
        comm.allreduce(np.ones(1000), algorithm="ring", timeout=0.5)
        failures.append("missing peer: no timeout")
    except CollectiveTimeoutError as exc:
        waited = time.monotonic() - t
        if not (0.4 < waited < 5) or "allreduce" not in str(exc) or exc.algorithm != "ring" or not exc.peers:
            failures.append(f"timeout error after {waited:.2f} s lacks details: {exc}")
        raised["timeout"] = str(exc)
    try:
        comm.allreduce(x)
        failures.append("failed communicator accepted a call")
    except CommunicatorClosedError:
        pass
failures = MPI.COMM_WORLD.gather(failures)
if MPI.COMM_WORLD.Get_rank() == 0:
    flat = [f for fs in failures for f in fs]
    result = "RESULT " + json.dumps({"cases": len(BAD) + 2, "failures": len(flat), "messages": flat,
                                     "timeout_message": raised.get("timeout", ""),
                                     "runner_timeout_message": raised.get("runner timeout", "")})
    print(result, flush=True)
    sys.stdout.flush()
    # MPI_Abort below may end the job before mpiexec has forwarded rank 0's output (seen in CI: empty stdout and
    # stderr), so the result also goes to a file the test names
    if os.environ.get("CHECK_ERRORS_RESULT"):
        with open(os.environ["CHECK_ERRORS_RESULT"], "w") as f:
            f.write(result + "\n")
            f.flush()
            os.fsync(f.fileno())
    MPI.COMM_WORLD.Abort(1 if flat else 0)  # rank 0's timed-out messages are still pending: end the job here
