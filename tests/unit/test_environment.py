"""collectives.environment: one table of variables, parsed values, clear errors, warnings for unknown names."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from collectives import environment

ROOT = Path(__file__).resolve().parents[2]


def test_docs_table_is_the_registry():
    text = (ROOT / "docs" / "environment.md").read_text()
    assert environment.table() in text


def test_defaults_and_parsing(monkeypatch):
    monkeypatch.delenv("COLLECTIVES_TIMEOUT", raising=False)
    assert environment.get("COLLECTIVES_TIMEOUT") == 600.0
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "none")
    assert environment.get("COLLECTIVES_TIMEOUT") is None
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "2.5")
    assert environment.get("COLLECTIVES_TIMEOUT") == 2.5
    monkeypatch.setenv("COLLECTIVES_CHECK", "OFF")
    assert environment.get("COLLECTIVES_CHECK") == "off"
    monkeypatch.setenv("COLLECTIVES_SHM", "0")
    assert environment.get("COLLECTIVES_SHM") is False


@pytest.mark.parametrize("name,value", [("COLLECTIVES_TIMEOUT", "-1"), ("COLLECTIVES_CHECK", "some"),
                                        ("COLLECTIVES_SHM", "maybe"), ("COLLECTIVES_KERNEL_THREADS", "0")])
def test_bad_values_name_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        environment.get(name)


def test_unknown_name_warns_with_a_suggestion():
    env = {"COLLECTIVES_TIMOUT": "3", "PATH": "/usr/bin"}
    assert environment.unknown_names(env) == [("COLLECTIVES_TIMOUT", "COLLECTIVES_TIMEOUT")]
    proc = subprocess.run([sys.executable, "-c", "import collectives"], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert proc.returncode == 0
    assert "COLLECTIVES_TIMOUT" in proc.stderr and "did you mean COLLECTIVES_TIMEOUT" in proc.stderr


def test_no_module_reads_a_collectives_variable_directly():
    """Every COLLECTIVES_* read goes through environment.get: no os.environ lookup of such a name elsewhere."""
    offenders = []
    for path in (ROOT / "collectives").rglob("*.py"):
        if path.name == "environment.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith(environment.PREFIX) and node.value not in environment.VARIABLES:
                offenders.append(f"{path.relative_to(ROOT)}: unknown variable {node.value}")
            read = None
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv") and node.args:
                read = node.args[0]
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
                read = node.slice
            if isinstance(read, ast.Constant) and str(read.value).startswith(environment.PREFIX):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: reads {read.value} directly")
    assert not offenders, "\n".join(offenders)
