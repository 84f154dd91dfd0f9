"""PyTorch's own distributed test suite (`DistributedTest._DistTestBase`) against a backend, under mpiexec.

    python tests/torch/torch_suite.py --backend collectives --world-sizes 2 3 4     # every CPU test, 3 sizes
    python tests/torch/torch_suite.py --backend gloo --world-sizes 2 3 4 --write-baseline   # what gloo passes

Each launch (`mpiexec -n W python tests/torch/programs/torch_suite_rank.py ...`) runs several tests one after the
other, every MPI rank playing the process torch would have spawned for it. A test that hangs or kills its launch
is recorded as failed and the launch's remaining tests run in a new one. `cpu_tests()` is the name filter: every
test of the suite whose name does not mark it as a GPU test (cuda, gpu, nccl).

`EXPECTED_DIFFERENCES` lists the tests that pass with gloo and cannot pass with another backend, with the reason
(docs/torch.md shows the same table; a test checks they agree). `BASELINE` (data/gloo_baseline.json) holds the
tests gloo passes at each world size with the torch version it was made with; a run of another backend is checked
against it (`differences`): every test gloo passes must pass, or be listed, and no test may fail.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RANK_PROGRAM = HERE / "programs" / "torch_suite_rank.py"
BASELINE = HERE / "data" / "gloo_baseline.json"
MPIEXEC = Path(sys.executable).parent / "mpiexec"
GPU_NAME = re.compile(r"cuda|gpu|nccl", re.IGNORECASE)

# Tests that pass with gloo on CPU and cannot pass with another backend: they branch on the backend's name (in a
# decorator, and then in the body or through torch.distributed's own name check). With another backend the
# harness reports them as skipped with this reason instead of running them (some hang by design).
_TIMEOUT = ("skipped unless the backend is gloo; the body then expects gloo's error text (\"Timed out\") and a group "
            "that outlives the timeout, where the library's timeout (CollectiveTimeoutError) makes the communicator "
            "unusable by design (docs/reliability.md)")
_NO_SYNC = ("skipped unless the backend is gloo, mpi or nccl; the body builds its model only under "
            "`if BACKEND == \"mpi\" or BACKEND == \"gloo\"` (UnboundLocalError otherwise)")
_MONITORED = ("requires backend gloo, and torch.distributed.monitored_barrier raises ValueError for every other "
              "backend (a name check in torch); the backend's own monitored_barrier (collectives.torch."
              "monitored_barrier) is tested in tests/torch/test_torch.py")
EXPECTED_DIFFERENCES: dict[str, str] = {
    "test_barrier_timeout_global": _TIMEOUT,
    "test_barrier_timeout_group": _TIMEOUT,
    "test_barrier_timeout_full_group": _TIMEOUT,
    "test_accumulate_gradients_no_sync": _NO_SYNC,
    "test_accumulate_gradients_no_sync_grad_is_view": _NO_SYNC,
    "test_accumulate_gradients_no_sync_allreduce_hook": _NO_SYNC,
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook": _NO_SYNC,
    "test_monitored_barrier_gloo": _MONITORED,
    "test_monitored_barrier_gloo_subgroup": _MONITORED,
    "test_monitored_barrier_gloo_rank_0_timeout": _MONITORED,
    "test_monitored_barrier_allreduce_hang": _MONITORED,
    "test_monitored_barrier_allreduce_hang_wait_all_ranks": _MONITORED,
    "test_monitored_barrier_failure_order": _MONITORED,
    "test_monitored_barrier_wait_all_ranks": _MONITORED,
}


def cpu_tests() -> list[str]:
    """Every test of DistributedTest._DistTestBase whose name does not mark it as a GPU test, in source order."""
    import torch

    path = Path(torch.__file__).parent / "testing" / "_internal" / "distributed" / "distributed_test.py"
    names = re.findall(r"^        def (test_\w+)\(", path.read_text(encoding="utf-8"), re.MULTILINE)
    return [n for n in dict.fromkeys(names) if not GPU_NAME.search(n)]


def launch(backend: str, world_size: int, tests: list[str], results: Path, test_timeout: float,
           run_name_gated: bool) -> int:
    """One mpiexec launch running `tests` in order; returns its exit status."""
    limit = int(test_timeout * (len(tests) + 1)) + 30
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(limit), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               COLLECTIVES_TIMEOUT=str(int(test_timeout)))
    cmd = [str(MPIEXEC), "-n", str(world_size), sys.executable, str(RANK_PROGRAM), "--backend", backend,
           "--results", str(results), "--test-timeout", str(test_timeout),
           *(["--run-name-gated"] if run_name_gated else []), *tests]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit + 30, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return -9
    if proc.returncode != 0:
        (results.parent / f"launch_{int(time.time() * 1000)}.log").write_text(
            f"{' '.join(cmd)}\nexit {proc.returncode}\nstdout:\n{proc.stdout[-20000:]}\nstderr:\n{proc.stderr[-20000:]}")
    return proc.returncode


def run_suite(backend: str, world_size: int, tests: list[str], *, per_launch: int = 12,
              test_timeout: float = 120.0, run_name_gated: bool | None = None, progress=None) -> dict[str, dict]:
    """{test: {"outcome", "message", ...}} for every test, `per_launch` tests per mpiexec launch. Tests that a
    decorator skips only because of the backend's name run anyway for every backend but gloo (default)."""
    if run_name_gated is None:
        run_name_gated = backend != "gloo"
    out: dict[str, dict] = {}
    if backend != "gloo":
        for name in [t for t in tests if t in EXPECTED_DIFFERENCES]:
            out[name] = {"test": name, "outcome": "skipped", "codes": [],
                         "message": f"expected difference: {EXPECTED_DIFFERENCES[name]}"}
        tests = [t for t in tests if t not in EXPECTED_DIFFERENCES]
    with tempfile.TemporaryDirectory(prefix="torch_suite_") as tmp:
        results = Path(tmp) / "results.jsonl"
        pending = list(tests)
        while pending:
            chunk, pending = pending[:per_launch], pending[per_launch:]
            results.write_text("")
            status = launch(backend, world_size, chunk, results, test_timeout, run_name_gated)
            started = None
            for line in results.read_text().splitlines():
                entry = json.loads(line)
                if "start" in entry:
                    started = entry["start"]
                    continue
                out[entry["test"]] = entry
                started = None
                if progress is not None:
                    progress(entry)
            if started is not None:  # the launch died inside this test
                logs = sorted(Path(tmp).glob("launch_*.log"))
                detail = logs[-1].read_text()[-6000:] if logs else ""
                out[started] = {"test": started, "outcome": "failed", "codes": [],
                                "message": f"the launch ended inside the test (exit status {status}: a hang ended by "
                                           f"the watchdog after {test_timeout} s, or a crash)\n{detail}"}
                if progress is not None:
                    progress(out[started])
            done = [t for t in chunk if t in out]
            rest = chunk[chunk.index(done[-1]) + 1:] if done else chunk[1:]
            pending = rest + pending
            if not done and started is None:  # the launch never got going: record it and stop
                logs = sorted(Path(tmp).glob("launch_*.log"))
                raise RuntimeError(f"mpiexec launch failed before any test (exit {status}):\n"
                                   + (logs[-1].read_text()[-6000:] if logs else ""))
    return out


def differences(results: dict[str, dict], gloo_passed: list[str]) -> list[str]:
    """What is wrong with a run of another backend: tests that failed, and tests gloo passes that did not pass
    (and are not listed in EXPECTED_DIFFERENCES)."""
    problems = [f"{name} failed:\n{r['message'][-2000:]}" for name, r in results.items() if r["outcome"] == "failed"]
    for name in gloo_passed:
        r = results.get(name)
        if name in EXPECTED_DIFFERENCES or r is None or r["outcome"] in ("passed", "failed"):
            continue
        problems.append(f"{name} passes with gloo but was {r['outcome']}: {r['message'][:300]}")
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="collectives")
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--tests", nargs="*", help="test names (default: every CPU test)")
    ap.add_argument("--per-launch", type=int, default=12)
    ap.add_argument("--test-timeout", type=float, default=120.0)
    ap.add_argument("--out", help="write {world size: {test: result}} as JSON here")
    ap.add_argument("--write-baseline", action="store_true", help=f"(gloo) write the passed tests to {BASELINE}")
    args = ap.parse_args()
    import torch

    baseline = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
    tests = args.tests or cpu_tests()
    everything = {}
    for w in args.world_sizes:
        start = time.monotonic()

        def show(entry, w=w):
            print(f"[{w} ranks] {entry['outcome']:8s} {entry['test']}", flush=True)
        results = run_suite(args.backend, w, tests, per_launch=args.per_launch, test_timeout=args.test_timeout,
                            progress=show)
        everything[w] = results
        counts = {k: sum(1 for r in results.values() if r["outcome"] == k) for k in ("passed", "skipped", "failed")}
        print(f"{args.backend}, {w} ranks: {counts['passed']} passed, {counts['failed']} failed, "
              f"{counts['skipped']} skipped ({time.monotonic() - start:.0f} s)", flush=True)
        gated = sorted(n for n, r in results.items() if r.get("gated") and r["outcome"] == "passed")
        if gated:
            print(f"  of them {len(gated)} passed that torch skips for this backend by name: {' '.join(gated)}")
        for name, r in results.items():
            if r["outcome"] == "failed":
                print(f"--- {name}\n{r['message'][-3000:]}", flush=True)
        gloo_passed = baseline.get("world_sizes", {}).get(str(w))
        if args.backend != "gloo" and gloo_passed is not None:
            problems = differences(results, gloo_passed)
            listed = sorted(set(gloo_passed) & set(EXPECTED_DIFFERENCES))
            print(f"against gloo's {len(gloo_passed)} passed tests (torch {baseline['torch']}): "
                  f"{len(problems)} problems, {len(listed)} listed in EXPECTED_DIFFERENCES", flush=True)
            for problem in problems:
                print(f"PROBLEM {problem}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(everything, indent=1, sort_keys=True))
    if args.write_baseline:
        if args.backend != "gloo":
            raise SystemExit("--write-baseline records what gloo passes: run it with --backend gloo")
        sizes = dict(baseline.get("world_sizes", {})) if baseline.get("torch") == torch.__version__ else {}
        for w, results in everything.items():
            sizes[str(w)] = sorted(n for n, r in results.items() if r["outcome"] == "passed")
        BASELINE.parent.mkdir(exist_ok=True)
        BASELINE.write_text(json.dumps({"torch": torch.__version__, "world_sizes": sizes}, indent=1, sort_keys=True)
                            + "\n")


if __name__ == "__main__":
    main()
