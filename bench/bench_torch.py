"""The torch.distributed backend "collectives" against gloo, in the same launch, and the library's own call.

    mpiexec -n 2 python bench/bench_torch.py                  # 8 B .. 64 MiB, four collectives
    mpiexec -n 4 python bench/bench_torch.py --max-size 1MiB
    mpiexec -n 2 python bench/bench_torch.py --overhead       # only 8-byte calls: backend vs library
    mpiexec -n 1 python bench/bench_torch.py --steps          # the 8-byte all_reduce's steps, CPU clock

One launch creates the default group with backend "collectives" and a second group over the same ranks with
backend "gloo". For each collective and size the calls are timed interleaved: after a warm-up, `--rounds` rounds,
each a block of calls on every contender in turn (the order rotating from round to round), so all see the same
machine state; the row shows the median per-call time of each and gloo / collectives (> 1: the backend is faster).
Each row also times the library's own call (`Communicator.allreduce`, `allgather`, `reduce_scatter`, `alltoall` on
numpy arrays of the same sizes, on the backend's communicator) and, for all_reduce, `dist.all_reduce` on a group
of a no-op Python backend (a group whose allreduce returns a completed Work at once: what torch's own Python
wrapper costs per call); the rows print the backend's cost over the library's, the median of the rounds' own
ratios (a round's blocks ran back to back), with the lowest and highest round.

`--overhead` times only 8-byte calls (no gloo), over more and shorter rounds (41 of 20 ms by default): all_reduce
through the backend, the library's call, torch's no-op floor, a pass-through floor (a Python group whose
allreduce runs the library's call on an array made once, and nothing else), a persistent floor (a Python group
whose allreduce runs the library's persistent call on an array made once, and nothing else: the backend's fast path
without its own checks, look-up and lock) and the library's persistent call alone (`PersistentCall.run` on an
array made once: what the backend's blocking all_reduce runs), with what the backend adds to the persistent floor;
then each other collective of
`--collectives`, the backend against the library's call. Each prints the backend's time over the library's with its
spread. Calls go through the default group, as `dist.all_reduce(t)` (torch's look-up of the default group
included); the floors' groups are passed as `group=`.

`--steps` (best at one rank: `mpiexec -n 1 python bench/bench_torch.py --steps`) times, on the rank's own CPU
clock, the backend's 8-byte all_reduce, the persistent and no-op floors, the group's allreduce called directly, the
persistent run, and each step of the fast path alone: where the backend's microseconds go, and figures that a busy
host changes little (time off the CPU does not count).

Each table ends with the number of rounds in which some rank had the CPU for less than 90% of a block (the
host's other work took it): many such rounds mean the figures measure the host's load, not the calls.

Sizes are the bytes of the tensor each call takes: all_reduce's tensor, all_gather_into_tensor's output,
reduce_scatter_tensor's input, all_to_all_single's input (float32 elements). Progress goes to stderr; rank 0
prints the table (and `--json FILE` writes it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

try:
    import torch
    import torch.distributed as dist
except ImportError as exc:  # torch is an optional extra
    sys.exit(f"bench_torch.py needs PyTorch's CPU build (docs/torch.md, 'Install'): {exc}")

import collectives.torch as ct
from collectives.torch.work import LOCK
from collectives.transport.mpi_library import MPI
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


class PassThroughGroup(NoopGroup):
    """A group whose allreduce runs the library's call on a numpy array made once, with nothing else: torch's
    wrapper plus the library's call, the least any Python backend over the library can cost per call."""

    def __init__(self, rank: int, size: int, comm) -> None:
        super().__init__(rank, size)
        self._comm = comm
        self._array = np.ones(2, np.float32)

    def allreduce(self, tensors, opts=None):
        self._comm.allreduce(self._array, out=self._array)
        return self._work

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "passthrough"


class PersistentGroup(NoopGroup):
    """A group whose allreduce runs the library's persistent call on a numpy array made once (what the backend's
    blocking all_reduce runs), with nothing else: the backend's fast path minus its own checks, look-up and lock."""

    def __init__(self, rank: int, size: int, comm) -> None:
        super().__init__(rank, size)
        self._run = persistent_call(comm)

    def allreduce(self, tensors, opts=None):
        self._run()
        return self._work

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "persistentfloor"


def noop_group(p: int):
    dist.Backend.register_backend("noop", lambda o, _=None: NoopGroup(o.group_rank, o.group_size),
                                  extended_api=True, devices=["cpu"])
    return dist.new_group(list(range(p)), backend="noop")


def pass_through_group(p: int, comm):
    dist.Backend.register_backend("passthrough", lambda o, _=None: PassThroughGroup(o.group_rank, o.group_size, comm),
                                  extended_api=True, devices=["cpu"])
    return dist.new_group(list(range(p)), backend="passthrough")


def persistent_group(p: int, comm):
    dist.Backend.register_backend("persistentfloor",
                                  lambda o, _=None: PersistentGroup(o.group_rank, o.group_size, comm),
                                  extended_api=True, devices=["cpu"])
    return dist.new_group(list(range(p)), backend="persistentfloor")


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


def timed_rounds(fns: dict, rounds: int, budget: float, mpi_comm) -> tuple[dict, int]:
    """Per-call seconds of each function in each of `rounds` rounds (a block of each in turn, the order rotated
    by one every round), after a warm-up of as many calls as a block; and in how many rounds some rank had the CPU
    for less than 90% of a block (the host's other work took it: those rounds measure the load, not the calls)."""
    sync = mpi_comm.Barrier
    iters = {k: agreed_iters(fn, sync, budget) for k, fn in fns.items()}
    for k, fn in fns.items():
        per_call(fn, iters[k], sync)
    names = list(fns)
    times = {k: [] for k in names}
    share = np.ones(rounds)  # the smallest CPU share of a block in the round (this rank)
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            cpu, wall = time.process_time(), time.perf_counter()
            times[k].append(per_call(fns[k], iters[k], sync))
            share[r] = min(share[r], (time.process_time() - cpu) / max(time.perf_counter() - wall, 1e-9))
    lowest = np.empty_like(share)
    mpi_comm.Allreduce(share, lowest, op=MPI.MIN)
    return times, int((lowest < 0.9).sum())


def spread(values: list) -> tuple:
    """(median, lowest, highest)."""
    return statistics.median(values), min(values), max(values)


def ratio_spread(times: dict, over: str, under: str) -> tuple:
    """The rounds' own ratios times[over] / times[under]: (median, lowest, highest)."""
    return spread([a / b for a, b in zip(times[over], times[under], strict=True)])


def persistent_call(comm):
    """The library's 8-byte in-place allreduce as a persistent call (what the backend's all_reduce runs)."""
    a = np.ones(2, np.float32)
    return comm.persistent("allreduce", a, out=a).run


def overhead(rank: int, p: int, comm, noop, rounds: int, budget: float) -> dict:
    """The 8-byte all_reduce through the backend, the library's own call, torch's no-op floor, the pass-through
    floor (torch's wrapper plus the library's call on 8 bytes of numpy, nothing between), the persistent floor
    (torch's wrapper plus a persistent call's run, nothing between) and a persistent call's run on 8 bytes of numpy
    alone (what the backend's blocking all_reduce runs)."""
    fns = {"collectives": make_call("all_reduce", 8, None, p), "library": make_library_call("all_reduce", 8, comm, p),
           "torch_noop": make_call("all_reduce", 8, noop, p),
           "pass_through": make_call("all_reduce", 8, pass_through_group(p, comm), p),
           "persistent_floor": make_call("all_reduce", 8, persistent_group(p, comm), p),
           "persistent": persistent_call(comm)}
    times, starved = timed_rounds(fns, rounds, budget, comm.mpi_comm)
    us = {k: [round(x * 1e6, 3) for x in spread(v)] for k, v in times.items()}
    row = {"collective": "all_reduce", "bytes": 8, "ranks": p, "rounds": rounds, "block_seconds": budget,
           "starved_rounds": starved,
           **{f"{k}_us": v for k, v in us.items()},
           "collectives_over_library": [round(x, 2) for x in ratio_spread(times, "collectives", "library")],
           "pass_through_over_library": [round(x, 2) for x in ratio_spread(times, "pass_through", "library")],
           "persistent_floor_over_library": [round(x, 2) for x in ratio_spread(times, "persistent_floor",
                                                                               "library")],
           "persistent_over_library": [round(x, 2) for x in ratio_spread(times, "persistent", "library")],
           "backend_own_us": [round(x * 1e6, 3) for x in spread([a - b for a, b in zip(
               times["collectives"], times["persistent_floor"], strict=True)])]}
    if rank == 0:
        print(f"# torch {torch.__version__}, {p} ranks, 8-byte all_reduce, {rounds} interleaved rounds of "
              f"{budget * 1e3:g} ms blocks; per call: median (lowest-highest round)")
        for k, label in (("collectives", "backend: dist.all_reduce(t)"),
                         ("library", "library: Communicator.allreduce"),
                         ("torch_noop", "torch's no-op floor (group=noop)"),
                         ("pass_through", "pass-through floor (group=)"),
                         ("persistent_floor", "persistent floor (group=)"),
                         ("persistent", "library: PersistentCall.run")):
            m, lo, hi = us[k]
            print(f"{label:34s} {m:7.2f} us  ({lo:.2f}-{hi:.2f})")
        m, lo, hi = row["backend_own_us"]
        print(f"{'backend - persistent floor':34s} {m:7.2f} us  ({lo:.2f}-{hi:.2f})")
        for k, label in (("collectives_over_library", "backend / library"),
                         ("pass_through_over_library", "pass-through / library"),
                         ("persistent_floor_over_library", "persistent floor / library"),
                         ("persistent_over_library", "persistent run / library")):
            m, lo, hi = row[k]
            print(f"{label:34s} {m:7.2f} x   (rounds {lo:.2f}-{hi:.2f})")
        print(starved_note(starved, rounds, p))
    return row


def overhead_others(rank: int, p: int, comm, names: list, rounds: int, budget: float) -> list:
    """8-byte calls of the other collectives through the backend and the library's own call."""
    rows, starved = [], 0
    for name in names:
        times, hungry = timed_rounds({"collectives": make_call(name, 8, None, p),
                                      "library": make_library_call(name, 8, comm, p)}, rounds, budget, comm.mpi_comm)
        starved += hungry
        rows.append({"collective": name, "bytes": 8, "ranks": p, "rounds": rounds, "block_seconds": budget,
                     "starved_rounds": hungry,
                     **{f"{k}_us": [round(x * 1e6, 3) for x in spread(v)] for k, v in times.items()},
                     "collectives_over_library": [round(x, 2) for x in ratio_spread(times, "collectives", "library")]})
    if rank == 0 and rows:
        print(f"# 8-byte calls, {rounds} interleaved rounds each: median (lowest-highest round)")
        print(f"{'collective':24s} {'backend us':>20s} {'library us':>20s} {'backend / library':>22s}")
        for r in rows:
            cells = [f"{m:.2f} ({lo:.2f}-{hi:.2f})" for m, lo, hi in (r["collectives_us"], r["library_us"])]
            m, lo, hi = r["collectives_over_library"]
            print(f"{r['collective']:24s} {cells[0]:>20s} {cells[1]:>20s} {f'{m:.2f}x ({lo:.2f}-{hi:.2f})':>22s}")
        print(starved_note(starved, rounds * len(rows), p))
    return rows


def steps(rank: int, p: int, comm, noop, rounds: int) -> list:
    """Where an 8-byte all_reduce through the backend spends its time, on each rank's own CPU clock
    (`time.process_time`: time a rank spends off the CPU does not count, so a busy host changes little): the calls
    through torch (backend, persistent floor, no-op floor), the group's allreduce called directly, the library's
    persistent run, and each step of the fast path timed alone (the op's read, the tensor checks, the bound call's
    look-up, the lock, the returned Work's wait; and, to compare, the wait() of a completed Work made in C++ from a
    future). Best read at one rank, where no call waits for a peer."""
    pg = dist.distributed_c10d._get_default_group()
    t = torch.ones(2)
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    dist.all_reduce(t)  # binds t's persistent call
    by_address, ptr, lock, work = pg._by_address, t.data_ptr(), LOCK, pg._done
    tensor_type = torch.Tensor
    done = torch.futures.Future()
    done.set_result([t])
    cpp_work = torch._C._distributed_c10d._create_work_from_future(done)  # a completed Work made in C++

    def locked():
        lock.acquire()
        lock.release()

    fns = {"backend: dist.all_reduce(t)": lambda: dist.all_reduce(t),
           "persistent floor (group=)": make_call("all_reduce", 8, persistent_group(p, comm), p),
           "torch's no-op floor (group=noop)": make_call("all_reduce", 8, noop, p),
           "group.allreduce([t], opts) direct": lambda: pg.allreduce([t], opts),
           "library: PersistentCall.run": persistent_call(comm),
           "step: hash(opts.reduceOp)": lambda: hash(opts.reduceOp),
           "step: opts.asyncOp": lambda: opts.asyncOp,
           "step: type, is_contiguous": lambda: type(t) is tensor_type and t.is_contiguous(),
           "step: look-up by data_ptr": lambda: by_address.get(t.data_ptr()),
           "step: numel, dtype": lambda: (t.numel(), t.dtype),
           "step: lock acquire, release": locked,
           "step: returned Work's wait()": work.wait,
           "(a C++ Work's wait(), for comparison)": cpp_work.wait,
           "empty lambda (the loop's own)": lambda: None}
    if by_address.get(ptr) is None:
        sys.exit("bench_torch.py --steps: the backend's all_reduce took its general path (no bound call for the "
                 "tensor), so its steps are not the fast path's")
    iters = 10000
    times: dict = {k: [] for k in fns}
    for fn in fns.values():
        for _ in range(iters // 10):
            fn()
    sync = comm.mpi_comm.Barrier
    for _ in range(rounds):
        for k, fn in fns.items():
            sync()
            start = time.process_time()
            for _ in range(iters):
                fn()
            times[k].append((time.process_time() - start) / iters)
    rows = [{"what": k, "rank": rank, "ranks": p, "rounds": rounds,
             "cpu_us": [round(x * 1e6, 3) for x in spread(v)]} for k, v in times.items()]
    if rank == 0:
        print(f"# torch {torch.__version__}, {p} rank(s), 8-byte all_reduce and its steps, CPU time per call on "
              f"rank 0: median (lowest-highest) of {rounds} rounds of {iters} calls")
        for r in rows:
            m, lo, hi = r["cpu_us"]
            print(f"{r['what']:40s} {m:7.3f} us  ({lo:.3f}-{hi:.3f})")
    return rows


def starved_note(starved: int, rounds: int, p: int) -> str:
    note = f"# rounds in which a rank had the CPU < 90% of a block: {starved} of {rounds}"
    if starved and p > (os.cpu_count() or 1):
        return note + f" (expected: {p} ranks on {os.cpu_count()} cores)"
    if starved > rounds // 10:
        return note + " (the host was busy: the figures measure its load; rerun on a quiet host)"
    return note


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min-size", default="8B")
    ap.add_argument("--max-size", default="64MiB")
    ap.add_argument("--collectives", nargs="+", default=list(COLLECTIVES), choices=COLLECTIVES)
    ap.add_argument("--rounds", type=int, help="interleaved rounds per size (default 7; --overhead: 41)")
    ap.add_argument("--budget", type=float, help="seconds per block (default 0.05; --overhead: 0.02)")
    ap.add_argument("--overhead", action="store_true", help="only 8-byte calls: backend vs library (and floors)")
    ap.add_argument("--steps", action="store_true", help="the 8-byte all_reduce's steps on the CPU clock "
                    "(best at one rank: mpiexec -n 1)")
    ap.add_argument("--json", help="write the rows here (rank 0)")
    args = ap.parse_args()
    rounds = args.rounds or (41 if args.overhead else 7)
    budget = args.budget or (0.02 if args.overhead else 0.05)
    if rounds < 1 or budget <= 0:
        ap.error(f"--rounds must be >= 1 and --budget > 0 (got {rounds} and {budget})")

    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13 renames *_into_tensor / *_tensor
    torch.set_num_threads(1)  # the ranks share the host's cores
    rank, p = ct.init_process_group()
    noop = noop_group(p)
    comm = dist.distributed_c10d._get_default_group().comm  # the backend's library communicator
    if args.steps:
        rows = steps(rank, p, comm, noop, args.rounds or 15)
    elif args.overhead:
        rows = [overhead(rank, p, comm, noop, rounds, budget)] if "all_reduce" in args.collectives else []
        rows += overhead_others(rank, p, comm, [c for c in args.collectives if c != "all_reduce"], rounds, budget)
    else:
        rows = table(rank, p, comm, noop, args, rounds, budget)
    if rank == 0 and args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    dist.destroy_process_group()


def table(rank: int, p: int, comm, noop, args, rounds: int, budget: float) -> list:
    gloo = dist.new_group(list(range(p)), backend="gloo")
    rows = []
    for name in args.collectives:
        for nbytes in sizes(parse_size(args.min_size), parse_size(args.max_size)):
            fns = {"collectives": make_call(name, nbytes, None, p), "gloo": make_call(name, nbytes, gloo, p),
                   "library": make_library_call(name, nbytes, comm, p)}
            if name == "all_reduce":
                fns["torch_noop"] = make_call(name, nbytes, noop, p)
            times, starved = timed_rounds(fns, rounds, budget, comm.mpi_comm)
            med = {k: statistics.median(v) for k, v in times.items()}
            row = {"collective": name, "bytes": nbytes, "ranks": p,
                   **{f"{k}_us": round(v * 1e6, 2) for k, v in med.items()},
                   "gloo_over_collectives": round(med["gloo"] / med["collectives"], 2),
                   "collectives_over_library": [round(x, 2) for x in ratio_spread(times, "collectives", "library")],
                   "starved_rounds": starved}
            rows.append(row)
            if rank == 0:
                print(f"{name} {human(nbytes)}: {row}", file=sys.stderr, flush=True)
    if rank == 0:
        print(f"# torch {torch.__version__}, {p} ranks, median of {rounds} interleaved rounds per backend; "
              "coll/library: the rounds' median ratio (lowest-highest)")
        print(f"{'collective':24s} {'size':>9s} {'collectives us':>15s} {'gloo us':>12s} {'gloo/coll':>10s} "
              f"{'library us':>11s} {'coll/library':>20s} {'torch no-op us':>15s}")
        for r in rows:
            m, lo, hi = r["collectives_over_library"]
            lib = f"{r['library_us']:11.2f} {f'{m:.2f} ({lo:.2f}-{hi:.2f})':>20s}" + \
                (f" {r['torch_noop_us']:15.2f}" if "torch_noop_us" in r else "")
            print(f"{r['collective']:24s} {human(r['bytes']):>9s} {r['collectives_us']:15.2f} "
                  f"{r['gloo_us']:12.2f} {r['gloo_over_collectives']:10.2f} {lib}")
        print(starved_note(sum(r["starved_rounds"] for r in rows), rounds * len(rows), p))
    return rows


if __name__ == "__main__":
    main()
