"""One MPI rank of PyTorch's own distributed test suite (`DistributedTest._DistTestBase`, shipped in the torch wheel).

Run by tests/torch/torch_suite.py under `mpiexec -n W`: each MPI rank plays the process that torch's
`MultiProcessTestCase` would have spawned for that rank. For every test named on the command line, all ranks get
a fresh FileStore file and temp dir (made by rank 0, names sent over MPI), then call the suite class's
`_run(rank, test_name, file_name, pipe)`, which initialises the process group with `--backend`, runs the test and
exits (SystemExit) with torch's codes: 0 passed, TEST_SKIPS codes skipped, 10 failed (the traceback comes through
the pipe). A test skipped by a decorator (`__unittest_skip__`, which torch's parent process reads before spawning)
is reported as skipped without running, as torch's runner would; with --run-name-gated a test whose decorator skip
names gloo or MPI ("Only MPI supports all_to_all", "Test requires backend collectives to be one of {'gloo'}") runs
anyway, and its result says so ("gated": the reason).

Rank 0 appends one JSON line per event to `--results`: {"start": name} before a test, then {"test": name,
"outcome": "passed" | "skipped" | "failed", "codes": [per rank], "message": ...}. A test that hangs is ended by the
per-test watchdog (faulthandler dumps the stacks and exits the process, which ends the launch); the driver then
finds a start line without its result.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import re
import shutil
import sys
import tempfile
import time
import warnings

from mpi4py import MPI

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--backend", required=True, help="collectives or gloo")
ap.add_argument("--results", required=True, help="JSON-lines file rank 0 appends to")
ap.add_argument("--test-timeout", type=float, default=120.0, help="seconds one test may take on a rank")
ap.add_argument("--run-name-gated", action="store_true",
                help="run tests that a decorator skips only because of the backend's name (reported as gated)")
ap.add_argument("tests", nargs="+", help="test names of DistributedTest._DistTestBase")
args = ap.parse_args()

world = MPI.COMM_WORLD.Dup()  # the harness's own messages (the backend's communicators are separate)
rank, size = world.Get_rank(), world.Get_size()

# torch's suite reads these at import time: the backend, the world size, and the init method (file://, which
# some tests require)
root = world.bcast(tempfile.mkdtemp(prefix="torch_suite_") if rank == 0 else None, root=0)
os.environ.update(BACKEND=args.backend, WORLD_SIZE=str(size), TEMP_DIR=root,
                  INIT_METHOD=f"file://{os.path.join(root, 'shared_init_file')}")
os.environ.setdefault("MASTER_ADDR", "localhost")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.multiprocessing  # noqa: E402

if args.backend == "collectives":
    import collectives.torch  # noqa: F401  (registers backend "collectives")
torch.set_num_threads(1)  # several ranks share the host's cores
from torch.testing._internal import common_distributed  # noqa: E402

# The suite gates tests on these feature sets at import time: the plugin must be registered as a plugin, and it
# implements DDP and sub-groups (CPU). skip_collective (what a backend lacks) is left alone.
if args.backend not in ("gloo", "nccl", "ucc", "mpi"):
    for feature in ("plugin", "ddp", "subgroup"):
        common_distributed.DistTestCases.backend_feature[feature].add(args.backend)

from torch.testing._internal.distributed import distributed_test  # noqa: E402


class TestDistBackendMPI(distributed_test.TestDistBackend, distributed_test.DistributedTest._DistTestBase):
    """torch's TestDistBackend driven by MPI ranks instead of spawned processes."""


# a decorator skip that names gloo or MPI gates a CPU test on the backend's name; those naming only NCCL (or CUDA)
# are GPU tests
NAME_GATE = re.compile(r"\b(gloo|mpi)\b", re.IGNORECASE)
SKIP_CODES = {skip.exit_code: skip.message for skip in common_distributed.TEST_SKIPS.values()}
ERROR_CODE = common_distributed.MultiProcessTestCase.TEST_ERROR_EXIT_CODE


def decorator_skip(name: str) -> str | None:
    method = getattr(TestDistBackendMPI, name, None)
    if method is None:
        return None
    if getattr(method, "__unittest_skip__", False):
        return str(getattr(method, "__unittest_skip_why__", "skipped by a decorator"))
    return None


def run_one(name: str, file_name: str) -> tuple[int, str]:
    """(exit code, message) of this rank's part of test `name`."""
    parent, child = torch.multiprocessing.Pipe()
    code, message = 0, ""
    try:
        TestDistBackendMPI._run(rank, name, file_name, child)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # noqa: BLE001 - a failure before torch's run_test (init_process_group...)
        import traceback

        code, message = ERROR_CODE, "".join(traceback.format_exception(exc))[-4000:]
    if code == ERROR_CODE and not message and parent.poll(1):
        try:
            message = str(parent.recv())[-4000:]
        except (EOFError, OSError):
            pass
    parent.close()
    import torch.distributed as dist

    if dist.is_initialized():  # a failed test leaves its group: the next test makes its own
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
    return code, message


def bounded_gather(value, limit: float):
    """Gather every rank's value on rank 0 within `limit` seconds (a peer stuck in a test ends the launch)."""
    req = world.Ibarrier()
    deadline = time.monotonic() + limit
    while not req.Test():
        if time.monotonic() > deadline:
            sys.stderr.write(f"rank {rank}: the other ranks did not finish the test within {limit} s\n")
            sys.stderr.flush()
            os._exit(3)
        time.sleep(0.002)
    return world.gather(value, root=0)


def record(line: dict) -> None:
    with open(args.results, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


for name in args.tests:
    skip = decorator_skip(name)
    gated = None
    if skip is not None and args.run_name_gated and NAME_GATE.search(skip):
        skip, gated = None, decorator_skip(name)
    if skip is not None or not hasattr(TestDistBackendMPI, name):
        if rank == 0:
            why = skip if skip is not None else f"no test {name} in this torch version"
            record({"test": name, "outcome": "skipped", "codes": [], "message": why})
        continue
    if rank == 0:
        record({"start": name})
        common_distributed.initialize_temp_directories()  # TEMP_DIR, INIT_METHOD and barrier/ for this test
        fd, file_name = tempfile.mkstemp(prefix="store_", dir=os.environ["TEMP_DIR"])
        os.close(fd)
        shared = (os.environ["TEMP_DIR"], os.environ["INIT_METHOD"], file_name)
    else:
        shared = None
    temp_dir, init_method, file_name = world.bcast(shared, root=0)
    os.environ["TEMP_DIR"], os.environ["INIT_METHOD"] = temp_dir, init_method
    distributed_test.Barrier.barrier_id = 0
    faulthandler.dump_traceback_later(args.test_timeout, exit=True)
    start = time.monotonic()
    code, message = run_one(name, file_name)
    faulthandler.cancel_dump_traceback_later()
    results = bounded_gather((code, message), args.test_timeout)
    if rank == 0:
        codes = [c for c, _ in results]
        errors = [f"rank {r}: {m or f'exit code {c}'}" for r, (c, m) in enumerate(results)
                  if c not in SKIP_CODES and c != 0]
        if errors:
            outcome, message = "failed", "\n".join(errors)[-6000:]
        elif codes[0] in SKIP_CODES:
            outcome, message = "skipped", SKIP_CODES[codes[0]]
        else:
            outcome, message = "passed", ""
        record({"test": name, "outcome": outcome, "codes": codes, "message": message, "gated": gated,
                "seconds": round(time.monotonic() - start, 2)})
        common_distributed.cleanup_temp_dir()
    world.Barrier()

if rank == 0:
    shutil.rmtree(root, ignore_errors=True)
