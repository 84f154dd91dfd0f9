"""Calls on the plan runner that repeat on the same buffers restart the C runner on the pointers it holds
(Plan.run's quick path; the communicator finds the plan of a call repeating its last one on the
same arrays by identity: Communicator._again_*); the input is read where it lies and the output written in place (Plan.io); windows are
double-buffered (csrc/plan.h); large messages are read from the sender's memory (single copy). Each must give MPI's results and fall back or raise where the state changed: the
windows regrown by a larger call (also under an asynchronous call in flight), a read-only buffer, a mismatched
call, an in-place alltoall."""

from __future__ import annotations

import launcher

PROGRAM = """
import numpy as np
import collectives
comm = collectives.init()
p, r = comm.size, comm.rank
x = np.zeros(3, np.float32)
for i in range(6):  # the root's next call writes the other window half while the others read this one
    if r == 1:
        x[:] = [i, i + 1, i + 2]
    comm.broadcast(x, root=1)
    assert np.array_equal(x, [i, i + 1, i + 2]), (i, x)
assert comm._last._quick is not None  # the repeated calls took the rerun path
# a larger call regrows the windows: the next rerun sees another generation and rebinds
big = comm.allreduce(np.ones(1 << 20, np.float32))
assert (big == p).all()
x[:] = 7 if r == 1 else 0
comm.broadcast(x, root=1)
assert (x == 7).all(), x
# a read-only buffer is refused before any communication, on every rank
x.flags.writeable = False
try:
    comm.broadcast(x, root=1)
    raise SystemExit(f"rank {r}: a read-only buffer was written")
except ValueError:
    pass
x.flags.writeable = True
# a mismatch on a call that would rerun: every rank raises, then the communicator goes on
try:
    if r == 0:
        comm.allreduce(np.ones(3, np.float32))
    else:
        comm.broadcast(x, root=1)
    print(f"rank {r}: no mismatch error", flush=True)
except collectives.CallMismatchError:
    pass
comm.broadcast(x, root=1)
# reduce_scatter and alltoall write the caller's output directly; an in-place alltoall copies at the end
blocks = np.arange(4 * p, dtype=np.int64) + 1000 * r
out = np.empty(4, np.int64)
for i in range(3):
    comm.reduce_scatter(blocks + i, out=out)
    want = sum(np.arange(4 * p, dtype=np.int64) + 1000 * q + i for q in range(p))[4 * r:4 * r + 4]
    assert np.array_equal(out, want), (i, out, want)
a = np.arange(2 * p, dtype=np.int32) + 100 * r
got = np.empty_like(a)
comm.alltoall(a, out=got)
want = np.concatenate([np.arange(2 * p, dtype=np.int32)[2 * r:2 * r + 2] + 100 * q for q in range(p)])
assert np.array_equal(got, want), (got, want)
comm.alltoall(a, out=a)
assert np.array_equal(a, want), (a, want)
g = comm.allgather(np.full(2, r, np.int16))
assert np.array_equal(g, np.repeat(np.arange(p, dtype=np.int16), 2)), g
# single-copy messages (16 KiB blocks: read from the sender's memory, shm/plan.py): in place on rank 0 only, twice
# on the same buffers (the rerun), then a broadcast, then a mismatch between two calls that read peers' memory
assert comm._ctx.arena.single_copy_min == 16384, comm._ctx.arena.single_copy_min
k = 4096
a = np.arange(k * p, dtype=np.float32) + 1e5 * r
want = np.concatenate([np.arange(k * p, dtype=np.float32)[k * r:k * (r + 1)] + 1e5 * q for q in range(p)])
for i in range(2):
    got = a.copy() if r == 0 else np.empty_like(a)
    comm.alltoall(got if r == 0 else a, out=got, algorithm="pairwise")
    assert np.array_equal(got, want), (i, got[:4], want[:4])
assert np.array_equal(a, np.arange(k * p, dtype=np.float32) + 1e5 * r)  # the input is left as it was
b = np.full(3 * k, 1.0 + (r == 2), np.float64)
for i in range(2):
    comm.broadcast(b, root=2, algorithm="one_shot")
    assert (b == 2.0).all(), b[:4]
try:
    if r == 0:
        comm.alltoall(a, algorithm="pairwise")
    else:
        comm.broadcast(b, root=2, algorithm="one_shot")
    print(f"rank {r}: no single-copy mismatch error", flush=True)
except collectives.CallMismatchError:
    pass
comm.broadcast(b, root=2, algorithm="one_shot")
# persistent calls restart the runner on their own pointers: two of one signature on different arrays, and the
# method's call on a third, interleaved, each keep their own result (the runner is rebound whenever they alternate)
u, v, w3 = (np.full(5, r + 1.0, np.float32) for _ in range(3))
pu, pv = comm.persistent("allreduce", u, out=u, algorithm="ring"), comm.persistent("allreduce", v, out=v,
                                                                                   algorithm="ring")
total = p * (p + 1) / 2
for i in range(3):
    u[:] = r + 1.0
    pu.run()
    pu.run()  # a rerun on the pointers it holds: u was total, now p * total
    v[:] = r + 2.0
    pv.run()
    w3[:] = r + 3.0
    comm.allreduce(w3, out=w3, algorithm="ring")
    assert (u == p * total).all() and (v == total + p).all() and (w3 == total + 2 * p).all(), (i, u, v, w3)
# the same arrays with other arguments, or reinterpreted in place, are other calls (the identity records of the
# last call per collective must not serve them): op, root, an array's dtype or (with a new output) its shape
s = np.full(4, r + 1, np.int32)
o = np.empty_like(s)
for op, want in (("sum", total), ("sum", total), ("max", p), ("max", p), ("min", 1)):
    assert np.array_equal(comm.allreduce(s, out=o, op=op), np.full(4, want)), (op, o)
for root in (0, 0, 2, 2):
    s[:] = 10 * r
    comm.broadcast(s, root=root)
    assert (s == 10 * root).all(), (root, s)
f = np.full(4, 2.0 + r, np.float32)
f32 = comm.allreduce(f, out=f)
f32 = comm.allreduce(f, out=f)
f.dtype = np.int32  # the same bytes as int32: the sum must be of the integers
f[:] = (r + 1) << 24  # normal floats as float32 bits: their float sum is not the integers' sum
assert np.array_equal(comm.allreduce(f, out=f), np.full(4, int(total) << 24)), f
m = np.full(6, r, np.int64)
for shape in ((6,), (6,), (2, 3), (2, 3), (3, 2)):
    m.shape = shape
    got = comm.allreduce(m)
    assert got.shape == shape and (got == p * (p - 1) // 2).all(), (shape, got)
assert comm.allreduce(m, timeout=5.0).shape == (3, 2)
# a call in flight while a new signature grows the windows: it finishes first (it runs on the windows replaced);
# the last rank comes late, so the others' asynchronous call is still waiting for it when they build the plan
import time
if r == p - 1:
    time.sleep(0.3)
w = comm.allreduce(np.full(8, r + 1, np.float32), async_op=True)
grown = comm.allreduce(np.ones(3 << 20, np.float32))
assert (grown == p).all() and (w.wait() == p * (p + 1) // 2).all(), w.wait()
print(f"rank {r}: ok", flush=True)
"""


def test_repeated_calls_on_the_plan_runner(tmp_path):
    proc = launcher.run_source(3, PROGRAM, directory=tmp_path, env={"COLLECTIVES_TIMEOUT": "20"})
    for r in range(3):
        assert f"rank {r}: ok" in proc.stdout, proc.stdout
    assert "no mismatch error" not in proc.stdout and "no single-copy mismatch" not in proc.stdout, proc.stdout
