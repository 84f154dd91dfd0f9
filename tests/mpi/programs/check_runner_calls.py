"""Run under mpiexec -n N: reduce_scatter, allgather, broadcast and reduce through the communicator with
check="off", against MPI's own collectives on the same inputs, bitwise. With the shared-memory plan runner (all
ranks on one host, COLLECTIVES_SHM_C not 0) calls of every schedule without switch nodes go straight to the
runner (Communicator._runner_call); with COLLECTIVES_SHM_C=0 the same calls take the general path, and every
check below holds for both. Calls auto gives to MPI's own collective are posted directly
(Communicator._small_native_call) in both. The end repeats some with check="metadata" (the agreement inline),
with ranks on different paths, and a mismatch.

Covers every algorithm of each collective and auto, every MPI-native dtype x op (small integers: exact in every
dtype), out=None / separate out / in place where the collective has one, roots 0 and p-1, 2-D arrays, repeated
calls (cached runners), a cached runner after the shared-memory arena grew, 16-bit floats, and bad calls falling
through to the library's precise errors with every buffer untouched. Rank 0 prints `RESULT {json}`.
"""

from __future__ import annotations

import json
import os

import collectives.algorithms as algorithms
import ml_dtypes  # noqa: F401  (registers the bfloat16 dtype name)
import numpy as np
from mpi4py import MPI

from collectives.kernels import SUPPORTED_DTYPES
from collectives.transport import init
from collectives.transport.choice import native_supports

comm = init(check="off", timeout=30)
mpi = comm.mpi_comm
rank, p = comm.rank, comm.size
failures: list[str] = []
cases = 0
OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}


def data(count: int, dtype: np.dtype, salt: int, shape=None) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + salt)
    values = rng.integers(-2, 3, count) if np.dtype(dtype).kind == "f" else rng.integers(0, 3, count)
    return values.astype(dtype).reshape(shape or (count,))


def same(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def reference(collective: str, x: np.ndarray, op: str, root: int | None) -> np.ndarray | None:
    """MPI's own collective on the same input (None off the root of a reduce)."""
    flat = np.ascontiguousarray(x).reshape(-1)
    if collective == "reduce_scatter":
        ref = np.empty(flat.size // p, x.dtype)
        mpi.Reduce_scatter_block(flat, ref, OPS[op])
        return ref.reshape((x.shape[0] // p, *x.shape[1:]) if x.ndim > 1 else (-1,))
    if collective == "allgather":
        ref = np.empty(flat.size * p, x.dtype)
        mpi.Allgather(flat, ref)
        return ref.reshape((p * x.shape[0], *x.shape[1:]))
    if collective == "broadcast":
        ref = x.copy()
        mpi.Bcast(ref, root=root)
        return ref
    ref = np.empty_like(flat)
    mpi.Reduce(flat, ref, OPS[op], root=root)
    return ref.reshape(x.shape) if rank == root else None


def call(collective: str, x: np.ndarray, out, op: str, root, algorithm: str):
    if collective == "broadcast":
        return comm.broadcast(x, root=root, algorithm=algorithm)
    if collective == "reduce":
        return comm.reduce(x, out=out, root=root, op=op, algorithm=algorithm)
    if collective == "reduce_scatter":
        return comm.reduce_scatter(x, out=out, op=op, algorithm=algorithm)
    return comm.allgather(x, out=out, algorithm=algorithm)


def case(collective: str, algorithm: str, dtype, op: str, count: int, variant: str, root, salt: int, shape=None):
    global cases
    cases += 1
    x = data(count, dtype, salt, shape)
    ref = reference(collective, x, op, root)
    keep = x.copy()
    label = f"{collective} {algorithm} {np.dtype(dtype).name} {op} n={count} {variant} root={root}"
    out = None
    if variant == "out":
        size = {"reduce_scatter": count // p, "allgather": count * p}.get(collective, count)
        out = np.full(size, 3, dtype)
    elif variant == "inplace":
        out = x
    got = call(collective, x, out, op, root, algorithm)
    if collective == "broadcast":
        if got is not x or not same(x, ref):
            failures.append(f"{label}: broadcast result")
        return
    if not same(x, keep) and out is not x:
        failures.append(f"{label}: input modified")
    if collective == "reduce" and rank != root:
        if got is not None:
            failures.append(f"{label}: non-root got {type(got).__name__}, not None")
        return
    if out is not None and got is not out:
        failures.append(f"{label}: did not return out")
    if not same(got.reshape(ref.shape) if variant == "out" else got, ref):
        failures.append(f"{label}: result differs from MPI's")


dtypes = [d for d in SUPPORTED_DTYPES if native_supports(d)]
salt = 0
for collective in ("reduce_scatter", "allgather", "broadcast", "reduce"):
    for algorithm in [*algorithms.names(collective), "auto", "native"]:
        for i, dtype in enumerate(dtypes):
            ops = list(OPS) if collective in ("reduce_scatter", "reduce") else ["sum"]
            for j, op in enumerate(ops):
                for k, count in enumerate((1, 7, 1000)):
                    salt += 1
                    n = count * p if collective == "reduce_scatter" else count
                    variant = ("new", "out", "inplace")[(i + j + k) % 3]
                    if variant == "inplace" and collective != "reduce":
                        variant = "new"
                    root = (0, p - 1)[(i + j + k) % 2] if collective in ("broadcast", "reduce") else None
                    if collective == "reduce" and variant == "inplace" and rank != root:
                        variant = "new"  # in place only means something on the root
                    case(collective, algorithm, dtype, op, n, variant, root, salt)

# repeated calls (one cached runner each) and 2-D arrays
for _ in range(20):
    salt += 1
    case("reduce_scatter", "auto", np.dtype(np.float32), "sum", 4 * p, "new", None, 7)
    case("allgather", "ring", np.dtype(np.int32), "sum", 5, "out", None, 8)
    case("broadcast", "binomial", np.dtype(np.float64), "sum", 9, "new", p - 1, salt)
    case("reduce", "binomial", np.dtype(np.int64), "max", 11, "new", 0, salt)
case("reduce_scatter", "ring", np.dtype(np.float32), "sum", 6 * p, "new", None, 9, shape=(2 * p, 3))
case("allgather", "ring", np.dtype(np.float32), "sum", 6, "new", None, 10, shape=(2, 3))
case("reduce", "binomial", np.dtype(np.int32), "sum", 12, "new", p - 1, 11, shape=(3, 4))
# a cached runner after the arena grew (a large call in between): rebuilt over the new windows
case("reduce_scatter", "ring", np.dtype(np.int32), "sum", 16 * p, "new", None, 12)
case("allgather", "ring", np.dtype(np.float64), "sum", 1 << 19, "new", None, 13)
case("reduce_scatter", "ring", np.dtype(np.int32), "sum", 16 * p, "new", None, 12)

# 16-bit floats: small integers are exact, so the float32 result rounds to itself (bfloat16: never MPI's own)
for dtype in (np.dtype(np.float16), np.dtype("bfloat16")):
    for collective, algorithm in (("reduce_scatter", "ring"), ("allgather", "ring"), ("broadcast", "binomial"),
                                  ("reduce", "binomial")):
        cases += 1
        n = 7 * p if collective == "reduce_scatter" else 7
        x32 = data(n, np.dtype(np.float32), 50)
        ref = reference(collective, x32, "sum", 0)
        got = call(collective, x32.astype(dtype), None, "sum", 0, algorithm)
        if ref is not None and not same(got, ref.astype(dtype)):
            failures.append(f"{collective} {algorithm} {dtype}: result differs")

# bad calls: the library's errors on every rank, buffers untouched
x = data(4 * p, np.dtype(np.float32), 20)
bad = [
    ("reduce_scatter indivisible", lambda: comm.reduce_scatter(x[:4 * p - 1]), ValueError, "multiple"),
    ("reduce_scatter wrong out size", lambda: comm.reduce_scatter(x, out=np.zeros(5, np.float32)), ValueError, "out"),
    ("allgather wrong out dtype", lambda: comm.allgather(x, out=np.zeros(4 * p * p, np.float64)), TypeError, "out"),
    ("allgather out is x", lambda: comm.allgather(x, out=x), ValueError, "out"),
    ("reduce bad root", lambda: comm.reduce(x, root=p), ValueError, "root"),
    ("broadcast bad root", lambda: comm.broadcast(x, root=-1), ValueError, "root"),
    ("reduce_scatter overlapping out", lambda: comm.reduce_scatter(x, out=x[:4]), ValueError, "overlaps"),
]
for label, fn, exc_type, word in bad:
    cases += 1
    before = x.copy()
    try:
        fn()
        failures.append(f"{label}: no error")
    except exc_type as exc:
        if word not in str(exc):
            failures.append(f"{label}: message does not say {word!r}: {exc}")
    if not same(x, before):
        failures.append(f"{label}: buffer modified")
ro = data(8, np.dtype(np.float32), 21)
ro.flags.writeable = False
cases += 1
try:
    comm.broadcast(ro)
    failures.append("read-only broadcast: no error")
except ValueError as exc:
    if "read-only" not in str(exc):
        failures.append(f"read-only broadcast: {exc}")

# check="metadata": the same shortcuts after an inline agreement (the general path's vector and operation)
comm.check = "metadata"
for collective, algorithm in (("reduce_scatter", "auto"), ("allgather", "auto"), ("broadcast", "auto"),
                              ("reduce", "auto"), ("allgather", "native"), ("broadcast", "binomial")):
    for count in (3, 1000):
        salt += 1
        case(collective, algorithm, np.dtype(np.int32), "sum", count * p if collective == "reduce_scatter" else count,
             "new", 0 if collective in ("broadcast", "reduce") else None, salt)
# ranks on different paths agree: rank 0's input is a strided view (the general path), the others' contiguous
cases += 1
base = data(2 * 6 * p, np.dtype(np.int64), 30)
x = base[::2] if rank == 0 else np.ascontiguousarray(base[::2])
ref = reference("reduce_scatter", np.ascontiguousarray(x), "sum", None)
if not same(comm.reduce_scatter(x), ref):
    failures.append("metadata: mixed paths (strided input on rank 0): result differs")
# a mismatch between shortcut calls: CallMismatchError on every rank, nothing written, still usable
cases += 1
y = data(4 * p, np.dtype(np.float32), 31)
keep, out = y.copy(), np.full(4 * p * p, 9, np.float32)
try:
    if rank == p - 1:
        comm.broadcast(y)
    else:
        comm.allgather(y, out=out)
    failures.append("metadata: mismatched broadcast/allgather: no error")
except Exception as exc:  # noqa: BLE001
    if type(exc).__name__ != "CallMismatchError" or "collective differs" not in str(exc):
        failures.append(f"metadata: mismatch raised {type(exc).__name__}: {exc}")
if not same(y, keep) or not (out == 9).all():
    failures.append("metadata: a mismatched call wrote a buffer")
case("allgather", "auto", np.dtype(np.float32), "sum", 5, "new", None, 32)
comm.check = "off"

served = {name: sum(1 for key, entry in comm._runners.items() if key[0] == name and entry)
          for name in ("reduce_scatter", "allgather", "broadcast", "reduce")}
runner = comm._runner_fast
fast_native = comm.mpi_comm.allreduce(comm._fast_calls, op=MPI.MIN)  # auto's tiny calls: MPI's own, posted directly
if runner and min(served.values()) == 0:
    failures.append(f"the runner served no call of some collective: {served}")
if not runner and any(served.values()):
    failures.append(f"runner entries without the runner: {served}")
comm.close()

gathered = MPI.COMM_WORLD.gather(failures)
if rank == 0:
    flat = [f for fs in gathered for f in fs]
    os.write(1, ("RESULT " + json.dumps({"cases": cases, "failures": len(flat), "messages": flat[:20],
                                         "runner": runner, "served": served,
                                         "fast_native": fast_native}) + "\n").encode())
