"""Point-to-point and the rooted data movements (gather, scatter) of a communicator, under mpiexec (MPI) or, with
`--runtime store`, under torchrun (torch's store and gloo). Rank 0 prints `RESULT {json}`.

Checks: gather and scatter at every root; a ring of isend/recv; receives from any source (and, under MPI, any
tag); many messages of one sender and tag arriving in the order sent; messages to oneself; zero-length messages;
a receive buffer larger than the message; a message larger than the buffer raising ValueError on the receiver
with the next message from that sender still arriving intact; bad peers and tags raising before communicating
(and, on the store runtime, a receive from any tag).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from collectives.transport import init

ap = argparse.ArgumentParser()
ap.add_argument("--runtime", choices=("mpi", "store"), default="mpi")
args = ap.parse_args()
store = None
if args.runtime == "store":
    import torch.distributed as dist

    from collectives.torch.runtime import StoreRuntime

    size, me = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size, me == 0)
    comm = init(StoreRuntime(store, me, size, timeout=60), timeout=60)
else:
    comm = init(timeout=60)
r, p = comm.rank, comm.size
failures: list[str] = []
cases = 0


def check(ok: bool, label: str) -> None:
    global cases
    cases += 1
    if not ok:
        failures.append(f"rank {r}: {label}")


# gather and scatter, every root, two dtypes (bfloat16-sized and 8-byte elements travel as bytes)
for root in range(p):
    for dtype in (np.int16, np.float64):
        g = comm.gather(np.full(3, r, dtype), root=root)
        check((g is None) == (r != root), f"gather root {root}: result off the root")
        if r == root:
            check(np.array_equal(g, np.repeat(np.arange(p), 3).astype(dtype)), f"gather root {root} {dtype}: {g}")
        out = np.empty(2, dtype)
        src = np.arange(2 * p).astype(dtype) if r == root else None
        s = comm.scatter(src, out, root=root)
        check(s is out and np.array_equal(out, [2 * r, 2 * r + 1]), f"scatter root {root} {dtype}: {out}")

# a ring
x, y = np.full(4, r, np.float32), np.empty(4, np.float32)
h = comm.isend(x, (r + 1) % p, tag=5)
src = comm.recv(y, (r - 1) % p, tag=5)
h.wait()
check(src == (r - 1) % p and bool((y == src).all()), f"ring: from {src}: {y}")

# any source (one tag per sender under MPI's any tag; gloo needs the tag)
if r == 0:
    got = set()
    for _ in range(p - 1):
        b = np.empty(1, np.int64)
        handle = comm.irecv(b, None, None if args.runtime == "mpi" else 7)
        handle.wait()
        got.add((handle.source, int(b[0])))
    check(got == {(q, q * 10) for q in range(1, p)}, f"any source: {got}")
else:
    comm.send(np.array([r * 10]), 0, tag=r if args.runtime == "mpi" else 7)
comm.barrier()  # a receive of any tag must not meet the messages below

# many messages of one sender and tag, posted before any is received: they arrive in the order sent
if r == 1:
    handles = [comm.isend(np.full(16, k, np.int32), 0, tag=9) for k in range(20)]
    for h in handles:
        h.wait()
elif r == 0:
    bufs = [np.empty(16, np.int32) for _ in range(20)]
    handles = [comm.irecv(b, 1 if k % 2 else None, 9) for k, b in enumerate(bufs)]
    for h in handles:
        h.wait()
    check([int(b[0]) for b in bufs] == list(range(20)), f"order: {[int(b[0]) for b in bufs]}")

# messages to oneself, zero-length messages, a buffer larger than the message
h = comm.isend(np.arange(5, dtype=np.int8), r, tag=11)
mine = np.zeros(8, np.int8)
check(comm.recv(mine, r, tag=11) == r and mine[:5].tolist() == list(range(5)), f"to oneself: {mine}")
h.wait()
h = comm.isend(np.empty(0, np.float32), (r + 1) % p, tag=12)
comm.recv(np.empty(0, np.float32), (r - 1) % p, tag=12)
h.wait()
check(True, "zero-length")

# a message larger than the buffer: ValueError on the receiver; the sender's next message still arrives
if r == 1:
    comm.send(np.arange(10, dtype=np.int16), 0, tag=13)
    comm.send(np.arange(3, dtype=np.int16) + 100, 0, tag=13)
elif r == 0:
    try:
        comm.recv(np.empty(4, np.int16), 1, tag=13)
        check(False, "truncation: no error")
    except ValueError as exc:
        check("larger than the buffer" in str(exc), f"truncation message: {exc}")
    nxt = np.empty(3, np.int16)
    comm.recv(nxt, 1, tag=13)
    check(nxt.tolist() == [100, 101, 102], f"after truncation: {nxt}")

# bad calls raise before communicating
for label, fn in [("peer out of range", lambda: comm.send(np.ones(2), p, tag=0)),
                  ("negative tag", lambda: comm.send(np.ones(2), 0, tag=-1)),
                  ("tag too large", lambda: comm.recv(np.ones(2), 0, tag=1 << 20))]:
    try:
        fn()
        check(False, f"{label}: no error")
    except ValueError:
        check(True, label)
if args.runtime == "store":  # gloo matches receives by tag: one from any tag is refused, saying so
    try:
        comm.irecv(np.empty(2), None, None)
        check(False, "any tag on the store runtime: no error")
    except ValueError as exc:
        check("tag" in str(exc) and "MPI" in str(exc), f"any tag on the store runtime: {exc}")

y = comm.allreduce(np.ones(3))
check(bool((y == p).all()), f"allreduce after point-to-point: {y}")
result = {"cases": cases, "failures": len(failures), "messages": failures[:20]}
if store is not None:
    store.set(f"p2p/{r}", json.dumps(result))
    everyone = [json.loads(store.get(f"p2p/{q}")) for q in range(p)] if r == 0 else None
else:
    everyone = comm.mpi_comm.gather(result, root=0)
if r == 0:
    print("RESULT " + json.dumps({"cases": min(e["cases"] for e in everyone),
                                  "failures": sum(e["failures"] for e in everyone),
                                  "messages": [m for e in everyone for m in e["messages"]][:20]}), flush=True)
comm.close()
