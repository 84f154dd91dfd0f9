"""The scripts in bench/ start: every one prints its --help (argparse formats help strings with %: a literal
percent sign must be escaped, or --help crashes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).parents[2] / "bench").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_help_prints(script):
    if script.name == "bench_torch.py" and subprocess.run([sys.executable, "-c", "import torch"],
                                                          capture_output=True).returncode:
        # torch is an optional extra: without it the script says so and exits (asked in a fresh interpreter:
        # this one has tests/ on sys.path, where tests/torch would pass for a namespace package)
        pytest.skip("torch is not installed")
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "usage:" in proc.stdout, (script.name, proc.stderr[-2000:])
