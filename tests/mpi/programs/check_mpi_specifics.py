"""Run under mpiexec -n N (N >= 2): what the transport assumes of the MPI library, checked on the one it runs on.

* TAG_UB: read from MPI_COMM_WORLD (Open MPI sets it there but not on communicators from Split or Split_type,
  the library's own included); the message executor's tags stay within it;
* point-to-point on the library's own communicator: a tag of 32767 (the least TAG_UB the standard allows),
  any-source/any-tag receives reporting who sent what, and a message larger than the buffer raising ValueError
  (MPI's error class ERR_TRUNCATE, returned because the library's communicators return errors);
* one host: Split_type(COMM_TYPE_SHARED) puts every rank on it, in one domain; the arena's shared windows
  (Win.Allocate_shared with alloc_shared_noncontig, Shared_query) serve the schedules, or with COLLECTIVES_SHM=0
  point-to-point messages do (the tags above);
* MPI's own float16 sum, which auto may pick.

Rank 0 prints `RESULT {json}` with the failures and what the library reported of itself.
"""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

from collectives import environment
from collectives.transport import init
from collectives.transport.messages import tag_base
from collectives.transport.mpi_library import describe

comm = init(timeout=30)
rank, p = comm.rank, comm.size
failures: list[str] = []


def check(ok: bool, what: str) -> None:
    if not ok:
        failures.append(f"rank {rank}: {what}")


# -- TAG_UB ------------------------------------------------------------------------------------------------------
ub = comm.runtime.tag_upper_bound
world_ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
check(ub >= 32767 and ub == world_ub, f"the runtime's tag_upper_bound {ub}, MPI_COMM_WORLD's TAG_UB {world_ub}")
duplicate = comm.runtime.duplicate()  # a Dup of the library's communicator
check(duplicate.tag_upper_bound == ub, f"a duplicate runtime's tag upper bound {duplicate.tag_upper_bound}")
duplicate.free()
# Open MPI sets TAG_UB on MPI_COMM_WORLD (and its Dups) only: not on communicators from Split or Split_type, so
# not on the library's (a Dup of init's Split of the world); hence the library reads MPI_COMM_WORLD's
local = comm.mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
split_ub = local.Get_attr(MPI.TAG_UB)
local.Free()
library_ub = comm.mpi_comm.Get_attr(MPI.TAG_UB)
for slots in (2, 3, 9):
    for seq in (1, 2, 10**6, 10**9 + 7):
        last = tag_base(seq, slots, ub) + slots * slots - 1
        check(0 <= last <= ub, f"tag {last} of call {seq} with {slots} slots outside [0, {ub}]")

# -- point to point: tags, any source, truncation ----------------------------------------------------------------
if rank == 0:
    for peer in range(1, p):
        comm.send(np.full(8, peer, np.int64), peer, tag=32767)
        comm.send(np.arange(8, dtype=np.int64), peer, tag=7)
else:
    got = np.zeros(8, np.int64)
    handle = comm.irecv(got)  # any source, any tag
    handle.wait()
    check(handle.source == 0 and handle.tag == 32767 and (got == rank).all(),
          f"any-source receive: source {handle.source}, tag {handle.tag}, data {got.tolist()}")
    try:
        comm.recv(np.zeros(3, np.int64), 0, tag=7)
        check(False, "a message of 8 int64 into a buffer of 3 did not raise")
    except ValueError as exc:
        check("larger than the buffer" in str(exc), f"truncation raised {exc}")
for bad in (-1, 32768):
    try:
        comm.isend(np.zeros(1), (rank + 1) % p, tag=bad)
        check(False, f"tag {bad} accepted")
    except ValueError:
        pass
comm.barrier()

# -- one host: shared windows or messages ------------------------------------------------------------------------
shm = environment.get("COLLECTIVES_SHM")
check(comm.shared_memory == shm, f"shared-memory arena {comm.shared_memory} with COLLECTIVES_SHM={shm}")
check(comm.domains == [list(range(p))], f"domains {comm.domains}: COMM_TYPE_SHARED should group all {p} ranks")
check(comm.host.one_host and comm.host.ranks_per_host == p, f"host {comm.host}")
x = np.arange(1000, dtype=np.float32) + rank
want = np.arange(1000, dtype=np.float32) * p + p * (p - 1) / 2
for algorithm in ("ring", "one_shot", "native"):
    y = comm.allreduce(x, algorithm=algorithm)
    check(np.array_equal(y, want), f"allreduce {algorithm} ({'shared memory' if shm else 'messages'})")

# -- MPI's own float16 sum -----------------------------------------------------------------------------------------
h = np.ones(64, np.float16)
check(np.array_equal(comm.allreduce(h, algorithm="native"), np.full(64, p, np.float16)), "native float16 sum")

gathered = comm.mpi_comm.gather(failures)
if rank == 0:
    flat = [f for fs in gathered for f in fs]
    print("RESULT " + json.dumps({"failures": len(flat), "messages": flat, "library": describe(MPI),
                                  "tag_ub": ub, "split_type_tag_ub": split_ub,
                                  "library_comm_tag_ub": library_ub, "world_size": p,
                                  "shared_memory": comm.shared_memory}), flush=True)
comm.close()
