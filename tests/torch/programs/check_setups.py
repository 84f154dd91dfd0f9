"""Bad setups of backend "collectives" without an MPI launcher, in one process (no mpiexec, no torchrun): each must
raise a clear error when the group is created, naming what was wrong and what would be right. Prints
`RESULT {json}`: {"checks": [[label, error type, message]], "failures": [...]}.

* Options(runtime="mpi") in a job no MPI launcher started (torch's world of 2, MPI's of 1);
* Options(runtime=<unknown>);
* a sub-group asking for another runtime than its default group's;
* pg_options that are not collectives.torch.Options.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from datetime import timedelta

import torch.distributed as dist

import collectives.torch as ct

warnings.filterwarnings("ignore")
for name in [v for v in os.environ if v.startswith(("PMI_", "OMPI_", "MV2_"))]:
    del os.environ[name]  # no MPI launcher's environment, whatever started this program
os.environ["COLLECTIVES_ONE_RANK"] = "1"  # MPI initialised as one rank by the first check: intended here

checks: list[list[str]] = []
failures: list[str] = []


def expect(label: str, error: type, pattern: str, fn) -> None:
    try:
        fn()
    except error as exc:
        checks.append([label, type(exc).__name__, str(exc)])
        if not re.search(pattern, str(exc)):
            failures.append(f"{label}: {type(exc).__name__} does not say /{pattern}/: {exc}")
    except Exception as exc:  # noqa: BLE001
        failures.append(f"{label}: raised {type(exc).__name__} (want {error.__name__}): {exc}")
    else:
        failures.append(f"{label}: no error")
    if dist.is_initialized():
        dist.destroy_process_group()


def init(world_size: int, options) -> None:
    dist.init_process_group("collectives", store=dist.HashStore(), rank=0, world_size=world_size,
                            pg_options=options, timeout=timedelta(seconds=20))


expect("Options(runtime='mpi') without mpiexec", ValueError, r"no MPI launcher.*mpiexec -n 2.*'store'",
       lambda: init(2, ct.Options(runtime="mpi")))
expect("Options(runtime='gloo')", ValueError, r"runtime='gloo'.*'mpi', 'store' or None",
       lambda: init(2, ct.Options(runtime="gloo")))


def sub_group_with_another_runtime() -> None:
    init(1, None)  # one process, no launcher: the store runtime
    dist.new_group([0], pg_options=ct.Options(runtime="mpi"))


expect("new_group(pg_options=Options(runtime='mpi')) on a store default group", ValueError,
       r"default group runs on 'store'.*leave runtime unset", sub_group_with_another_runtime)
expect("pg_options of another type", TypeError, r"collectives\.torch\.Options", lambda: init(1, {"runtime": "mpi"}))
print("RESULT " + json.dumps({"checks": checks, "failures": failures}), flush=True)
