"""Every code block of README.md and docs/*.md runs as written.

What runs, by the fence and the HTML comment on the line just above it (invisible on the rendered page):

* a ```python block runs with `python`, each file's blocks in order in one namespace (a block may use what an
  earlier one defined, as a reader would), from a scratch directory where tests/ and examples/ are as in the
  repository (examples/ on the path); a block whose comment says `<!-- run: mpiexec -n N -->` runs alone under
  `mpiexec -n N`, `<!-- run: torchrun --nproc_per_node N -->` under torchrun. The one-rank warning on stderr
  fails a block run without mpiexec (it needs the comment);
* a ```bash/```sh block runs with `bash -e` when its comment says `<!-- run -->`; other shell blocks (installs,
  cluster launches) are examples of a setting this machine is not;
* `<!-- run ...; test: 'A' => 'B'; 'C' => 'D' -->`: the test runs the block with those replacements, to keep a
  long block short (smaller sizes, --quick); the page shows the block as a user runs it;
* `<!-- not run: why -->` skips a block, and the skip and its reason show in pytest's summary;
* a fence without a language is output or notation, not code.

Each launch runs under a timeout; the whole file takes under a minute. Blocks that need PyTorch skip (with the
reason) where it is not installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import launcher
import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT = 60
_MARK = re.compile(r"^<!--\s*(run|not run)\b(.*?)-->\s*$")


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    mark: str | None  # "run", "not run" or None
    detail: str  # what follows the mark

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def ranks(self) -> int | None:
        m = re.search(r"mpiexec -n (\d+)", self.detail) if self.mark == "run" else None
        return int(m.group(1)) if m else None

    def torchrun(self) -> int | None:
        m = re.search(r"torchrun --nproc_per_node (\d+)", self.detail) if self.mark == "run" else None
        return int(m.group(1)) if m else None

    def for_test(self) -> str:
        """The code with the comment's `test: 'A' => 'B'` replacements applied (each must match)."""
        code = self.code
        spec = self.detail.split("test:", 1)[1] if "test:" in self.detail else ""
        for old, new in re.findall(r"'((?:[^'\\]|\\.)*)'\s*=>\s*'((?:[^'\\]|\\.)*)'", spec):
            assert old in code, f"{self.where}: the test replacement {old!r} is not in the block"
            code = code.replace(old, new)
        return code


def blocks(path: Path) -> list[Block]:
    out, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```(\S*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        start, indent = i, len(fence.group(1))
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        mark = _MARK.match(lines[start - 1].strip()) if start else None
        out.append(Block(path, start + 1, fence.group(2).lower(),
                         textwrap.dedent("\n".join(x[indent:] if x[:indent].isspace() else x
                                                   for x in lines[start + 1:j])) + "\n",
                         mark.group(1) if mark else None, mark.group(2).strip(" :;") if mark else ""))
        i = j + 1
    return out


ALL = [b for p in DOCS for b in blocks(p)]
PYTHON = [b for b in ALL if b.lang in ("python", "py")]
SHELL = [b for b in ALL if b.lang in ("bash", "sh", "shell", "console")]


def _scratch(tmp_path: Path) -> Path:
    """A directory to run blocks in, where the repository's tests/ and examples/ are where the docs say."""
    for name in ("tests", "examples"):
        if not (tmp_path / name).exists():
            (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def _env(tmp_path: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "examples"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["COLLECTIVES_TIMEOUT"] = "30"
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # a block never writes the user's own calibration
    env.pop("COLLECTIVES_ONE_RANK", None)
    found = launcher.find()
    return found.plain_env(env) if found is not None else env  # shell blocks call a plain `mpiexec`


def _needs_torch(code: str) -> None:
    if re.search(r"^\s*(import|from) (collectives\.)?torch\b", code, re.M):
        pytest.importorskip("torch.distributed", reason="PyTorch is not installed (pip install 'collectives[torch]')")


def _check(proc: subprocess.CompletedProcess, what: str) -> None:
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


# the python blocks of one file, run as one script (in order, one namespace), each marked by a line on stderr so a
# failure names its block
_RUNNER = """
import sys, traceback
blocks = {blocks!r}
scope = {{"__name__": "__main__"}}
for where, code in blocks:
    print("@@ block", where, file=sys.stderr, flush=True)
    try:
        exec(compile(code, where, "exec"), scope)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    except BaseException:
        traceback.print_exc()
        print("@@ failed", where, file=sys.stderr, flush=True)
        sys.exit(1)
"""


@pytest.mark.parametrize("path", [p for p in DOCS if any(b.mark is None for b in PYTHON if b.path == p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run_in_order(path, tmp_path):
    mine = [b for b in PYTHON if b.path == path and b.mark is None]
    for b in mine:
        _needs_torch(b.code)
    script = tmp_path / "blocks.py"
    script.write_text(_RUNNER.format(blocks=[(b.where, b.for_test()) for b in mine]))
    proc = subprocess.run([sys.executable, str(script)], cwd=_scratch(tmp_path), env=_env(tmp_path),
                          capture_output=True, text=True, timeout=TIMEOUT)
    _check(proc, f"the python blocks of {path.name}")
    assert "running as 1 rank" not in proc.stderr, \
        f"a block of {path.name} needs mpiexec: mark it <!-- run: mpiexec -n N -->\n{proc.stderr[-2000:]}"


@pytest.mark.parametrize("block", [b for b in PYTHON + SHELL if b.mark is not None] or [None],
                         ids=lambda b: b.where if b else "none")
def test_marked_blocks_run(block, tmp_path):
    if block is None:
        pytest.skip("no marked block")
    if block.mark == "not run":
        pytest.skip(f"{block.where}: not run: {block.detail}")
    _needs_torch(block.code)
    env = _env(tmp_path)
    code = block.for_test()
    _scratch(tmp_path)
    if block.lang in ("python", "py"):
        (tmp_path / "app.py").write_text(code)
        n, workers = block.ranks(), block.torchrun()
        argv = [sys.executable, "app.py"]
        if workers:  # torch's launcher, with no MPI launcher's variables (transport/host.py lists them)
            from collectives.transport.host import LAUNCHER_VARIABLES

            env = {k: v for k, v in env.items() if k not in LAUNCHER_VARIABLES}
            argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(workers),
                    "app.py"]
        proc = (launcher.run(n, argv, timeout=TIMEOUT, cwd=tmp_path, env=env) if n else
                subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT))
    else:
        proc = subprocess.run(["bash", "-e", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT)
    _check(proc, block.where)


def test_the_parser_sees_the_marks():
    readme = blocks(ROOT / "README.md")
    assert any(b.lang == "bash" and b.mark == "run" for b in readme), "the first command is marked runnable"
    assert any(b.lang == "python" and b.ranks() for b in readme), "the real-runs snippet runs under mpiexec"
