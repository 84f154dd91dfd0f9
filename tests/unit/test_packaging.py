"""pyproject.toml lists every subpackage (a wheel built from it must hold all of them, not only an editable
install), and the package data the library reads."""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_every_subpackage_is_listed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "collectives").rglob("__init__.py")}
    found.add("collectives.algorithms")  # algorithms/ installs as collectives.algorithms (package-dir)
    assert found == listed, f"missing from pyproject: {sorted(found - listed)}; listed but absent: {sorted(listed - found)}"


def test_package_data_covers_the_default_decisions():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = cfg["package-data"]["collectives"]
    data = [p.relative_to(ROOT / "collectives") for p in (ROOT / "collectives" / "data").glob("*")]
    assert data and all(any(d.match(pat) for pat in patterns) for d in data), (data, patterns)
