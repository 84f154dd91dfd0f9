"""Train a small MLP with DistributedDataParallel over backend "collectives" (or torch's "gloo").

    mpiexec -n 4 python examples/ddp_train.py --backend collectives --out /tmp/ddp
    mpiexec -n 4 python examples/ddp_train.py --backend gloo --out /tmp/ddp_gloo
    mpiexec -n 4 python examples/ddp_train.py --backend collectives --hook fp16 --out /tmp/ddp_fp16
    torchrun --standalone --nproc_per_node 4 examples/ddp_train.py --backend collectives --out /tmp/ddp_torchrun

`--hook fp16` registers DDP's fp16 compression communication hook (torch's default_hooks.fp16_compress_hook: the
bucket is cast to float16, all-reduced asynchronously, and a `then` callback on the Work's future divides and
casts back), so the reducer waits on futures the backend completes.

Everything is seeded: the model (rank 0's initial weights are broadcast by DDP anyway), and each rank's synthetic
regression data (seed + rank). Rank 0 prints its loss every --log-every steps, then `RESULT {json}` with the
mean final loss; with --out each rank saves its final weights to OUT/weights_rank{r}.pt.
tests/torch/test_torch.py (mpiexec) and tests/torch/test_torchrun_spawn.py (torchrun) compare the two backends
and the ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import collectives.torch  # registers backend "collectives"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["collectives", "gloo"], default="collectives")
    ap.add_argument("--out", default=None, help="save each rank's final weights here, as weights_rank{r}.pt "
                                                 "(default: not saved)")
    ap.add_argument("--log-every", type=int, default=10, help="rank 0 prints its loss every N steps (0: never)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bucket-cap-mb", type=float, default=0.004,
                    help="DDP gradient bucket size (small: several buckets, several allreduces per step)")
    ap.add_argument("--hook", choices=["none", "fp16"], default="none", help="DDP communication hook")
    args = ap.parse_args()

    torch.set_num_threads(1)  # several ranks share the host's cores
    rank, size = collectives.torch.init_process_group(args.backend)

    torch.manual_seed(args.seed)
    d_in, d_out = 16, 4
    model = nn.Sequential(nn.Linear(d_in, args.hidden), nn.Tanh(), nn.Linear(args.hidden, d_out))
    teacher = torch.randn(d_in, d_out)
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    if args.hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    gen = torch.Generator().manual_seed(args.seed * 1000 + rank + 1)  # each rank its own data shard
    start = time.perf_counter()
    if rank == 0:
        print(f"training on {size} ranks, backend {args.backend}: {args.steps} steps", flush=True)
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, d_in, generator=gen)
        y = torch.tanh(x @ teacher) + 0.01 * torch.randn(args.batch, d_out, generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # DDP all-reduces (averages) the gradients bucket by bucket
        opt.step()
        if rank == 0 and args.log_every and (step % args.log_every == 0 or step == args.steps):
            print(f"step {step}/{args.steps}: rank 0 loss {loss.item():.5f} ({time.perf_counter() - start:.1f} s)",
                  flush=True)
    elapsed = time.perf_counter() - start

    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss, op=dist.ReduceOp.SUM)
    mean_loss /= size
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        weights = {name: p.detach().clone() for name, p in model.state_dict().items()}
        torch.save(weights, os.path.join(args.out, f"weights_rank{rank}.pt"))
    dist.barrier()
    if rank == 0:
        print("RESULT " + json.dumps({"backend": args.backend, "world_size": size, "steps": args.steps,
                                      "final_loss": mean_loss.item(), "hook": args.hook,
                                      "train_seconds": round(elapsed, 3)}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
