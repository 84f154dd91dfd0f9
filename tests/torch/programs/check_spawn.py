"""Backend "collectives" in processes started by `torch.multiprocessing.spawn`, rendezvous through a file
(`init_method="file://..."`): no mpiexec, no torchrun. `python check_spawn.py --nprocs N` prints `RESULT {json}`.

Each spawned rank initialises the default group on the file, then checks (exact results, small integers):
all_reduce in float32, bfloat16 and int64, all_gather_into_tensor, reduce_scatter_tensor, broadcast, uneven
all_to_all_single, a send/recv ring with a tag, receives from any source, a sub-group's all_reduce, and a few DDP
steps ending with the same weights on every rank; then that the group ran on torch's store with the host's shared
memory and that mpi4py.MPI was never imported. Each rank writes its failures to a file; the parent reports.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback


def worker(rank: int, size: int, init_method: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    import collectives.torch  # noqa: F401  (registers backend "collectives")

    torch.set_num_threads(1)
    failures: list[str] = []
    cases = 0

    def same(label: str, got: torch.Tensor, want: torch.Tensor) -> None:
        nonlocal cases
        cases += 1
        if got.dtype != want.dtype or not torch.equal(got, want):
            failures.append(f"{label}: got {got.flatten()[:8].tolist()} want {want.flatten()[:8].tolist()}")

    def data(r: int, n: int, dtype) -> torch.Tensor:
        return ((torch.arange(n) * 5 + r * 3) % 7 + 1).to(dtype)

    dist.init_process_group("collectives", init_method=init_method, rank=rank, world_size=size)
    try:
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            for n in (1, 1000, 70001):
                t = data(rank, n, dtype)
                dist.all_reduce(t)
                same(f"all_reduce {dtype} n={n}", t, sum(data(q, n, torch.int64) for q in range(size)).to(dtype))
        out = torch.empty(size * 9, dtype=torch.float32)
        dist.all_gather_into_tensor(out, data(rank, 9, torch.float32))
        same("all_gather_into_tensor", out, torch.cat([data(q, 9, torch.float32) for q in range(size)]))
        full = torch.stack([data(rank + 10 * k, 6, torch.int64) for k in range(size)])
        part = torch.empty(6, dtype=torch.int64)
        dist.reduce_scatter_tensor(part, full)
        same("reduce_scatter_tensor", part, sum(data(q + 10 * rank, 6, torch.int64) for q in range(size)))
        b = data(rank, 33, torch.float64)
        dist.broadcast(b, src=size - 1)
        same("broadcast", b, data(size - 1, 33, torch.float64))
        # uneven all_to_all_single: rank r sends q + r + 1 elements to rank q
        send_splits = [q + rank + 1 for q in range(size)]
        recv_splits = [rank + q + 1 for q in range(size)]
        x = torch.cat([torch.full((send_splits[q],), 100 * rank + q, dtype=torch.int32) for q in range(size)])
        y = torch.empty(sum(recv_splits), dtype=torch.int32)
        dist.all_to_all_single(y, x, recv_splits, send_splits)
        same("all_to_all_single uneven", y,
             torch.cat([torch.full((recv_splits[q],), 100 * q + rank, dtype=torch.int32) for q in range(size)]))
        # a ring with a tag, then receives from any source (gloo underneath: every receive names its tag)
        ring = torch.empty(4)
        request = dist.isend(torch.full((4,), float(rank)), (rank + 1) % size, tag=3)
        dist.recv(ring, (rank - 1) % size, tag=3)
        request.wait()
        same("send/recv ring", ring, torch.full((4,), float((rank - 1) % size)))
        if rank == 0:
            got = set()
            for _ in range(size - 1):
                one = torch.empty(1, dtype=torch.int64)
                source = dist.recv(one, tag=5)
                got.add((source, int(one)))
            cases += 1
            if got != {(q, 7 * q) for q in range(1, size)}:
                failures.append(f"receives from any source: {sorted(got)}")
        else:
            dist.send(torch.tensor([7 * rank]), 0, tag=5)
        evens = [q for q in range(size) if q % 2 == 0]
        group = dist.new_group(evens)
        if rank in evens:
            t = data(rank, 17, torch.float32)
            dist.all_reduce(t, group=group)
            same("sub-group all_reduce", t, sum(data(q, 17, torch.int64) for q in evens).to(torch.float32))
        # DDP: a few steps, every rank ends with the same weights
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(rank + 1)
        for _ in range(5):
            opt.zero_grad()
            ddp(torch.randn(4, 8, generator=gen)).square().mean().backward()
            opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        everyone = [torch.empty_like(flat) for _ in range(size)]
        dist.all_gather(everyone, flat)
        cases += 1
        if not all(torch.equal(w, everyone[0]) for w in everyone):
            failures.append("DDP: the ranks' weights differ after 5 steps")
        comm = dist.group.WORLD.comm
        facts = {"runtime": comm.runtime.name, "shared_memory": bool(comm.shared_memory),
                 "mpi_imported": "mpi4py.MPI" in sys.modules}
        dist.barrier()
    except Exception:  # noqa: BLE001 - reported, not raised: the parent gathers every rank's outcome
        failures.append(traceback.format_exc(limit=4))
        facts = {}
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"cases": cases, "failures": failures, **facts}, f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nprocs", type=int, default=2)
    args = ap.parse_args()
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="check_spawn_") as tmp:
        init_method = f"file://{os.path.join(tmp, 'rendezvous')}"
        mp.spawn(worker, args=(args.nprocs, init_method, tmp), nprocs=args.nprocs, join=True)
        ranks = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(args.nprocs)]
    print("RESULT " + json.dumps({
        "size": args.nprocs, "cases": min(r["cases"] for r in ranks),
        "failures": sum(len(r["failures"]) for r in ranks),
        "messages": [f"rank {q}: {m}" for q, r in enumerate(ranks) for m in r["failures"]][:20],
        "runtime": ranks[0].get("runtime"), "shared_memory": [r.get("shared_memory") for r in ranks],
        "mpi_imported": [q for q, r in enumerate(ranks) if r.get("mpi_imported")]}), flush=True)


if __name__ == "__main__":
    main()
