"""What an MPI subcommand does when a rank fails on its own: say so, then end the whole job.

`collectives bench` and `collectives calibrate` run collective measurements: every rank waits for every other in
each step. An error the ranks agree on (a bad flag, found before any communication) makes every rank exit 2
together (the subcommands check those first). An error raised on some ranks only, in the middle of a
measurement (a failed allocation, a kernel error, a peer's timeout), would leave the others waiting in a
collective that never completes, until mpiexec's or the transport's timeout (60 s by default). So such an error
is printed with the rank that raised it, and the rank calls MPI_Abort, which ends every rank of the job at once
with a non-zero status (mpiexec reports the abort).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def abort_job_on_error(mpi_comm, command: str) -> Iterator[None]:
    """Run the block; an exception escaping it is printed as `collectives COMMAND: rank R: error: ...` (with its
    traceback) and aborts the job (MPI_Abort on `mpi_comm`, error code 1). KeyboardInterrupt passes through."""
    try:
        yield
    except Exception as exc:
        rank = mpi_comm.Get_rank()
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        sys.stderr.write(f"{detail}collectives {command}: rank {rank}: error: {type(exc).__name__}: {exc}\n"
                         f"collectives {command}: rank {rank}: aborting the job (the other ranks would wait for "
                         "this one)\n")
        sys.stderr.flush()
        mpi_comm.Abort(1)
        raise  # not reached: MPI_Abort does not return
