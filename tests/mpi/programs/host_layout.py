"""Run under mpiexec: print each rank's CPU affinity and what the communicator concluded about its host."""

import json
import os

from collectives.transport import init

comm = init()
mine = sorted(os.sched_getaffinity(0))
affinities = comm.mpi_comm.gather(mine, root=0)
if comm.rank == 0:
    h = comm.host
    print("RESULT " + json.dumps({"affinities": affinities, "oversubscribed": h.oversubscribed, "cores": h.cores,
                                  "ranks_per_host": h.ranks_per_host}), flush=True)
comm.close()
