"""Run under mpiexec -n N: the plan path of every collective against MPI's own collective on the same inputs.
With `--runtime store`, run under torchrun instead (the store runtime: torch's store, gloo, shared memory) and
compare against numpy's results over every rank's inputs (each rank regenerates them: they are seeded by rank).

Every collective x MPI-native dtype x op x count (0 included) x output mode (new, separate, in place) through
auto and MPI's own, and every algorithm that runs without a topology for float32 and int32; results bitwise
equal to MPI's (integer-valued inputs: exact in every dtype), inputs untouched. Then: strided and 2-D inputs,
the same signature with other buffers (cached plans rebind), async calls mixed with blocking ones, bad calls
raising before any communication with buffers untouched, calls of different signatures on different ranks
(count, collective, op, root) raising CallMismatchError on every rank with the communicator usable after, and
the stats. `--check off|metadata` sets the call agreement. Rank 0 prints `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import json
import os
import zlib

import numpy as np
from mpi4py import MPI

import collectives
from collectives import algorithms
from collectives.kernels._dtypes import BFLOAT16, SUPPORTED_DTYPES
from collectives.transport import init

NATIVE = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}
FOLD = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall")

ap = argparse.ArgumentParser()
ap.add_argument("--check", default="metadata")
ap.add_argument("--runtime", choices=("mpi", "store"), default="mpi")
ap.add_argument("--quick", action="store_true", help="four dtypes and counts 0, 7, 1000 (a slow path's smoke test)")
args = ap.parse_args()
if args.runtime == "store":
    import torch.distributed as dist

    from collectives.torch.runtime import StoreRuntime

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]),
                          os.environ["RANK"] == "0")
    comm = init(StoreRuntime(store, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), timeout=60),
                check=args.check, timeout=60)
    mpi = None
else:
    comm = init(check=args.check, timeout=60)
    mpi = comm.mpi_comm
rank, p = comm.rank, comm.size
failures: list[str] = []
cases = 0


def fail(msg: str) -> None:
    failures.append(f"rank {rank}: {msg}")
    if os.environ.get("CHECK_CALLS_VERBOSE"):
        print(f"rank {rank}: {msg}", flush=True)


def data(count: int, dtype: np.dtype, salt: int, op: str, of: int | None = None) -> np.ndarray:
    rng = np.random.default_rng([rank if of is None else of, salt])
    if op == "prod":
        return rng.integers(1, 3, count).astype(dtype)
    lo = 0 if dtype.kind == "u" else -3
    return rng.integers(lo, 4, count).astype(dtype)  # exact in every dtype: results bitwise


def numpy_reference(collective: str, x: np.ndarray, op: str, root: int, salt: int):
    """The collective's result from every rank's input, regenerated here (exact: the inputs are small integers)."""
    inputs = [data(x.size, x.dtype, salt, op, of=q) for q in range(p)]
    folded = inputs[0].copy()
    for other in inputs[1:]:
        folded = FOLD[op](folded, other).astype(x.dtype)
    if collective == "allreduce":
        return folded
    if collective == "reduce_scatter":
        n = x.size // p
        return folded[rank * n:(rank + 1) * n]
    if collective == "allgather":
        return np.concatenate(inputs)
    if collective == "broadcast":
        return inputs[root]
    if collective == "alltoall":
        n = x.size // p
        return np.concatenate([inputs[q][rank * n:(rank + 1) * n] for q in range(p)])
    return folded if rank == root else None


def reference(collective: str, x: np.ndarray, op: str, root: int, salt: int):
    if mpi is None:
        return numpy_reference(collective, x, op, root, salt)
    mop = NATIVE[op]
    if collective == "allreduce":
        ref = np.empty_like(x)
        mpi.Allreduce(x, ref, mop)
    elif collective == "reduce_scatter":
        ref = np.empty(x.size // p, x.dtype)
        mpi.Reduce_scatter_block(x, ref, mop)
    elif collective == "allgather":
        ref = np.empty(x.size * p, x.dtype)
        mpi.Allgather(x, ref)
    elif collective == "broadcast":
        ref = x.copy()
        mpi.Bcast(ref, root=root)
    elif collective == "alltoall":
        ref = np.empty_like(x)
        mpi.Alltoall(x, ref)
    else:
        ref = np.empty_like(x) if rank == root else None
        mpi.Reduce(x, ref, mop, root=root)
    return ref


def call(collective: str, x, out, op: str, root: int, algorithm: str, **kw):
    if collective == "broadcast":
        return comm.broadcast(x, root=root, algorithm=algorithm, **kw)
    if collective == "reduce":
        return comm.reduce(x, out=out, root=root, op=op, algorithm=algorithm, **kw)
    if collective in ("allgather", "alltoall"):
        return getattr(comm, collective)(x, out=out, algorithm=algorithm, **kw)
    return getattr(comm, collective)(x, out=out, op=op, algorithm=algorithm, **kw)


references: dict[str, np.ndarray | None] = {}  # check_case's reference results, by what they depend on


def check_case(collective: str, dtype, op: str, count: int, mode: str, algorithm: str) -> None:
    global cases
    # the inputs and root depend on what the reference depends on, not on the algorithm or output mode: one
    # reference call serves all of them (an MPI call costs milliseconds when ranks share cores)
    key = f"{collective}/{dtype}/{op}/{count}"
    salt = zlib.crc32(key.encode())
    root = (salt % p)
    n = count * p if collective in ("reduce_scatter", "alltoall") else count
    x = data(n, dtype, salt, op)
    keep = x.copy()
    if key not in references:
        references[key] = reference(collective, x, op, root, salt)
    ref = references[key]
    out = None
    if mode == "separate" and collective != "broadcast":
        size = {"reduce_scatter": n // p, "allgather": n * p}.get(collective, n)
        out = np.full(size, 7, dtype)
    elif mode == "inplace":
        if collective in ("reduce_scatter", "allgather", "alltoall") and p > 1:
            return
        out = x
    label = f"{collective}/{algorithm}/{dtype}/{op}/count {count}/{mode}"
    try:
        got = call(collective, x, out, op, root, algorithm)
    except Exception as exc:  # noqa: BLE001 - a failure of this case
        fail(f"{label}: {type(exc).__name__}: {exc}")
        return
    cases += 1
    if collective == "reduce" and rank != root:
        if got is not None:
            fail(f"{label}: a non-root got {type(got).__name__}")
        return
    if out is not None and collective != "broadcast" and got is not out:
        fail(f"{label}: out= was given but another array was returned")
    if collective == "broadcast":
        if got is not x:
            fail(f"{label}: broadcast returned another array than x")
    elif mode != "inplace" and keep.tobytes() != x.tobytes():
        fail(f"{label}: the input was modified")
    if got.reshape(-1).tobytes() != ref.reshape(-1).tobytes() or got.dtype != ref.dtype:
        fail(f"{label}: {got.reshape(-1)[:6]} != MPI's {ref.reshape(-1)[:6]}")


dtypes = [d for d in SUPPORTED_DTYPES if d != BFLOAT16]
counts = (0, 1, 7, 1000, 40000)
if args.quick:
    dtypes = [np.dtype(t) for t in (np.float32, np.int32, np.float16, np.int8)]
    counts = (0, 7, 1000)
for collective in COLLECTIVES:
    others = [a for a in algorithms.names(collective) if not algorithms.info(a).needs_topology]
    for dtype in dtypes:
        ops = ("sum", "prod", "min", "max") if collective in ("allreduce", "reduce_scatter", "reduce") else ("sum",)
        native = [] if comm.runtime.native_refusal(collective, dtype) else ["native"]  # gloo: fewer dtypes
        algos = ["auto", *native] + (others if dtype in (np.dtype(np.float32), np.dtype(np.int32)) else [])
        for op in ops:
            for count in counts:
                for algorithm in algos:
                    if count == 40000 and algorithm not in ("auto", "native", "ring"):
                        continue
                    for mode in ("new", "separate", "inplace"):
                        check_case(collective, dtype, op, count, mode, algorithm)

# alltoallv: uneven matrices (empty rows and columns included) through every algorithm, against MPI's own
rng = np.random.default_rng(5)
for trial in range(6):
    m = rng.integers(0, 4, (p, p))
    if trial == 0:
        m[:, 0] = 0
    if trial == 1:
        m[p - 1, :] = 0
    for dtype in (np.dtype(np.float32), np.dtype(np.int8), np.dtype(np.float64)):
        x = (np.arange(m[rank].sum()) + 50 * rank).astype(dtype)
        rc = m[:, rank]
        ref = np.concatenate([(np.arange(m[q].sum()) + 50 * q).astype(dtype)[
            int(m[q, :rank].sum()):int(m[q, :rank + 1].sum())] for q in range(p)])
        for algorithm in ["auto", "native"] + algorithms.names("alltoallv"):
            if algorithms.info(algorithm).needs_topology if algorithm not in ("auto", "native") else False:
                continue
            got = comm.alltoallv(x, m[rank], rc, algorithm=algorithm)
            cases += 1
            if got.tobytes() != ref.tobytes():
                fail(f"alltoallv/{algorithm}/{dtype}/trial {trial}: {got[:6]} != expected {ref[:6]}")
bad = m[:, rank].copy()
bad[0] += rank == p - 1
try:
    comm.alltoallv(np.ones(m[rank].sum(), np.float32), m[rank], bad)
    fail("alltoallv with inconsistent counts: no error")
except ValueError:
    cases += 1

# a signature's cached plan with other buffers of the same shape, strided and 2-D inputs
for k in range(3):
    x = np.arange(12, dtype=np.float32) + rank + k
    y = comm.allreduce(x)
    if not np.array_equal(y, sum(np.arange(12, dtype=np.float32) + q + k for q in range(p))):
        fail(f"allreduce with new buffers, round {k}: {y}")
    cases += 1
wide = (np.arange(24, dtype=np.int64) + rank).reshape(4, 6)
got = comm.allreduce(wide[:, ::2])  # strided: read through a copy
want = sum((np.arange(24, dtype=np.int64) + q).reshape(4, 6)[:, ::2] for q in range(p))
if got.shape != (4, 3) or not np.array_equal(got, want):
    fail(f"strided allreduce: {got}")
cases += 1
gathered = comm.allgather(np.full((2, 3), rank, np.int16))
if gathered.shape != (2 * p, 3) or not np.array_equal(gathered[::2, 0], np.arange(p)):
    fail(f"2-D allgather: shape {gathered.shape}")
cases += 1

# async calls interleaved with blocking ones complete in issue order with the right results
works = [comm.allreduce(np.full(5, rank + i, np.float64), async_op=True) for i in range(4)]
blocking = comm.allgather(np.array([rank], np.int32))
results = [w.wait() for w in works]
for i, r in enumerate(results):
    if not np.array_equal(r, np.full(5, sum(q + i for q in range(p)), np.float64)):
        fail(f"async allreduce {i}: {r}")
if not np.array_equal(blocking, np.arange(p, dtype=np.int32)):
    fail(f"blocking allgather between async calls: {blocking}")
cases += 5

# bad calls raise before communicating, buffers untouched
x = np.ones(8, np.float32)
for label, fn, err in [
        ("bad op", lambda: comm.allreduce(x, op="xor"), ValueError),
        ("avg of ints", lambda: comm.allreduce(np.ones(3, np.int32), op="avg"), ValueError),
        ("out too small", lambda: comm.allreduce(x, out=np.empty(3, np.float32)), ValueError),
        ("out of another dtype", lambda: comm.allreduce(x, out=np.empty(8, np.float64)), TypeError),
        ("overlapping out", lambda: comm.allreduce(x[:6], out=x[2:]), ValueError),
        ("reduce_scatter count", lambda: comm.reduce_scatter(np.ones(p * 3 + 1, np.float32)), ValueError),
        ("bad root", lambda: comm.broadcast(np.ones(3), root=p), ValueError),
        ("unknown algorithm", lambda: comm.allreduce(x, algorithm="nope"), ValueError),
        ("params with auto", lambda: comm.allreduce(x, chunks=2), ValueError),
        ("bad timeout", lambda: comm.allreduce(x, timeout=-1), ValueError),
        ("bfloat16 native", lambda: comm.allreduce(np.ones(4, BFLOAT16), algorithm="native"), TypeError)]:
    before = x.copy()
    try:
        fn()
        fail(f"{label}: no error")
    except err:
        pass
    except Exception as exc:  # noqa: BLE001
        fail(f"{label}: {type(exc).__name__} instead of {err.__name__}: {exc}")
    if x.tobytes() != before.tobytes():
        fail(f"{label}: x was modified")
    cases += 1
readonly = np.ones(8, np.float32)
readonly.flags.writeable = False
try:
    comm.allreduce(x, out=readonly)
    fail("read-only out: no error")
except ValueError:
    cases += 1

# different calls on different ranks: every rank raises CallMismatchError, and the communicator stays usable
mismatches = 0
if p > 1 and args.check != "off":
    last = rank == p - 1
    for label, fn in [
            ("count", lambda: comm.allreduce(np.ones(10 + last, np.float32))),
            ("collective", lambda: (comm.allgather if last else comm.allreduce)(np.ones(4, np.float32))),
            ("op", lambda: comm.allreduce(np.ones(4, np.int32), op="max" if last else "sum")),
            ("root", lambda: comm.broadcast(np.ones(4), root=1 if last else 0)),
            ("big count", lambda: comm.allreduce(np.ones((1 << 20) + last, np.float32))),
            ("zero count", lambda: comm.allreduce(np.ones(0 if last else 4, np.float32)))]:  # moves no data
        try:
            fn()
            fail(f"mismatched {label}: no error")
        except collectives.CallMismatchError as exc:
            mismatches += 1
            if label != "collective" and label not in str(exc) and not (label.endswith(" count") and "count" in str(exc)):
                fail(f"mismatched {label}: the error does not name it: {exc}")
        y = comm.allreduce(np.ones(6, np.float32))
        if not np.array_equal(y, np.full(6, p, np.float32)):
            fail(f"after the mismatched {label}: {y}")
        cases += 2

# with check="off" the plan runner still compares the calls' sizes (free): a count mismatch is caught
if p > 1 and args.check == "off" and comm.shared_memory:
    try:
        comm.allreduce(np.ones(10 + (rank == p - 1), np.float32), algorithm="one_shot")
        fail("check=off, mismatched count through the plan runner: no error")
    except collectives.CallMismatchError as exc:
        mismatches += 1
        if "count" not in str(exc):
            fail(f"check=off, mismatched count: the error does not name it: {exc}")
    y = comm.allreduce(np.ones(6, np.float32))
    if not np.array_equal(y, np.full(6, p, np.float32)):
        fail(f"after the check=off mismatch: {y}")
    cases += 2

# MPI's own collective repeated on the same buffers runs as a persistent request once every rank repeats its
# call (executors.NativeExecutor): new values in the same buffers each time, bitwise MPI's blocking results; the
# last rank changes its output array on some calls (the ranks' answer is then no, on every rank), its plan differs
# from the others' on others (in place against a separate output, one signature), and other calls come between
if p > 1 and mpi is not None:
    for collective in COLLECTIVES:
        dtype = np.dtype(np.int32)
        op = "max" if collective in ("allreduce", "reduce_scatter", "reduce") else "sum"
        n = 6 * p
        x, spare = np.zeros(n, dtype), None
        out_size = {"reduce_scatter": n // p, "allgather": n * p}.get(collective, n)
        out, spare = np.zeros(out_size, dtype), np.zeros(out_size, dtype)
        for step in range(8):
            x[...] = (np.arange(n) * (step + 3) + 7 * rank) % 1000
            keep = x.copy()
            ref = reference(collective, keep.copy(), op, 1 % p, 0)
            inplace = step in (4, 5) and rank == 0 and collective in ("allreduce", "reduce")
            target = spare if (step == 2 and rank == p - 1) else out
            try:
                got = call(collective, x, x if inplace else target, op, 1 % p, "native")
            except Exception as exc:  # noqa: BLE001
                fail(f"repeated native {collective} step {step}: {type(exc).__name__}: {exc}")
                break
            cases += 1
            if step == 6:  # another call between two repeats
                comm.allreduce(np.ones(3, np.float32))
            if collective == "reduce" and rank != 1 % p:
                continue
            if got.reshape(-1).tobytes() != ref.reshape(-1).tobytes():
                fail(f"repeated native {collective} step {step}: {got.reshape(-1)[:6]} != MPI's {ref.reshape(-1)[:6]}")
    if args.check != "off" and comm.shared_memory and comm._ctx.native_request is None:
        fail("repeated calls of MPI's own collective never ran as a persistent request")

# two communicators: a rank blocked on B still advances its asynchronous call on A, which its peers wait for
if p > 1:
    other = init(comm.mpi_comm if mpi is not None else comm.runtime.duplicate(), check=args.check, timeout=60)
    a, b = np.full(100, rank, np.int64), np.full(100, 2 * rank, np.int64)
    try:
        if rank == 0:
            w = comm.allreduce(a, out=a, async_op=True)
            other.allreduce(b, out=b)
            w.wait()
        else:
            comm.allreduce(a, out=a)
            other.allreduce(b, out=b)
        want = sum(range(p))
        if not (np.all(a == want) and np.all(b == 2 * want)):
            fail(f"two communicators: {a[:3]} {b[:3]}")
    except Exception as exc:  # noqa: BLE001
        fail(f"two communicators: {type(exc).__name__}: {exc}")
    cases += 1
    other.close()

# persistent calls: each collective bound once and run three times (the last asynchronously) with new values in
# the bound input, bitwise MPI's results; after the communicator drops its plans (`check` set) the call plans
# again (its calls still counted); a persistent call against another rank's different call raises CallMismatchError on every rank
for collective in COLLECTIVES:
    for dtype in (np.dtype(np.float32), np.dtype(np.int32)):
        op = "max" if collective in ("allreduce", "reduce_scatter", "reduce") and dtype.kind == "i" else "sum"
        for mode in ("separate", "inplace"):
            if collective == "broadcast" and mode == "separate" or \
                    mode == "inplace" and collective in ("reduce_scatter", "allgather", "alltoall") and p > 1:
                continue  # broadcast is in place; these have no in-place form above one rank
            salt = zlib.crc32(f"persistent/{collective}/{dtype}/{mode}".encode())
            root = salt % p
            n = 37 * p if collective in ("reduce_scatter", "alltoall") else 37
            x = data(n, dtype, salt, op)
            size = {"reduce_scatter": n // p, "allgather": n * p}.get(collective, n)
            out = x if mode == "inplace" else np.full(size, 7, dtype)
            label = f"persistent {collective}/{dtype}/{mode}"
            try:
                bound = comm.persistent(collective, x, out=out, op=op, root=root)
                for run in range(4):
                    if run == 3:
                        comm.check = args.check  # drops every plan: the next run plans again
                    x[...] = data(n, dtype, salt + run, op)
                    ref = reference(collective, x, op, root, salt + run)
                    counted = comm.stats["calls"]
                    got = bound.start().wait() if run == 2 else bound.run()
                    cases += 1
                    if comm.stats["calls"] != counted + 1:  # a dropped plan's calls would not count
                        fail(f"{label} run {run}: stats counted {comm.stats['calls'] - counted} calls, not 1")
                    if collective == "reduce" and rank != root:
                        if got is not None:
                            fail(f"{label} run {run}: a non-root got {type(got).__name__}")
                    elif got is not out:
                        fail(f"{label} run {run}: the bound output was not returned")
                    elif got.reshape(-1).tobytes() != ref.reshape(-1).tobytes():
                        fail(f"{label} run {run}: {got.reshape(-1)[:6]} != MPI's {ref.reshape(-1)[:6]}")
            except Exception as exc:  # noqa: BLE001 - a failure of this case
                fail(f"{label}: {type(exc).__name__}: {exc}")
x = np.ones(8, np.float32)
for label, fn in [("barrier", lambda: comm.persistent("barrier", x)),
                  ("allgather with an op", lambda: comm.persistent("allgather", x, op="max")),
                  ("out too small", lambda: comm.persistent("allreduce", x, out=np.empty(3, x.dtype)))]:
    try:
        fn()
        fail(f"persistent {label}: no error")
    except ValueError:
        cases += 1
if p > 1 and args.check != "off":
    bound = comm.persistent("allreduce", np.ones(10, np.float32))
    try:
        bound.run() if rank != p - 1 else comm.allreduce(np.ones(11, np.float32))
        fail("persistent call against another rank's different count: no error")
    except collectives.CallMismatchError:
        mismatches += 1
    y = bound.run()
    if not np.array_equal(y, np.full(10, p, np.float32)):
        fail(f"a persistent call after a mismatch: {y}")
    cases += 2

stats = comm.stats
out = {"cases": cases, "failures": len(failures), "messages": failures[:20], "mismatches": mismatches,
       "calls": stats["calls"], "native_calls": stats["native_calls"], "shared_memory": comm.shared_memory}
if mpi is not None:
    everyone = mpi.gather(out, root=0)
else:
    store.set(f"result/{rank}", json.dumps(out))
    everyone = [json.loads(store.get(f"result/{q}")) for q in range(p)] if rank == 0 else None
if rank == 0:
    total = {"cases": min(o["cases"] for o in everyone), "failures": sum(o["failures"] for o in everyone),
             "messages": [m for o in everyone for m in o["messages"]][:20],
             "mismatches": min(o["mismatches"] for o in everyone), "calls": everyone[0]["calls"],
             "native_calls": everyone[0]["native_calls"], "shared_memory": everyone[0]["shared_memory"]}
    print("RESULT " + json.dumps(total), flush=True)
comm.close()
