"""Run under mpiexec (2-4 ranks): the torch.distributed calls frameworks make beyond all_reduce, on backend
"collectives", each checked against the result computed locally from every rank's (deterministic) input.
Prints `RESULT {json}` on rank 0 (cases run, failures with their messages).

Covers all_to_all / all_to_all_single (even, uneven, empty blocks), send/recv/isend/irecv (tags, any source),
batch_isend_irecv, gather, scatter, uneven all_gather and reduce_scatter, all_gather_coalesced,
all_reduce_coalesced and the _coalescing_manager, all_gather_into_tensor / reduce_scatter_tensor coalesced,
bitwise ops, PREMUL_SUM, barrier, monitored_barrier, and Work: wait(timeout), is_completed, get_future (also
completed with nobody waiting), errors.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

import collectives.torch as ct

warnings.filterwarnings("ignore")

rank, size = ct.init_process_group(timeout=60)
failures: list[str] = []
cases = 0


def data(r: int, n: int, dtype=torch.float32, salt: int = 0) -> torch.Tensor:
    """Rank r's input: small integers, different on every rank and element (exact in every dtype)."""
    return ((torch.arange(n, dtype=torch.int64) * 7 + r * 3 + salt) % 5 + 1).to(dtype)


def same(name: str, got, want) -> None:
    global cases
    cases += 1
    if not isinstance(got, torch.Tensor) or got.dtype != want.dtype or got.shape != want.shape \
            or not torch.equal(got, want):
        shown = got.flatten()[:8].tolist() if isinstance(got, torch.Tensor) else got
        failures.append(f"{name}: got {shown} ({getattr(got, 'dtype', '')}{tuple(getattr(got, 'shape', ()))}), "
                        f"want {want.flatten()[:8].tolist()} ({want.dtype}{tuple(want.shape)})")


def truth(name: str, ok: bool, detail: str = "") -> None:
    global cases
    cases += 1
    if not ok:
        failures.append(f"{name}: {detail}")


def case(fn):
    def run(*args):
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a failure of one check, named
            failures.append(f"{fn.__name__}{args}: {traceback.format_exc(limit=4)}")
    return run


@case
def all_to_all_single_even(dtype):
    k = 3
    inp = torch.cat([data(rank, k, dtype, salt=d) for d in range(size)])  # block d for rank d
    out = torch.empty(size * k, dtype=dtype)
    dist.all_to_all_single(out, inp)
    same(f"all_to_all_single even {dtype}", out, torch.cat([data(s, k, dtype, salt=rank) for s in range(size)]))
    work = dist.all_to_all_single(out2 := torch.empty_like(out), inp, async_op=True)
    work.wait()
    same("all_to_all_single async", out2, out)


@case
def all_to_all_single_uneven():
    # rank s sends (s + d) % 3 rows of 2 columns to rank d (some empty)
    rows = [[(s + d) % 3 for d in range(size)] for s in range(size)]
    inp = torch.cat([data(rank, rows[rank][d] * 2, salt=d).view(-1, 2) for d in range(size)])
    out = torch.empty(sum(rows[s][rank] for s in range(size)), 2)
    dist.all_to_all_single(out, inp, output_split_sizes=[rows[s][rank] for s in range(size)],
                           input_split_sizes=rows[rank])
    want = torch.cat([data(s, rows[s][rank] * 2, salt=rank).view(-1, 2) for s in range(size)])
    same("all_to_all_single uneven", out, want)


@case
def all_to_all_lists():
    inp = [data(rank, d + 1, torch.int32, salt=d) for d in range(size)]  # rank d gets d + 1 elements
    out = [torch.empty(rank + 1, dtype=torch.int32) for _ in range(size)]
    dist.all_to_all(out, inp)
    for s in range(size):
        same(f"all_to_all from {s}", out[s], data(s, rank + 1, torch.int32, salt=rank))
    inp = [data(rank, 4, salt=d) for d in range(size)]
    out = [torch.empty(4) for _ in range(size)]
    dist.all_to_all(out, inp)
    same("all_to_all even", torch.stack(out), torch.stack([data(s, 4, salt=rank) for s in range(size)]))


@case
def point_to_point():
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    # ring exchange with tags; isend before irecv and the reverse
    send = data(rank, 5, torch.float64)
    got = torch.empty(5, dtype=torch.float64)
    s = dist.isend(send, nxt, tag=7)
    r = dist.irecv(got, prv, tag=7)
    truth("irecv wait returns True", r.wait(timeout=timedelta(seconds=30)) is True)
    s.wait()
    same("isend/irecv ring", got, data(prv, 5, torch.float64))
    # two messages with different tags, received in the opposite order
    if rank == 0:
        dist.send(torch.full((2,), 1.0), 1, tag=1)
        dist.send(torch.full((2,), 2.0), 1, tag=2)
    elif rank == 1:
        b, a = torch.empty(2), torch.empty(2)
        w2 = dist.irecv(b, 0, tag=2)
        w1 = dist.irecv(a, 0, tag=1)
        w2.wait()
        w1.wait()
        same("tag 2 matched", b, torch.full((2,), 2.0))
        same("tag 1 matched", a, torch.full((2,), 1.0))
    # any source: rank 0 receives one message from every other rank, learning who sent each (a tag of its own:
    # a later message with the same tag from a rank that ran ahead could match too)
    if rank == 0:
        seen = set()
        for _ in range(size - 1):
            t = torch.empty(3, dtype=torch.int64)
            src = dist.recv(t, tag=5)
            seen.add(src)
            same(f"recv from any source ({src})", t, data(src, 3, torch.int64))
        truth("any-source senders", seen == set(range(1, size)), f"{seen}")
    else:
        dist.send(data(rank, 3, torch.int64), 0, tag=5)
    # send to self (isend/irecv allow it)
    mine = torch.empty(4, dtype=torch.bfloat16)
    works = [dist.irecv(mine, rank, tag=3), dist.isend(data(rank, 4, torch.bfloat16), rank, tag=3)]
    for w in works:
        w.wait()
    same("send to self", mine, data(rank, 4, torch.bfloat16))


@case
def batch_send_recv():
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got = [torch.empty(6), torch.empty(2, dtype=torch.int16)]
    ops = [dist.P2POp(dist.irecv, got[0], prv), dist.P2POp(dist.isend, data(rank, 6), nxt),
           dist.P2POp(dist.isend, data(rank, 2, torch.int16), nxt, tag=9),
           dist.P2POp(dist.irecv, got[1], prv, tag=9)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    same("batch_isend_irecv float", got[0], data(prv, 6))
    same("batch_isend_irecv int16 tag", got[1], data(prv, 2, torch.int16))


@case
def gather_scatter(dtype):
    root = size - 1
    gl = [torch.empty(4, dtype=dtype) for _ in range(size)] if rank == root else None
    dist.gather(data(rank, 4, dtype), gl, dst=root)
    if rank == root:
        same(f"gather {dtype}", torch.stack(gl), torch.stack([data(r, 4, dtype) for r in range(size)]))
    out = torch.empty(3, dtype=dtype)
    sl = [data(root, 3, dtype, salt=r) for r in range(size)] if rank == root else None
    dist.scatter(out, sl, src=root)
    same(f"scatter {dtype}", out, data(root, 3, dtype, salt=rank))


@case
def uneven_all_gather_and_reduce_scatter():
    outs = [torch.empty(r + 2) for r in range(size)]  # rank r contributes r + 2 elements
    dist.all_gather(outs, data(rank, rank + 2))
    for r in range(size):
        same(f"uneven all_gather block {r}", outs[r], data(r, r + 2))
    ins = [data(rank, r + 1, torch.int64, salt=r) for r in range(size)]  # block r has rank r's size
    out = torch.empty(rank + 1, dtype=torch.int64)
    dist.reduce_scatter(out, ins)
    same("uneven reduce_scatter", out, sum(data(s, rank + 1, torch.int64, salt=rank) for s in range(size)))


@case
def coalesced():
    tensors = [data(rank, 3), data(rank, 5).view(5, 1), data(rank, 2)]  # torch requires one dtype
    dist.all_reduce_coalesced(tensors, op=dist.ReduceOp.MAX)
    for i, n in enumerate((3, 5, 2)):
        want = torch.stack([data(r, n) for r in range(size)]).max(0).values.view(tensors[i].shape)
        same(f"all_reduce_coalesced {i}", tensors[i], want)
    ins = [data(rank, 2, torch.int8), data(rank, 6, torch.int8).view(2, 3)]  # torch requires one dtype
    outs = [[torch.empty(2, dtype=torch.int8), torch.empty(2, 3, dtype=torch.int8)] for _ in range(size)]
    dist.all_gather_coalesced(outs, ins)
    for r in range(size):
        same(f"all_gather_coalesced {r}.0", outs[r][0], data(r, 2, torch.int8))
        same(f"all_gather_coalesced {r}.1", outs[r][1], data(r, 6, torch.int8).view(2, 3))
    # the coalescing manager, synchronous and asynchronous (what FSDP's and DTensor's fast paths record)
    from torch.distributed.distributed_c10d import _coalescing_manager
    a, b = data(rank, 4), data(rank, 7)
    with _coalescing_manager():
        dist.all_reduce(a)
        dist.all_reduce(b)
    same("coalescing manager all_reduce a", a, sum(data(r, 4) for r in range(size)))
    same("coalescing manager all_reduce b", b, sum(data(r, 7) for r in range(size)))
    gin = [data(rank, 2), data(rank, 3)]
    gout = [torch.empty(2 * size), torch.empty(3 * size)]
    with _coalescing_manager(async_ops=True) as cm:
        for o, i in zip(gout, gin, strict=True):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    same("coalesced all_gather_into_tensor 0", gout[0], torch.cat([data(r, 2) for r in range(size)]))
    same("coalesced all_gather_into_tensor 1", gout[1], torch.cat([data(r, 3) for r in range(size)]))
    rin = [torch.cat([data(rank, 2, salt=d) for d in range(size)]), torch.cat([data(rank, 3, salt=d)
                                                                             for d in range(size)])]
    rout = [torch.empty(2), torch.empty(3)]
    with _coalescing_manager(async_ops=True) as cm:
        for o, i in zip(rout, rin, strict=True):
            dist.reduce_scatter_tensor(o, i)
    cm.wait()
    same("coalesced reduce_scatter_tensor 0", rout[0], sum(data(r, 2, salt=rank) for r in range(size)))
    same("coalesced reduce_scatter_tensor 1", rout[1], sum(data(r, 3, salt=rank) for r in range(size)))
    # the group methods FSDP2 calls directly (mixed sizes; bfloat16)
    pg = dist.distributed_c10d._get_default_group()
    gin = [data(rank, 3, torch.bfloat16), data(rank, 1, torch.bfloat16)]
    gout = [torch.empty(3 * size, dtype=torch.bfloat16), torch.empty(size, dtype=torch.bfloat16)]
    pg.allgather_into_tensor_coalesced(gout, gin).wait()
    same("allgather_into_tensor_coalesced", gout[0], torch.cat([data(r, 3, torch.bfloat16) for r in range(size)]))
    rout = [torch.empty(2, dtype=torch.bfloat16), torch.empty(1, dtype=torch.bfloat16)]
    rin = [data(rank, 2 * size, torch.bfloat16), data(rank, size, torch.bfloat16)]
    pg.reduce_scatter_tensor_coalesced(rout, rin, dist.ReduceScatterOptions()).wait()
    want = sum(data(r, 2 * size, torch.float32) for r in range(size))[2 * rank:2 * rank + 2].to(torch.bfloat16)
    same("reduce_scatter_tensor_coalesced", rout[0], want)


@case
def bitwise(dtype):
    t = data(rank, 9, dtype) * (rank + 1)
    xs = [data(r, 9, dtype) * (r + 1) for r in range(size)]
    for op, fn in ((dist.ReduceOp.BAND, torch.bitwise_and), (dist.ReduceOp.BOR, torch.bitwise_or),
                   (dist.ReduceOp.BXOR, torch.bitwise_xor)):
        u = t.clone()
        dist.all_reduce(u, op=op)
        want = xs[0]
        for x in xs[1:]:
            want = fn(want, x)
        same(f"all_reduce {op} {dtype}", u, want)


@case
def premul_sum(dtype):
    factor = 0.25  # exact in every float dtype: the results must match bitwise
    t = data(rank, 6, dtype)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
    want = sum((data(r, 6, dtype) * factor) for r in range(size))
    same(f"PREMUL_SUM all_reduce {dtype}", t, want.to(dtype))
    out = torch.empty(3, dtype=dtype)
    full = torch.cat([data(rank, 3, dtype, salt=d) for d in range(size)])
    dist.reduce_scatter_tensor(out, full, op=dist._make_nccl_premul_sum(torch.tensor([factor], dtype=dtype)))
    same(f"PREMUL_SUM reduce_scatter_tensor {dtype}", out, sum(data(r, 3, dtype, salt=rank) * factor
                                                               for r in range(size)).to(dtype))
    same(f"PREMUL_SUM leaves the input {dtype}", full, torch.cat([data(rank, 3, dtype, salt=d) for d in range(size)]))


@case
def works_and_futures():
    t = data(rank, 1000)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    chained = fut.then(lambda f: f.value()[0] * 2)
    # nobody waits on the Work: the driver thread completes the future, and the chained callback runs
    deadline = time.monotonic() + 30
    while not chained.done() and time.monotonic() < deadline:
        time.sleep(0.001)
    truth("future completed with nobody waiting", chained.done())
    same("chained future value", chained.wait(), 2 * sum(data(r, 1000) for r in range(size)))
    truth("is_completed after the future", work.is_completed() and work.is_success())
    truth("result() is the output list", work.result()[0] is t)
    works = [dist.all_reduce(torch.ones(50) * (i + 1), async_op=True) for i in range(5)]
    truth("wait(timeout) returns True", all(w.wait(timedelta(seconds=30)) for w in works))
    b = dist.barrier(async_op=True)
    b.wait()
    truth("barrier Work completes", b.is_completed())


@case
def errors():
    t = torch.ones(4 + rank)  # ranks disagree on the size: the library's call agreement fails it everywhere
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    raised = None
    try:
        work.wait()
    except Exception as exc:  # noqa: BLE001
        raised = exc
    truth("a failed call raises from wait()", raised is not None and "count" in str(raised), repr(raised))
    truth("is_success() is False after a failure", not work.is_success())
    truth("exception() returns the error", work.exception() is raised)
    try:
        fut.wait()
        truth("the future carries the error", False, "fut.wait() did not raise")
    except Exception:  # noqa: BLE001
        truth("the future carries the error", True)
    for bad, what in ((lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND), "BAND on float32"),
                      (lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32),
                                               op=dist._make_nccl_premul_sum(2.0)), "PREMUL_SUM on int32"),
                      (lambda: dist.all_to_all_single(torch.empty(3), torch.empty(3), [1] * size, [3] + [0] * (size - 1))
                       if size > 1 else (_ for _ in ()).throw(ValueError), "bad splits")):
        try:
            bad()
            truth(what, False, "no error")
        except (TypeError, ValueError, RuntimeError):
            truth(what, True)
    t = torch.ones(3)
    dist.all_reduce(t)
    same("the group works after the errors", t, torch.full((3,), float(size)))


@case
def monitored():
    ct.monitored_barrier(timeout=timedelta(seconds=30))
    truth("monitored_barrier passes when every rank arrives", True)
    # rank size-1 skips it: rank 0 names it within the timeout; the others get rank 0's silence
    if rank != size - 1:
        start = time.monotonic()
        try:
            ct.monitored_barrier(timeout=timedelta(seconds=2))
            truth("monitored_barrier names a missing rank", False, "no error")
        except RuntimeError as exc:
            if rank == 0:
                truth("monitored_barrier names a missing rank", f"Rank {size - 1} failed to pass" in str(exc),
                      str(exc))
            truth("monitored_barrier gives up after its timeout", time.monotonic() - start < 10)
    dist.barrier()


for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8):
    all_to_all_single_even(dtype)
    gather_scatter(dtype)
all_to_all_single_uneven()
all_to_all_lists()
point_to_point()
batch_send_recv()
uneven_all_gather_and_reduce_scatter()
coalesced()
for dtype in (torch.int8, torch.int32, torch.int64, torch.uint8, torch.uint64):
    bitwise(dtype)
for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
    premul_sum(dtype)
works_and_futures()
errors()
dist.barrier()
if size > 2:
    monitored()

gathered = [None] * size
dist.all_gather_object(gathered, failures)
dist.destroy_process_group()
if rank == 0:
    messages = [f"rank {r}: {m}" for r, fs in enumerate(gathered) for m in fs]
    print("RESULT " + json.dumps({"cases": cases, "failures": len(messages), "messages": messages[:30], "size": size}))
sys.stdout.flush()
