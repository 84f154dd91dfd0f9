"""PyTorch's own distributed test suite (`DistributedTest._DistTestBase`) against a backend, under mpiexec.

    python tests/torch/torch_suite.py --backend collectives --world-sizes 2 3 4     # every CPU test, 3 sizes
    python tests/torch/torch_suite.py --backend gloo --world-sizes 2 --out /tmp/gloo2.json

Each launch (`mpiexec -n W python tests/torch/programs/torch_suite_rank.py ...`) runs several tests one after the
other, every MPI rank playing the process torch would have spawned for it. A test that hangs or kills its launch
is recorded as failed and the launch's remaining tests run in a new one. `cpu_tests()` is the name filter: every
test of the suite whose name does not mark it as a GPU test (cuda, gpu, nccl).

`EXPECTED_DIFFERENCES` lists the tests that pass with gloo and cannot pass with another backend, with the reason
(docs/torch.md shows the same table; a test checks they agree).
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
MPIEXEC = Path(sys.executable).parent / "mpiexec"
GPU_NAME = re.compile(r"cuda|gpu|nccl", re.IGNORECASE)

# Tests that pass with gloo on CPU and cannot pass with another backend: they branch on the backend's name.
EXPECTED_DIFFERENCES: dict[str, str] = {
    "test_barrier_timeout_global": "skipped unless BACKEND == 'gloo' (\"Only gloo backend supports timeouts\")",
    "test_barrier_timeout_group": "skipped unless BACKEND == 'gloo' (\"Only gloo backend supports timeouts\")",
    "test_barrier_timeout_full_group": "skipped unless BACKEND == 'gloo' (\"Only gloo backend supports timeouts\")",
    "test_batch_isend_irecv_gloo": "skipped unless BACKEND == 'gloo' (\"GLOO Batch Send Recv CPU\")",
    "test_batch_isend_irecv_gloo_tags": "skipped unless BACKEND == 'gloo' (\"GLOO Batch Send Recv CPU\")",
    "test_monitored_barrier_gloo": "dist.monitored_barrier raises ValueError for any backend but gloo (a name check "
                                   "in torch.distributed); the backend's own ProcessGroup.monitored_barrier is "
                                   "tested in tests/torch instead",
}


def cpu_tests() -> list[str]:
    """Every test of DistributedTest._DistTestBase whose name does not mark it as a GPU test, in source order."""
    import torch

    path = Path(torch.__file__).parent / "testing" / "_internal" / "distributed" / "distributed_test.py"
    names = re.findall(r"^        def (test_\w+)\(", path.read_text(encoding="utf-8"), re.MULTILINE)
    return [n for n in dict.fromkeys(names) if not GPU_NAME.search(n)]


def launch(backend: str, world_size: int, tests: list[str], results: Path, test_timeout: float) -> int:
    """One mpiexec launch running `tests` in order; returns its exit status."""
    limit = int(test_timeout * (len(tests) + 1)) + 30
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(limit), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               COLLECTIVES_TIMEOUT=str(int(test_timeout)))
    cmd = [str(MPIEXEC), "-n", str(world_size), sys.executable, str(RANK_PROGRAM), "--backend", backend,
           "--results", str(results), "--test-timeout", str(test_timeout), *tests]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit + 30, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return -9
    if proc.returncode != 0:
        (results.parent / f"launch_{int(time.time() * 1000)}.log").write_text(
            f"{' '.join(cmd)}\nexit {proc.returncode}\nstdout:\n{proc.stdout[-20000:]}\nstderr:\n{proc.stderr[-20000:]}")
    return proc.returncode


def run_suite(backend: str, world_size: int, tests: list[str], *, per_launch: int = 12,
              test_timeout: float = 120.0, progress=None) -> dict[str, dict]:
    """{test: {"outcome", "message", ...}} for every test, `per_launch` tests per mpiexec launch."""
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="torch_suite_") as tmp:
        results = Path(tmp) / "results.jsonl"
        pending = list(tests)
        while pending:
            chunk, pending = pending[:per_launch], pending[per_launch:]
            results.write_text("")
            status = launch(backend, world_size, chunk, results, test_timeout)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="collectives")
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--tests", nargs="*", help="test names (default: every CPU test)")
    ap.add_argument("--per-launch", type=int, default=12)
    ap.add_argument("--test-timeout", type=float, default=120.0)
    ap.add_argument("--out", help="write {world size: {test: result}} as JSON here")
    args = ap.parse_args()
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
        for name, r in results.items():
            if r["outcome"] == "failed":
                print(f"--- {name}\n{r['message'][-3000:]}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(everything, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
