"""Run under mpiexec -n 2: rank 1 never joins rank 0's all_reduce; rank 0's Work.wait() must raise the library's
CollectiveTimeoutError (after the group's 3 s timeout). Rank 0 prints `RESULT {json}`; the job then exits non-zero
(a failed communicator skips MPI_Finalize, see collectives.transport.communicator)."""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist

import collectives.torch as ct

rank, size = ct.init_process_group(timeout=3)
if rank == 0:
    start = time.monotonic()
    work = dist.all_reduce(torch.ones(1000), async_op=True)
    try:
        work.wait()
        outcome = {"raised": None}
    except Exception as exc:  # noqa: BLE001
        outcome = {"raised": type(exc).__name__, "message": str(exc)[:300], "success": work.is_success()}
    outcome["seconds"] = round(time.monotonic() - start, 2)
    print("RESULT " + json.dumps(outcome), flush=True)
    sys.exit(0)
else:
    time.sleep(30)  # never calls all_reduce; mpiexec ends the job when rank 0 exits
