"""Train a small MLP with FSDP2 (`torch.distributed.fsdp.fully_shard`) on a CPU device mesh over backend
"collectives" (or torch's "gloo").

    mpiexec -n 4 python examples/fsdp2_train.py --backend collectives --out /tmp/fsdp
    mpiexec -n 4 python examples/fsdp2_train.py --backend gloo --out /tmp/fsdp_gloo

Every layer is sharded over the ranks (each holds 1/p of every parameter): forward and backward all-gather the
parameters (all_gather_into_tensor), backward reduce-scatters the gradients (reduce_scatter_tensor, averaged).
Everything is seeded: the model (the same on every rank before sharding) and each rank's synthetic regression
data (seed + rank). Rank 0 saves the per-step losses and the full (unsharded) final parameters to
OUT/fsdp2_result.pt and prints `RESULT {json}`. tests/torch/test_torch.py compares the two backends.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import collectives.torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["collectives", "gloo"], default="collectives")
    ap.add_argument("--out", required=True, help="directory for fsdp2_result.pt")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.set_num_threads(1)  # several ranks share the host's cores
    rank, size = collectives.torch.init_process_group(args.backend)
    mesh = init_device_mesh("cpu", (size,))

    torch.manual_seed(args.seed)
    d_in, d_out = 16, 4
    model = nn.Sequential(nn.Linear(d_in, args.hidden), nn.Tanh(), nn.Linear(args.hidden, args.hidden), nn.Tanh(),
                          nn.Linear(args.hidden, d_out))
    teacher = torch.randn(d_in, d_out)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    gen = torch.Generator().manual_seed(args.seed * 1000 + rank + 1)  # each rank its own data shard
    losses = []
    start = time.perf_counter()
    for _ in range(args.steps):
        x = torch.randn(args.batch, d_in, generator=gen)
        y = torch.tanh(x @ teacher) + 0.01 * torch.randn(args.batch, d_out, generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # FSDP2 reduce-scatters (averages) the gradients into each rank's shard
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append((mean / size).item())
    elapsed = time.perf_counter() - start

    full = {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}  # all-gathers
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        torch.save({"losses": losses, "parameters": full}, os.path.join(args.out, "fsdp2_result.pt"))
        print("RESULT " + json.dumps({"backend": args.backend, "world_size": size, "steps": args.steps,
                                      "first_loss": losses[0], "final_loss": losses[-1],
                                      "train_seconds": round(elapsed, 3)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
