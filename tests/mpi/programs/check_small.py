"""Run under mpiexec -n N: auto allreduce's shortcuts against MPI's own Allreduce on the same inputs, bitwise.
With the shared-memory plan runner (all ranks on one host, COLLECTIVES_SHM_C not 0) every call goes straight to
the runner (one_shot below 128 KiB); without it (COLLECTIVES_SHM_C=0) small calls take MPI's own collective
(check="off": inline 1-D path, persistent requests up to PERSISTENT_BELOW bytes, Iallreduce above).

Covers every MPI-native dtype x op, out=None / out=x / separate out, 2-D arrays and views (general path),
more distinct (count, dtype, op) keys than the request cache holds (eviction, same order on every rank), bad
calls falling through to the library's precise errors with buffers untouched, and the stats counters.
Rank 0 prints `RESULT {json}`.
"""

from __future__ import annotations

import json
import os

import ml_dtypes  # noqa: F401  (registers the bfloat16 dtype name)
import numpy as np
from mpi4py import MPI

from collectives.kernels import SUPPORTED_DTYPES
from collectives.transport import communicator as communicator_module
from collectives.transport import init
from collectives.transport.choice import native_supports

comm = init(check="off", timeout=30)
mpi = comm.mpi_comm
rank, p = comm.rank, comm.size
failures: list[str] = []
cases = 0
OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}


def data(count: int, dtype: np.dtype, salt: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + salt)
    if dtype.kind == "f":
        return rng.integers(-3, 4, count).astype(dtype)  # exact in every float dtype: results bitwise
    return rng.integers(0, 3, count).astype(dtype)


def expect(x: np.ndarray, op: str) -> np.ndarray:
    ref = np.empty_like(x)
    mpi.Allreduce(x, ref, OPS[op])
    return ref


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


dtypes = [d for d in SUPPORTED_DTYPES if native_supports(d)]
salt = 0
for count in (1, 2, 7, 1000, 5000, 40000):  # 40000 float32 = 160 KB: above the persistent range
    for dtype in dtypes:
        for op in OPS:
            salt += 1
            x = data(count, dtype, salt)
            keep = x.copy()
            ref = expect(x, op)
            got = comm.allreduce(x, op=op)
            cases += 1
            if not same(got, ref) or not same(x, keep):
                failures.append(f"out=None count {count} {dtype} {op}")
            out = np.full_like(x, 5)
            comm.allreduce(x, out, op=op)
            cases += 1
            if not same(out, ref):
                failures.append(f"out separate count {count} {dtype} {op}")
            y = x.copy()
            comm.allreduce(y, y, op=op)
            cases += 1
            if not same(y, ref):
                failures.append(f"in place count {count} {dtype} {op}")

# the same key again and again (a cached request reused), and 2-D arrays and views (the general path)
x = data(6, np.dtype(np.float32), 1)
ref = expect(x, "sum")
for _ in range(50):
    cases += 1
    if not same(comm.allreduce(x), ref):
        failures.append("repeated call")
        break
m = data(12, np.dtype(np.int32), 2).reshape(3, 4)
cases += 1
if not same(comm.allreduce(m), expect(m, "sum")):
    failures.append("2-D array")
big = data(20, np.dtype(np.int64), 3)
cases += 1
if not same(comm.allreduce(big[::2]), expect(np.ascontiguousarray(big[::2]), "sum")):
    failures.append("strided view")

# 16-bit floats (MPI has none for bfloat16): small integers are exact, so the float32 sum rounds to itself
scheduled = 0
for dtype in (np.dtype(np.float16), np.dtype("bfloat16")):
    for count in (1, 7, 5000):
        salt += 1
        x = data(count, np.dtype(np.float32), salt).astype(dtype)
        ref = expect(x.astype(np.float32), "sum").astype(dtype)
        y = x.copy()
        comm.allreduce(y, y)
        for label, got in (("out=None", comm.allreduce(x)), ("separate out", comm.allreduce(x, np.empty_like(x))),
                           ("in place", y)):
            cases += 1
            scheduled += not native_supports(dtype)  # bfloat16: never MPI's own collective
            if not same(got, ref):
                failures.append(f"{label} count {count} {dtype}")

# views of one buffer: disjoint ones are a valid call (the shortcuts take it), overlapping ones an error
pool = data(40, np.dtype(np.float64), 6)
xv, outv = pool[:10], pool[20:30]
ref = expect(np.ascontiguousarray(xv), "sum")
cases += 1
if not same(comm.allreduce(xv, outv), ref) or not same(outv, ref):
    failures.append("disjoint views of one buffer")
before = pool.copy()
cases += 1
try:
    comm.allreduce(pool[:4], out=pool[2:6])
    failures.append("overlapping views: no error")
except ValueError:
    if not same(pool, before):
        failures.append("overlapping views: buffer modified")

# bad calls: the library's errors, buffers untouched
x = data(8, np.dtype(np.float32), 4)
for label, out in (("wrong size", np.zeros(9, np.float32)), ("wrong dtype", np.zeros(8, np.float64)),
                   ("read-only", np.zeros(8, np.float32))):
    if label == "read-only":
        out.flags.writeable = False
    before = out.copy()
    cases += 1
    try:
        comm.allreduce(x, out)
        failures.append(f"{label}: no error")
    except (ValueError, TypeError) as exc:
        if not same(out, before):
            failures.append(f"{label}: out modified")
        if "out" not in str(exc):
            failures.append(f"{label}: message does not name out: {exc}")

runner = comm._runner_fast
stats = comm.stats
if runner:
    # every call ran a schedule (none went to MPI), the runner cache is bounded, and its byte counts are
    # one_shot's: a rank sends its whole buffer to each of the p-1 others
    cached = len(comm._runners)
    if cached == 0 or cached > communicator_module.PERSISTENT_REQUESTS:
        failures.append(f"runner cache holds {cached}")
    if stats["native_calls"] != 0 or stats["calls"] < cases - 10:
        failures.append(f"stats {stats} after {cases} cases")
    x = data(10, np.dtype(np.float64), 5)
    before = comm.stats
    got = comm.allreduce(x)
    after = comm.stats
    if comm.last_choice.algorithm != "one_shot" or not same(got, expect(x, "sum")):
        failures.append(f"small call: {comm.last_choice}")
    if after["bytes_sent"] - before["bytes_sent"] != (p - 1) * 80 or after["calls"] - before["calls"] != 1:
        failures.append(f"one_shot stats: {before} -> {after}")
else:
    cached = len(comm._persistent)
    if cached > communicator_module.PERSISTENT_REQUESTS or (
            cached == 0 and os.environ.get("COLLECTIVES_PERSISTENT") != "0" and MPI.Get_version() >= (4, 0)):
        failures.append(f"persistent request cache holds {cached}")
    if stats["native_calls"] < cases - scheduled - 10 or stats["calls"] < stats["native_calls"]:
        failures.append(f"stats {stats} after {cases} cases")
comm.close()

gathered = MPI.COMM_WORLD.gather(failures)
if rank == 0:
    flat = [f for fs in gathered for f in fs]
    os.write(1, ("RESULT " + json.dumps({"cases": cases, "failures": len(flat), "messages": flat[:20],
                                         "cached": cached, "runner": runner}) + "\n").encode())
