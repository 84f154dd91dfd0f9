"""The torch.distributed backend "collectives" against gloo, in the same launch, and the library's own call.

    mpiexec -n 2 python bench/bench_torch.py                  # 8 B .. 64 MiB, four collectives
    mpiexec -n 4 python bench/bench_torch.py --max-size 1MiB
    mpiexec -n 2 python bench/bench_torch.py --overhead       # only the 8-byte all_reduce overhead check

One launch creates the default group with backend "collectives" and a second group over the same ranks with
backend "gloo". For each collective and size the two are timed paired and interleaved (a block of calls on one,
then the same block on the other, `--rounds` times), so both see the same machine state; the row shows the median
per-call time of each and gloo / collectives (> 1: the backend is faster). Each row also times the library's own call
(`Communicator.allreduce`, `allgather`, `reduce_scatter`, `alltoall` on numpy arrays of the same sizes, on the
backend's communicator) and, for all_reduce, `dist.all_reduce` on a
group of a no-op Python backend (a group whose allreduce returns at once: what torch's own Python wrapper costs
per call) in the same rounds; the rows print the backend's cost over the library's.

Sizes are the bytes of the tensor each call takes: all_reduce's tensor, all_gather_into_tensor's output,
reduce_scatter_tensor's input, all_to_all_single's input (float32 elements). Progress goes to stderr; rank 0
prints the table (and `--json FILE` writes it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import collectives.torch as ct
from collectives.units import human, parse_size

COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")


class NoopGroup(dist.ProcessGroup):
    """A group whose allreduce returns a completed Work at once: torch's per-call cost without any backend."""

    def __init__(self, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self._work = ct.CompletedWork()

    def allreduce(self, tensors, opts=None):
        return self._work

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "noop"


def noop_group(p: int):
    dist.Backend.register_backend("noop", lambda o, _=None: NoopGroup(o.group_rank, o.group_size),
                                  extended_api=True, devices=["cpu"])
    return dist.new_group(list(range(p)), backend="noop")


def sizes(lo: int, hi: int) -> list[int]:
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 8
    if out[-1] != hi:
        out.append(hi)
    return out


def make_call(name: str, nbytes: int, group, p: int):
    """A zero-argument function running one blocking call of `name` on `group` with `nbytes`-byte tensors."""
    n = max(nbytes // 4, 1)
    if name == "all_reduce":
        t = torch.ones(n)
        return lambda: dist.all_reduce(t, group=group)
    k = max(n // p, 1)
    if name == "all_gather_into_tensor":
        inp, out = torch.ones(k), torch.empty(k * p)
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)
    if name == "reduce_scatter_tensor":
        inp, out = torch.ones(k * p), torch.empty(k)
        return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
    inp, out = torch.ones(k * p), torch.empty(k * p)
    return lambda: dist.all_to_all_single(out, inp, group=group)


def make_library_call(name: str, nbytes: int, comm, p: int):
    """The same call on the library's own Communicator (numpy arrays of the same sizes)."""
    n = max(nbytes // 4, 1)
    if name == "all_reduce":
        a = np.ones(n, np.float32)
        return lambda: comm.allreduce(a, out=a)
    k = max(n // p, 1)
    if name == "all_gather_into_tensor":
        inp, out = np.ones(k, np.float32), np.empty(k * p, np.float32)
        return lambda: comm.allgather(inp, out=out)
    if name == "reduce_scatter_tensor":
        inp, out = np.ones(k * p, np.float32), np.empty(k, np.float32)
        return lambda: comm.reduce_scatter(inp, out=out)
    inp, out = np.ones(k * p, np.float32), np.empty(k * p, np.float32)
    return lambda: comm.alltoall(inp, out=out)


def per_call(fn, iters: int, sync) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def agreed_iters(fn, sync, budget: float) -> int:
    """Calls per block so that a block takes about `budget` seconds (rank 0's estimate, sent to every rank)."""
    fn()
    t = per_call(fn, 3, sync)
    iters = max(1, min(20000, int(budget / max(t, 1e-7))))
    box = torch.tensor([iters])
    dist.broadcast(box, src=0)
    return int(box.item())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min-size", default="8B")
    ap.add_argument("--max-size", default="64MiB")
    ap.add_argument("--collectives", nargs="+", default=list(COLLECTIVES), choices=COLLECTIVES)
    ap.add_argument("--rounds", type=int, default=7, help="interleaved blocks per backend and size")
    ap.add_argument("--budget", type=float, default=0.05, help="seconds per block")
    ap.add_argument("--overhead", action="store_true", help="only the 8-byte all_reduce: backend vs library")
    ap.add_argument("--json", help="write the rows here (rank 0)")
    args = ap.parse_args()

    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13 renames *_into_tensor / *_tensor
    torch.set_num_threads(1)  # the ranks share the host's cores
    rank, p = ct.init_process_group()
    gloo = dist.new_group(list(range(p)), backend="gloo")
    noop = noop_group(p)
    comm = dist.distributed_c10d._get_default_group().comm  # the backend's library communicator
    barrier = comm.mpi_comm.Barrier
    if args.overhead:
        args.collectives, args.min_size, args.max_size = ["all_reduce"], "8B", "8B"
    rows = []
    for name in args.collectives:
        for nbytes in sizes(parse_size(args.min_size), parse_size(args.max_size)):
            fns = {"collectives": make_call(name, nbytes, None, p), "gloo": make_call(name, nbytes, gloo, p),
                   "library": make_library_call(name, nbytes, comm, p)}
            if name == "all_reduce":
                fns["torch_noop"] = make_call(name, nbytes, noop, p)
            iters = {k: agreed_iters(fn, barrier, args.budget) for k, fn in fns.items()}
            times = {k: [] for k in fns}
            for _ in range(args.rounds):
                for k, fn in fns.items():
                    times[k].append(per_call(fn, iters[k], barrier))
            med = {k: statistics.median(v) for k, v in times.items()}
            row = {"collective": name, "bytes": nbytes, "ranks": p,
                   **{f"{k}_us": round(v * 1e6, 2) for k, v in med.items()},
                   "gloo_over_collectives": round(med["gloo"] / med["collectives"], 2)}
            row["collectives_over_library"] = round(med["collectives"] / med["library"], 2)
            rows.append(row)
            if rank == 0:
                print(f"{name} {human(nbytes)}: {row}", file=sys.stderr, flush=True)
    if rank == 0:
        print(f"# torch {torch.__version__}, {p} ranks, median of {args.rounds} interleaved blocks per backend")
        print(f"{'collective':24s} {'size':>9s} {'collectives us':>15s} {'gloo us':>12s} {'gloo/coll':>10s} "
              f"{'library us':>11s} {'coll/library':>12s} {'torch no-op us':>15s}")
        for r in rows:
            lib = f"{r['library_us']:11.2f} {r['collectives_over_library']:12.2f}" + \
                (f" {r['torch_noop_us']:15.2f}" if "torch_noop_us" in r else "")
            print(f"{r['collective']:24s} {human(r['bytes']):>9s} {r['collectives_us']:15.2f} "
                  f"{r['gloo_us']:12.2f} {r['gloo_over_collectives']:10.2f} {lib}")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(rows, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
