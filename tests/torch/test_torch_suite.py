"""PyTorch's own distributed test suite (DistributedTest._DistTestBase, in the torch wheel) on backend "collectives".

Under mpiexec: every CPU test (torch_suite.cpu_tests: names without cuda/gpu/nccl) runs at one world size, several
tests per mpiexec launch, each MPI rank playing the process torch would have spawned (torch_suite.py). Every test
that passes with gloo at that world size (data/gloo_baseline.json, made with `python tests/torch/torch_suite.py
--backend gloo --world-sizes 2 3 4 --write-baseline`) must pass, unless torch_suite.EXPECTED_DIFFERENCES lists it
with its reason (docs/torch.md shows the same list), and no test may fail. All three world sizes:
`python tests/torch/torch_suite.py --backend collectives --world-sizes 2 3 4`.

Through torch's own spawning harness (no mpiexec: the backend on torch's store), CI runs torch_suite.SPAWN_CI_TESTS,
a subset: torch spawns fresh processes for every test, which costs seconds per test on 2 cores. The whole suite:
`python tests/torch/torch_suite.py --backend collectives --launcher spawn --world-sizes 2 3 4`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'collectives[torch]')")
pytest.importorskip("mpi4py")
pytest.importorskip("expecttest", reason="PyTorch's test suite imports expecttest (pip install expecttest)")

sys.path.insert(0, str(Path(__file__).parent))
import torch_suite  # noqa: E402

WORLD_SIZE = 2  # CI's world size: gloo passes the same CPU tests at 2, 3 and 4 ranks but for the 4-rank-only ones
ROOT = Path(__file__).resolve().parents[2]


def test_expected_differences_are_documented():
    docs = (ROOT / "docs" / "torch.md").read_text(encoding="utf-8")
    missing = [name for name in torch_suite.EXPECTED_DIFFERENCES if f"`{name}`" not in docs]
    assert not missing, f"docs/torch.md does not list {missing}"


def test_cpu_filter_keeps_cpu_tests_only():
    tests = torch_suite.cpu_tests()
    assert len(tests) > 200 and "test_all_reduce_sum" in tests and "test_all_to_all_single_unequal_split" in tests
    assert not [t for t in tests if torch_suite.GPU_NAME.search(t)]


@pytest.mark.mpi
@pytest.mark.skipif(not torch_suite.MPIEXEC.exists(), reason=f"no mpiexec next to {sys.executable}")
def test_pytorch_distributed_suite():
    baseline = json.loads(torch_suite.BASELINE.read_text())
    if baseline["torch"] != torch.__version__:
        pytest.skip(f"the gloo baseline was made with torch {baseline['torch']}, this is {torch.__version__}: "
                    "remake it with torch_suite.py --backend gloo --write-baseline")
    results = torch_suite.run_suite("collectives", WORLD_SIZE, torch_suite.cpu_tests(), per_launch=400,
                                    test_timeout=60)
    problems = torch_suite.differences(results, baseline["world_sizes"][str(WORLD_SIZE)])
    assert not problems, "\n\n".join(problems)
    passed = [n for n, r in results.items() if r["outcome"] == "passed"]
    assert len(passed) >= len(baseline["world_sizes"][str(WORLD_SIZE)]) - len(torch_suite.EXPECTED_DIFFERENCES)


def test_pytorch_distributed_suite_through_torch_spawn():
    """The CI subset through torch's spawning harness: each test passes (all of them pass with gloo, or are gated
    on MPI's name only), checked against the gloo baseline as the whole suite is."""
    baseline = json.loads(torch_suite.BASELINE.read_text())
    if baseline["torch"] != torch.__version__:
        pytest.skip(f"the gloo baseline was made with torch {baseline['torch']}, this is {torch.__version__}")
    tests = torch_suite.SPAWN_CI_TESTS
    results = torch_suite.run_suite("collectives", WORLD_SIZE, tests, per_launch=len(tests), test_timeout=120,
                                    launcher="spawn")
    problems = torch_suite.differences(results, baseline["world_sizes"][str(WORLD_SIZE)])
    assert not problems, "\n\n".join(problems)
    not_passed = {n: r["outcome"] for n, r in results.items() if r["outcome"] != "passed"}
    assert not not_passed and sorted(results) == sorted(tests), not_passed
