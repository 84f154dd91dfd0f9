"""PyTorch's own distributed test suite (`DistributedTest._DistTestBase`) through torch's own spawning harness.

Run by tests/torch/torch_suite.py with `--launcher spawn` (no mpiexec): this process is the parent that torch's
test/distributed/test_distributed_spawn.py would be. Its test class is that file's, `TestDistBackend` +
`DistributedTest._DistTestBase` with `setUp` calling `self._spawn_processes()`; every test runs through
unittest, and `MultiProcessTestCase` spawns one process per rank (torch.multiprocessing, start method "spawn"),
each initialising the process group with BACKEND on a FileStore and running the test. Nothing of the suite is
changed; like torch's own run_test.py, the caller sets the environment the suite reads at import time:
BACKEND, WORLD_SIZE, TEMP_DIR, and DISTRIBUTED_TESTS_DEFAULT_TIMEOUT (torch's per-test limit, after which the
parent kills the ranks and fails the test).

Spawned ranks import this file again (as `__mp_main__`), so everything a rank needs happens at import: backend
"collectives" is registered (importing collectives.torch), and entered in the suite's feature sets ("plugin",
"ddp", "subgroup", which the suite reads at import time to gate tests). A rank started this way has no MPI
launcher's environment, so the backend's groups run on the store runtime (torch's store, gloo, /dev/shm).

With --only-gloo-passed, the tests that neither gloo passes at this world size nor --run-name-gated runs are not
spawned (with gloo they skip inside the ranks: GPU-only or world-size conditions), which saves the seconds each
spawn of W fresh processes costs.

With --run-name-gated, a test that a decorator skips only because of the backend's name (the reason names gloo or
MPI) runs anyway, and its result says so ("gated"). The results go to `--results` as JSON lines, in the format of
torch_suite_rank.py: {"start": name} before a test, then {"test", "outcome", "message", "gated", "seconds"}.
"""

from __future__ import annotations

import os
import re
import sys
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402

BACKEND = os.environ["BACKEND"]
if BACKEND == "collectives":
    import collectives.torch  # noqa: F401  (registers backend "collectives", here and in every spawned rank)
torch.set_num_threads(1)  # several ranks share the host's cores

from torch.testing._internal import common_distributed  # noqa: E402

# The suite gates tests on these feature sets at import time (as torch_suite_rank.py does under mpiexec).
if BACKEND not in ("gloo", "nccl", "ucc", "mpi"):
    for feature in ("plugin", "ddp", "subgroup"):
        common_distributed.DistTestCases.backend_feature[feature].add(BACKEND)

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """torch's test/distributed/test_distributed_spawn.py's class, for any backend."""

    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


# a decorator skip that names gloo or MPI gates a CPU test on the backend's name (as in torch_suite_rank.py)
NAME_GATE = re.compile(r"\b(gloo|mpi)\b", re.IGNORECASE)


def decorator_skip(name: str) -> str | None:
    method = getattr(TestDistBackendWithSpawn, name, None)
    if method is not None and getattr(method, "__unittest_skip__", False):
        return str(getattr(method, "__unittest_skip_why__", "skipped by a decorator"))
    return None


def main() -> None:
    import argparse
    import faulthandler
    import json
    import time
    import unittest

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", required=True, help="JSON-lines file to append to")
    ap.add_argument("--run-name-gated", action="store_true",
                    help="run tests that a decorator skips only because of the backend's name (reported as gated)")
    ap.add_argument("--watchdog", type=float, default=600.0,
                    help="seconds after which a test that torch's own timeout did not end ends this process")
    ap.add_argument("--only-gloo-passed", metavar="BASELINE",
                    help="spawn only the tests that gloo passes at WORLD_SIZE in this baseline file (and those "
                         "run because of --run-name-gated); the others are recorded as not run")
    ap.add_argument("tests", nargs="+", help="test names of DistributedTest._DistTestBase")
    args = ap.parse_args()
    gloo_passed = None
    if args.only_gloo_passed:
        with open(args.only_gloo_passed, encoding="utf-8") as f:
            gloo_passed = set(json.load(f)["world_sizes"][os.environ["WORLD_SIZE"]])

    def record(line: dict) -> None:
        with open(args.results, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")

    class Outcome(unittest.TestResult):
        outcome, message = "passed", ""

        def addSkip(self, test, reason):  # noqa: N802 - unittest's API
            super().addSkip(test, reason)
            self.outcome, self.message = "skipped", str(reason)

        def addError(self, test, err):  # noqa: N802
            super().addError(test, err)
            self.outcome, self.message = "failed", self._exc_info_to_string(err, test)

        def addFailure(self, test, err):  # noqa: N802
            super().addFailure(test, err)
            self.outcome, self.message = "failed", self._exc_info_to_string(err, test)

        def addUnexpectedSuccess(self, test):  # noqa: N802
            super().addUnexpectedSuccess(test)
            self.outcome, self.message = "failed", "unexpected success of a test marked expectedFailure"

    for name in args.tests:
        if not hasattr(TestDistBackendWithSpawn, name):
            record({"test": name, "outcome": "skipped", "codes": [], "message": f"no test {name} in this torch"})
            continue
        gated = None
        skip = decorator_skip(name)
        if skip is not None and args.run_name_gated and NAME_GATE.search(skip):
            # the parent reads the mark before spawning; the ranks call the test function directly
            gated = skip
            del getattr(TestDistBackendWithSpawn, name).__unittest_skip__
        elif skip is None and gloo_passed is not None and name not in gloo_passed:
            record({"test": name, "outcome": "skipped", "codes": [], "not_run": True,
                    "message": "not run (--only-gloo-passed): gloo does not pass it at this world size"})
            continue
        record({"start": name})
        faulthandler.dump_traceback_later(args.watchdog, exit=True)
        start = time.monotonic()
        result = Outcome()
        TestDistBackendWithSpawn(name).run(result)
        faulthandler.cancel_dump_traceback_later()
        record({"test": name, "outcome": result.outcome, "codes": [], "message": result.message[-6000:],
                "gated": gated, "seconds": round(time.monotonic() - start, 2)})
    sys.stdout.flush()


if __name__ == "__main__":
    main()
