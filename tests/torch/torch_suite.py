"""PyTorch's own distributed test suite (`DistributedTest._DistTestBase`) against a backend, under mpiexec or through
torch's own spawning harness.

    python tests/torch/torch_suite.py --backend collectives --world-sizes 2 3 4     # every CPU test, 3 sizes
    python tests/torch/torch_suite.py --backend collectives --launcher spawn --world-sizes 2 3 4   # no mpiexec
    python tests/torch/torch_suite.py --backend gloo --world-sizes 2 3 4 --write-baseline   # what gloo passes

`--launcher mpiexec` (default): each launch (`mpiexec -n W python tests/torch/programs/torch_suite_rank.py ...`)
runs several tests one after the other, every MPI rank playing the process torch would have spawned for it.
`--launcher spawn`: each launch is one process (programs/torch_suite_spawn.py) running the tests as torch's
test/distributed/test_distributed_spawn.py does, `MultiProcessTestCase._spawn_processes` starting W fresh
processes per test with no MPI launcher's environment (the backend then runs on torch's store). Either way a test
that hangs or kills its launch is recorded as failed and the launch's remaining tests run in a new one.
`cpu_tests()` is the name filter: every test of the suite whose name does not mark it as a GPU test (cuda, gpu,
nccl).

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
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RANK_PROGRAM = HERE / "programs" / "torch_suite_rank.py"
SPAWN_PROGRAM = HERE / "programs" / "torch_suite_spawn.py"
BASELINE = HERE / "data" / "gloo_baseline.json"
MPIEXEC = Path(sys.executable).parent / "mpiexec"
LAUNCHERS = ("mpiexec", "spawn")
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

# The CI subset through torch's spawning harness (tests/torch/test_torch_suite.py): every spawned test costs W
# fresh processes importing torch (6.3-6.9 s at 2 ranks on 2 cores at load average 3, several times that on a
# busier VM), so CI runs one test of each kind: an allreduce, a broadcast and a scatter on the default group,
# all_gather_coalesced, torch's objects over a sub-group (new_group), point-to-point from any source, DDP, and an
# all-to-all that torch gates on MPI's name. All pass with gloo at 2 ranks but the all-to-all.
SPAWN_CI_TESTS = [
    "test_all_reduce_sum",
    "test_broadcast_full_group",
    "test_all_gather_coalesced_simple",
    "test_scatter",
    "test_all_gather_object_subgroup",
    "test_send_recv_any_source",
    "test_DistributedDataParallelCPU",
    "test_all_to_all_single_unequal_split",
]


def cpu_tests() -> list[str]:
    """Every test of DistributedTest._DistTestBase whose name does not mark it as a GPU test, in source order."""
    import torch

    path = Path(torch.__file__).parent / "testing" / "_internal" / "distributed" / "distributed_test.py"
    names = re.findall(r"^        def (test_\w+)\(", path.read_text(encoding="utf-8"), re.MULTILINE)
    return [n for n in dict.fromkeys(names) if not GPU_NAME.search(n)]


def _launch_command(launcher: str, backend: str, world_size: int, tests: list[str], results: Path,
                    test_timeout: float, run_name_gated: bool, temp: Path,
                    only_gloo_passed: bool = False) -> tuple[list[str], dict, int]:
    """(command, environment, time limit) of one launch running `tests` in order."""
    limit = int(test_timeout * (len(tests) + 1)) + 30
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", COLLECTIVES_TIMEOUT=str(int(test_timeout)))
    gate = ["--run-name-gated"] if run_name_gated else []
    if launcher == "mpiexec":
        env["MPIEXEC_TIMEOUT"] = str(limit)
        return ([str(MPIEXEC), "-n", str(world_size), sys.executable, str(RANK_PROGRAM), "--backend", backend,
                 "--results", str(results), "--test-timeout", str(test_timeout), *gate, *tests], env, limit)
    # torch's spawning harness: what torch's run_test.py sets for test_distributed_spawn.py, and no MPI
    # launcher's environment (the backend then picks the store runtime, as under torchrun)
    for name in [v for v in env if v.startswith(("PMI_", "OMPI_", "MV2_", "HYDRA_", "MPIEXEC_"))]:
        del env[name]
    (temp / "barrier").mkdir(parents=True, exist_ok=True)
    env.update(BACKEND=backend, WORLD_SIZE=str(world_size), TEMP_DIR=str(temp),
               DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(int(test_timeout)))
    only = ["--only-gloo-passed", str(BASELINE)] if only_gloo_passed else []
    return ([sys.executable, str(SPAWN_PROGRAM), "--results", str(results), "--watchdog", str(test_timeout + 60),
             *gate, *only, *tests], env, limit + 60 * len(tests))


def launch(backend: str, world_size: int, tests: list[str], results: Path, test_timeout: float,
           run_name_gated: bool, launcher: str = "mpiexec", on_entry=None, only_gloo_passed: bool = False) -> int:
    """One launch (`mpiexec -n W`, or one parent process that spawns W ranks per test) running `tests` in order;
    returns its exit status. `on_entry(entry)` gets each line of `results` as the launch writes it. Whatever the
    launch leaves behind (ranks orphaned when a watchdog ended their parent) is killed."""
    cmd, env, limit = _launch_command(launcher, backend, world_size, tests, results, test_timeout, run_name_gated,
                                      results.parent / "temp", only_gloo_passed)
    read = 0

    def new_entries() -> None:
        nonlocal read
        text = results.read_text()
        end = text.rfind("\n") + 1  # complete lines only
        for line in text[read:end].splitlines():
            if on_entry is not None:
                on_entry(json.loads(line))
        read = end

    # output to files: orphaned ranks may hold them open after the launch ended
    out_path, err_path = results.parent / "stdout.txt", results.parent / "stderr.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, cwd=ROOT, start_new_session=True)
        deadline = time.monotonic() + limit + 30
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                new_entries()
                time.sleep(0.5)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the launch's session: whatever it left running
            except (ProcessLookupError, PermissionError):
                pass
            status = proc.wait()  # -9 when the limit passed
        new_entries()
    if status != 0:
        stdout, stderr = out_path.read_text(errors="replace"), err_path.read_text(errors="replace")
        (results.parent / f"launch_{int(time.time() * 1000)}.log").write_text(
            f"{' '.join(cmd)}\nexit {status}\nstdout:\n{stdout[-20000:]}\nstderr:\n{stderr[-20000:]}")
    return status


def run_suite(backend: str, world_size: int, tests: list[str], *, per_launch: int = 12,
              test_timeout: float = 120.0, run_name_gated: bool | None = None, progress=None,
              launcher: str = "mpiexec", only_gloo_passed: bool = False) -> dict[str, dict]:
    """{test: {"outcome", "message", ...}} for every test, `per_launch` tests per launch (`launcher`: "mpiexec",
    or "spawn": torch's own harness). Tests that a decorator skips only because of the backend's name run anyway
    for every backend but gloo (default). `progress(entry)` gets each result as it comes. `only_gloo_passed`
    (spawn only): spawn only the tests gloo passes at this size (BASELINE) and the name-gated ones; the others
    come back skipped with "not_run" set."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher {launcher!r}: use one of {', '.join(LAUNCHERS)}")
    if only_gloo_passed and launcher != "spawn":
        raise ValueError("only_gloo_passed is for launcher='spawn' (under mpiexec a test costs no new processes)")
    if run_name_gated is None:
        run_name_gated = backend != "gloo"
    out: dict[str, dict] = {}
    if backend != "gloo":
        for name in [t for t in tests if t in EXPECTED_DIFFERENCES]:
            out[name] = {"test": name, "outcome": "skipped", "codes": [],
                         "message": f"expected difference: {EXPECTED_DIFFERENCES[name]}"}
        tests = [t for t in tests if t not in EXPECTED_DIFFERENCES]
    started = None

    def take(entry: dict) -> None:
        nonlocal started
        if "start" in entry:
            started = entry["start"]
            return
        out[entry["test"]] = entry
        started = None
        if progress is not None:
            progress(entry)

    with tempfile.TemporaryDirectory(prefix="torch_suite_") as tmp:
        results = Path(tmp) / "results.jsonl"
        pending = list(tests)
        while pending:
            chunk, pending = pending[:per_launch], pending[per_launch:]
            results.write_text("")
            started = None
            status = launch(backend, world_size, chunk, results, test_timeout, run_name_gated, launcher, take,
                            only_gloo_passed)
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
                raise RuntimeError(f"{launcher} launch failed before any test (exit {status}):\n"
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
    ap.add_argument("--launcher", choices=LAUNCHERS, default="mpiexec",
                    help="mpiexec: MPI ranks play torch's processes; spawn: torch's own harness spawns them "
                         "(no mpiexec; the backend runs on torch's store)")
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--tests", nargs="*", help="test names (default: every CPU test)")
    ap.add_argument("--per-launch", type=int, help="tests per launch (default: 12 under mpiexec, all with spawn)")
    ap.add_argument("--only-gloo-passed", action="store_true",
                    help="(spawn) spawn only the tests gloo passes at each size and those torch gates on the "
                         "backend's name; the rest (they skip inside the ranks with gloo) are reported as not run")
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
        per_launch = args.per_launch or (12 if args.launcher == "mpiexec" else len(tests))
        results = run_suite(args.backend, w, tests, per_launch=per_launch, test_timeout=args.test_timeout,
                            progress=show, launcher=args.launcher, only_gloo_passed=args.only_gloo_passed)
        everything[w] = results
        counts = {k: sum(1 for r in results.values() if r["outcome"] == k) for k in ("passed", "skipped", "failed")}
        not_run = sum(1 for r in results.values() if r.get("not_run"))
        print(f"{args.backend}, {w} ranks: {counts['passed']} passed, {counts['failed']} failed, "
              f"{counts['skipped']} skipped{f' ({not_run} of them not run)' if not_run else ''} "
              f"({time.monotonic() - start:.0f} s)", flush=True)
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
