"""Run under mpiexec or torchrun: every torch.distributed collective x dtype x op on backend "collectives", checked
against the result computed locally from every rank's (deterministic) input. Prints `RESULT {json}` on rank 0,
with what the default group ran on ("runtime") and whether any rank imported mpi4py.MPI ("mpi_imported": under
torchrun, none may).

Inputs are small integers, so sums, products, minima and maxima are exact in every dtype (bfloat16 included)
and the results must match bitwise; avg is compared with a tolerance (one rounding of sum / p).
"""

from __future__ import annotations

import json
import sys
import traceback
import warnings

import torch
import torch.distributed as dist

import collectives.torch as ct

warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13 renames *_into_tensor / *_tensor

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.int32, torch.int64, torch.uint8]
DTYPES = FLOATS + INTS
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "prod": dist.ReduceOp.PRODUCT,
       "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
COUNTS = [1, 7, 5003]

rank, size = ct.init_process_group()
failures: list[str] = []
cases = 0


def data(r: int, n: int, dtype, salt: int = 0) -> torch.Tensor:
    """Rank r's input: values 1..4, different on every rank and element."""
    return ((torch.arange(n, dtype=torch.int64) * 7 + r * 3 + salt) % 4 + 1).to(dtype)


def reduced(n: int, dtype, op: str, salt: int = 0, ranks=None) -> torch.Tensor:
    ranks = range(size) if ranks is None else ranks
    xs = torch.stack([data(r, n, torch.float64, salt) for r in ranks])
    value = {"sum": xs.sum(0), "avg": xs.sum(0), "prod": xs.prod(0), "min": xs.min(0).values,
             "max": xs.max(0).values}[op]
    if op == "avg":
        if dtype in (torch.float16, torch.bfloat16):  # the library divides in float32 and rounds once
            return (value.float() / len(ranks)).to(dtype)
        return (value.to(dtype) / len(ranks)).to(dtype)
    return value.to(dtype)


def same(name: str, got: torch.Tensor, want: torch.Tensor, *, tol: bool = False) -> None:
    global cases
    cases += 1
    if got.dtype != want.dtype or got.shape != want.shape:
        failures.append(f"{name}: got {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}")
        return
    ok = torch.allclose(got.double(), want.double(), rtol=1e-2, atol=0) if tol else torch.equal(got, want)
    if not ok:
        failures.append(f"{name}: got {got.flatten()[:8].tolist()} want {want.flatten()[:8].tolist()}")


def case(fn):
    """Run one check; an exception is a failure (named), not the end of the run."""
    def run(*args):
        try:
            fn(*args)
        except Exception:  # noqa: BLE001
            failures.append(f"{fn.__name__}{args}: {traceback.format_exc(limit=3)}")
    return run


def ops_for(dtype):
    return [op for op in OPS if op != "avg" or dtype in FLOATS]


@case
def all_reduce(dtype, op, n):
    t = data(rank, n, dtype)
    work = dist.all_reduce(t, op=OPS[op], async_op=True)
    work.wait()
    value = work.get_future().value()
    same(f"all_reduce {dtype} {op} n={n}", t, reduced(n, dtype, op), tol=op == "avg")
    if not (isinstance(value, list) and len(value) == 1 and value[0] is t):
        failures.append(f"all_reduce future value is {type(value).__name__}, not [tensor]")


@case
def all_reduce_noncontiguous(dtype, op):
    base = torch.zeros(6, 10, dtype=dtype)
    view = base[:, ::2].t()  # 5 x 6, strided both ways
    view.copy_(data(rank, 30, dtype).view(5, 6))
    dist.all_reduce(view, op=OPS[op])
    same(f"all_reduce non-contiguous {dtype} {op}", view.reshape(-1), reduced(30, dtype, op), tol=op == "avg")
    same(f"all_reduce non-contiguous untouched {dtype}", base[:, 1::2], torch.zeros(6, 5, dtype=dtype))


@case
def broadcast(dtype, n):
    t = data(rank, n, dtype)
    dist.broadcast(t, src=1)
    same(f"broadcast {dtype} n={n}", t, data(1, n, dtype))


@case
def reduce(dtype, op):
    n = 9
    t = data(rank, n, dtype)
    dist.reduce(t, dst=2 % size, op=OPS[op])
    if rank == 2 % size:
        same(f"reduce {dtype} {op}", t, reduced(n, dtype, op), tol=op == "avg")


@case
def all_gather(dtype, n):
    outs = [torch.empty(n, dtype=dtype) for _ in range(size)]
    dist.all_gather(outs, data(rank, n, dtype))
    for r in range(size):
        same(f"all_gather {dtype} n={n} block {r}", outs[r], data(r, n, dtype))


@case
def all_gather_into_tensor(dtype, n):
    for fn_name in ("all_gather_into_tensor", "all_gather_single"):
        fn = getattr(dist, fn_name, None)
        if fn is None:
            continue
        out = torch.empty(size * n, dtype=dtype)
        fn(out, data(rank, n, dtype))
        same(f"{fn_name} {dtype} n={n}", out, torch.cat([data(r, n, dtype) for r in range(size)]))
    # input is a chunk of the output (FSDP does this)
    out = torch.zeros(size, n, dtype=dtype)
    out[rank] = data(rank, n, dtype)
    dist.all_gather_into_tensor(out, out[rank])
    same(f"all_gather_into_tensor aliased {dtype}", out.reshape(-1),
         torch.cat([data(r, n, dtype) for r in range(size)]))


@case
def reduce_scatter(dtype, op):
    n = 5
    ins = [data(rank, n, dtype, salt=k) for k in range(size)]
    out = torch.empty(n, dtype=dtype)
    dist.reduce_scatter(out, ins, op=OPS[op])
    same(f"reduce_scatter {dtype} {op}", out, reduced(n, dtype, op, salt=rank), tol=op == "avg")


@case
def reduce_scatter_tensor(dtype, op):
    n = 6
    full = torch.stack([data(rank, n, dtype, salt=k) for k in range(size)])  # (p, n)
    want = reduced(n, dtype, op, salt=rank)
    for fn_name in ("reduce_scatter_tensor", "reduce_scatter_single"):
        fn = getattr(dist, fn_name, None)
        if fn is None:
            continue
        out = torch.empty(n, dtype=dtype)
        fn(out, full, op=OPS[op])
        same(f"{fn_name} {dtype} {op}", out, want, tol=op == "avg")
    big = torch.zeros(2 * n, dtype=dtype)
    out = big[::2]  # non-contiguous output
    dist.reduce_scatter_tensor(out, full.t().contiguous().t(), op=OPS[op])
    same(f"reduce_scatter_tensor strided {dtype} {op}", out, want, tol=op == "avg")


@case
def subgroups():
    evens = [r for r in range(size) if r % 2 == 0]
    g = dist.new_group(evens)
    solo = dist.new_group([size - 1])
    if rank in evens:
        t = data(rank, 11, torch.bfloat16)
        dist.all_reduce(t, group=g)
        same("sub-group all_reduce bf16", t, reduced(11, torch.bfloat16, "sum", ranks=evens))
        b = data(rank, 4, torch.int64)
        dist.broadcast(b, src=evens[-1], group=g)  # src is a global rank
        same("sub-group broadcast", b, data(evens[-1], 4, torch.int64))
        outs = [torch.empty(3) for _ in evens]
        dist.all_gather(outs, data(rank, 3, torch.float32), group=g)
        same("sub-group all_gather", torch.stack(outs), torch.stack([data(r, 3, torch.float32) for r in evens]))
        dist.barrier(group=g)
        if dist.get_backend(g) != "collectives":
            failures.append(f"sub-group backend is {dist.get_backend(g)}")
    exact = dist.new_group(list(range(size)), pg_options=ct.Options(deterministic=True, accumulate="float32"))
    t = data(rank, 301, torch.bfloat16)
    dist.all_reduce(t, group=exact, op=dist.ReduceOp.AVG)
    same("deterministic float32-accumulate group avg bf16", t, reduced(301, torch.bfloat16, "avg"), tol=True)
    if rank == size - 1:
        t = data(rank, 5, torch.float16)
        dist.all_reduce(t, group=solo)
        same("singleton group", t, data(rank, 5, torch.float16))


@case
def errors():
    global cases
    # ranks issue different calls (sizes differ): the library's call agreement fails the call on every rank;
    # the Work carries it and wait() raises, and the group stays usable afterwards.
    t = torch.ones(4 + rank)
    work = dist.all_reduce(t, async_op=True)
    try:
        work.wait()
        failures.append("mismatched all_reduce: wait() did not raise")
    except Exception as exc:  # noqa: BLE001
        cases += 1
        if "count" not in str(exc):
            failures.append(f"mismatched all_reduce raised {type(exc).__name__}: {exc}")
    if work.is_success():
        failures.append("mismatched all_reduce: is_success() is True")
    t = torch.ones(3)
    dist.all_reduce(t)
    same("all_reduce after a mismatch", t, torch.full((3,), float(size)))
    # complex: torch itself views it as float pairs for SUM
    z = torch.full((3,), complex(1, rank), dtype=torch.complex64)
    dist.all_reduce(z)
    same("all_reduce complex64", z, torch.full((3,), complex(size, size * (size - 1) / 2), dtype=torch.complex64))
    # unsupported op / dtype / device: raised at the call, before communicating
    for bad, what in ((lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BXOR), "BXOR"),
                      (lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool)), "bool")):
        try:
            bad()
            failures.append(f"{what}: no error")
        except (TypeError, ValueError, RuntimeError):
            cases += 1


@case
def registration():
    import importlib

    importlib.reload(ct)  # a second registration attempt is a no-op
    ct.register()
    if dist.get_backend() != "collectives" or not ct.is_registered():
        failures.append(f"backend is {dist.get_backend()}")


for dtype in DTYPES:
    for op in ops_for(dtype):
        for n in COUNTS:
            all_reduce(dtype, op, n)
        all_reduce_noncontiguous(dtype, op)
        reduce(dtype, op)
        reduce_scatter(dtype, op)
        reduce_scatter_tensor(dtype, op)
    for n in (0, 1, 7, 4001):
        broadcast(dtype, n)
        all_gather(dtype, n)
        all_gather_into_tensor(dtype, n)
all_reduce(torch.float32, "sum", 0)
dist.barrier()
subgroups()
errors()
registration()
dist.barrier()

runtime = dist.group.WORLD.comm.runtime.name
gathered = [None] * size
dist.all_gather_object(gathered, (failures, "mpi4py.MPI" in sys.modules))
dist.destroy_process_group()
if rank == 0:
    messages = [f"rank {r}: {m}" for r, (fs, _) in enumerate(gathered) for m in fs]
    print("RESULT " + json.dumps({"cases": cases, "failures": len(messages), "messages": messages[:30],
                                  "size": size, "runtime": runtime,
                                  "mpi_imported": [r for r, (_, imported) in enumerate(gathered) if imported]}))
sys.stdout.flush()
