"""The MSCCL-IR and alltoall sections of docs/algorithms.md: every command and the Python example run as written."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from collectives.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "algorithms.md").read_text()
SECTIONS = DOC[DOC.index("## Alltoall"):DOC.index("## Checklist for a new algorithm")]


def commands() -> list[list[str]]:
    blocks = re.findall(r"```\n(collectives .*?)```", SECTIONS, flags=re.S)
    return [shlex.split(line)[1:] for block in blocks for line in block.splitlines() if line.startswith("collectives ")]


def test_the_sections_show_commands():
    names = [c[0] for c in commands()]
    assert names.count("verify") >= 4 and names.count("simulate") == 2 and names.count("export") == 2


@pytest.mark.parametrize("argv", commands(), ids=lambda argv: " ".join(argv)[:60])
def test_every_command_runs_as_written(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # export writes its --out file here
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    # the doc's sweeps, shortened (the commands are what is checked here; the tests of each part check results)
    for flag, short in (("-b", "1K"), ("-e", "4M"), ("--world-sizes", "1:4")):
        if flag in argv:
            argv = argv[:argv.index(flag) + 1] + [short] + argv[argv.index(flag) + 2:]
    if "ring8.xml" in argv and argv[0] == "verify":
        assert main(["export", "ring", "--world-size", "8", "--format", "msccl", "--out", "ring8.xml"]) == 0
    code = main(argv)
    out = capsys.readouterr().out
    assert code == (1 if any("broken" in a for a in argv) else 0), out
    if argv[:2] == ["verify", "--msccl"] and "allpairs" in argv[2]:
        assert out in SECTIONS  # the output shown in the doc is the output


def test_the_python_example_runs_and_prints_what_it_shows(capsys, monkeypatch):
    code = re.search(r"```python\n(from collectives import msccl.*?)```", SECTIONS, flags=re.S).group(1)
    monkeypatch.chdir(ROOT)
    exec(compile(code, "docs/algorithms.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    shown = [line[2:] for line in code.splitlines() if line.startswith("# ")]
    assert printed == shown
