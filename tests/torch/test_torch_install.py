"""The torch extra and the CPU install path (docs/torch.md, "Install").

The extra names the torch versions the backend is tested with; the installed torch must satisfy it (else the
backend runs on an untested version). In CI (CI=true) the installed torch must be the CPU build: the backend is
CPU-only, and CI installs `torch==2.13.0` from the CPU build before the extra, so the extra pulls no CUDA wheels.
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'collectives[torch]')")
from packaging.requirements import Requirement  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def torch_requirement() -> Requirement:
    for text in metadata.requires("collectives") or []:
        req = Requirement(text)
        if req.name == "torch" and req.marker is not None and req.marker.evaluate({"extra": "torch"}):
            return req
    raise AssertionError("the collectives package declares no torch extra")


def test_installed_torch_is_a_tested_version():
    req = torch_requirement()
    assert req.specifier.contains(torch.__version__.split("+")[0]), (
        f"torch {torch.__version__} is outside the extra's {req.specifier} (the versions the backend is tested with)")


def test_extra_and_docs_and_ci_name_the_same_version():
    req = torch_requirement()
    docs = (ROOT / "docs" / "torch.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    pinned = re.search(r"torch==(\d+\.\d+\.\d+)", ci)
    assert pinned, ".ci/run installs no pinned torch"
    assert req.specifier.contains(pinned.group(1)), f"CI installs torch {pinned.group(1)}, outside {req.specifier}"
    assert f"torch=={pinned.group(1)}" in docs, "docs/torch.md does not give CI's install command"
    for spec in req.specifier:
        assert f"{spec.operator}{spec.version}" in docs, f"docs/torch.md does not state the extra's {spec}"


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="only CI's install is known to be the CPU build")
def test_ci_installs_the_cpu_build():
    assert torch.version.cuda is None, f"CI installed a CUDA build of torch ({torch.__version__})"
    assert not [d.metadata["Name"] for d in metadata.distributions()
                if (d.metadata["Name"] or "").lower().startswith("nvidia-")], "CUDA runtime wheels are installed"
