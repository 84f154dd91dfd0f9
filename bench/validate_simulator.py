"""The simulator against published measurements: every row of ../shared/reference/published.md, predicted with
the model's defaults (no algorithm parameter passed; the topology describes the measured system).

Prints the markdown table of docs/validation.md ("Published measurements"); `--write` replaces that table in
the doc. tests/unit/test_validation.py recomputes the table and checks the doc still says the same.

Run: python bench/validate_simulator.py [--write]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

GIB, MIB, KIB = 1 << 30, 1 << 20, 1 << 10
DOC = Path(__file__).resolve().parent.parent / "docs" / "validation.md"
BEGIN, END = "<!-- validation table: bench/validate_simulator.py -->", "<!-- end of validation table -->"


@dataclass(frozen=True)
class Case:
    system: str
    what: str  # the measurement, as published.md states it
    measured: float
    unit: str  # "GB/s" (busbw) or "us" (time)
    algorithm: str
    preset: str
    size: int
    collective: str = "allreduce"
    overrides: tuple = ()  # ClusterSpec fields that describe the measured system
    source: str = ""
    kind: str = "large"  # "large" (>= 256 MiB), "mid" or "small" (a latency)
    note: str = ""

    def topology(self):
        from collectives.topology import preset

        return preset(self.preset, **dict(self.overrides))

    def command(self) -> str:
        from collectives.topology.presets import _PRESETS
        from collectives.units import human

        p = _PRESETS[self.preset]
        over = dict(self.overrides)
        size_arg = f" --{p.size_alias} {over.pop(p.size_field)}" if p.size_field in over else ""
        sets = "".join(f" --set {k}={_cli(v)}" for k, v in over.items())
        coll = f" --collective {self.collective}" if self.collective != "allreduce" else ""
        return (f"collectives simulate --preset {self.preset}{size_arg}{sets}{coll} --algorithms {self.algorithm} "
                f"-b {human(self.size).replace(' ', '')} -e {human(self.size).replace(' ', '')}")


def _cli(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else str(value)


def cases() -> list[Case]:
    from collectives.topology.presets import ROCE_EFFICIENCY

    azure = "Azure/AI-benchmarking-guide, ND_H100_v5_results.md (the NVLS algorithm's table)"
    one = (("domains", 1),)
    out = [
        Case("8 x H100 (DGX), NCCL 2.18.5", "NVLS busbw, 8 GiB", 478.9, "GB/s", "nvls", "dgx-h100", 8 * GIB, source=azure,
             overrides=one),
        Case("8 x H100 (DGX), NCCL 2.18.5", "NVLS busbw, 1 GiB", 466.4, "GB/s", "nvls", "dgx-h100", GIB, source=azure,
             overrides=one),
        Case("8 x H100 (DGX), NCCL 2.18.5", "NVLS busbw, 64 MiB", 361.8, "GB/s", "nvls", "dgx-h100", 64 * MIB,
             source=azure, overrides=one, kind="mid"),
        Case("8 x H100 (DGX), NCCL 2.18.5", "NVLS busbw, 16 MiB", 234.5, "GB/s", "nvls", "dgx-h100", 16 * MIB,
             source=azure, overrides=one, kind="mid"),
        Case("8 x H100 (DGX), NCCL 2.18.5", "NVLS busbw, 1 MiB", 43.7, "GB/s", "nvls", "dgx-h100", MIB, source=azure,
             overrides=one, kind="mid"),
        Case("8 x H100 (DGX), NCCL 2.18.5", "1 KiB allreduce time", 25.6, "us", "nvls", "dgx-h100", KIB,
             source=azure, overrides=one, kind="small",
             note="published.md says default algorithm; the source's table is the NVLS algorithm's"),
        Case("8 x H200, NCCL 2.20.5", "NVLS busbw, 8 GiB", 480.0, "GB/s", "nvls", "dgx-h200", 8 * GIB,
             source="Azure/AI-benchmarking-guide, ND_H200_v5_results.md", overrides=one),
    ]
    for g, m in ((5, 420.0), (6, 440.0), (7, 460.0), (8, 480.0)):
        out.append(Case(f"{g} GPUs of an H100 node", "NVLS busbw, 2 GiB", m, "GB/s", "nvls", "dgx-h100", 2 * GIB,
                        overrides=(("domains", 1), ("gpus_per_domain", g)), source="NVIDIA/nccl#1455"))
    for g in (2, 3, 4):
        out.append(Case(f"{g} GPUs of an H100 node", "ring busbw, 2 GiB (published ~365-370)", 367.5, "GB/s", "ring",
                        "dgx-h100", 2 * GIB, overrides=(("domains", 1), ("gpus_per_domain", g)),
                        source="NVIDIA/nccl#1455"))
    for coll in ("allgather", "reduce_scatter"):
        out.append(Case("8 x H100 (DGX)", f"{coll} busbw, large (8 GiB)", 370.0, "GB/s", "auto", "dgx-h100", 8 * GIB,
                        collective=coll, overrides=one, source="NVIDIA/nccl-tests#212"))
    nccl1801 = "NVIDIA/nccl#1801 (NCCL 2.27.3; partitions on different racks, IB only between them)"
    for g, ring, tree in ((4, 196.7, 234.4), (8, 393.7, 485.7)):
        over = (("domains", 3), ("gpus_per_domain", g))
        out.append(Case(f"GB200, 3 partitions of {g} GPUs", "ring busbw, 16 GiB", ring, "GB/s", "ring", "gb200-nvl72",
                        16 * GIB, overrides=over, source=nccl1801))
        out.append(Case(f"GB200, 3 partitions of {g} GPUs", "tree busbw, 16 GiB", tree, "GB/s", "double_binary_tree",
                        "gb200-nvl72", 16 * GIB, overrides=over, source=nccl1801))
    roce = (("domains", 2), ("sharp", None), ("nic_efficiency", ROCE_EFFICIENCY))
    out.append(Case("2 x 8 H100, 8 x 400 Gb/s RoCE, NCCL 2.19.3", "busbw, NVLS off (8 GiB)", 330.0, "GB/s", "auto",
                    "dgx-h100", 8 * GIB, overrides=roce + (("nvls", False),), source="NVIDIA/nccl#1221"))
    out.append(Case("2 x 8 H100, 8 x 400 Gb/s RoCE, NCCL 2.19.3", "busbw, NVLS on (NVLSTree; 8 GiB)", 430.0, "GB/s",
                    "auto", "dgx-h100", 8 * GIB, overrides=roce, source="NVIDIA/nccl#1221"))
    out.append(Case("NDR InfiniBand, one NIC per GPU", "per-NIC bandwidth (published 46-48; 2 nodes x 1 GPU, "
                    "ring busbw, 8 GiB)", 47.0, "GB/s", "ring", "dgx-h100", 8 * GIB,
                    overrides=(("domains", 2), ("gpus_per_domain", 1)), source="NVIDIA/nccl-tests#290"))
    return out


@dataclass(frozen=True)
class Row:
    case: Case
    predicted: float
    picked: str  # algorithm (protocol, channels) the model ran

    @property
    def error(self) -> float:
        return self.predicted / self.case.measured - 1

    @property
    def meets(self) -> bool:
        """The issue's targets: large messages within 20%, small-message latencies within a factor of 1.5; a
        mid-size row counts toward the median only."""
        if self.case.kind == "large":
            return abs(self.error) <= 0.20
        if self.case.kind == "small":
            return 1 / 1.5 <= self.predicted / self.case.measured <= 1.5
        return True


def predict(case: Case) -> Row:
    from collectives.simulate import simulate

    r = simulate(case.algorithm, case.topology(), case.size, collective=case.collective, mode="analytic")
    value = r.busbw / 1e9 if case.unit == "GB/s" else r.time * 1e6
    extras = ", ".join(x for x in (r.protocol, f"{r.channels} ch" if r.channels else "") if x)
    return Row(case, value, f"{r.algorithm} ({extras})" if extras else r.algorithm)


def rows() -> list[Row]:
    return [predict(c) for c in cases()]


def table(results: list[Row]) -> str:
    lines = ["| system | measurement | measured | predicted | error | model ran | target | command |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        c = r.case
        target = {"large": "within 20%", "small": "within 1.5x", "mid": "(median)"}[c.kind]
        mark = "" if r.meets else " **missed**"
        lines.append(f"| {c.system} | {c.what} | {c.measured:,.1f} {c.unit} | {r.predicted:,.1f} {c.unit} | "
                     f"{r.error:+.1%} | {r.picked} | {target}{mark} | `{c.command()}` |")
    errors = [abs(r.error) for r in results]
    large = [abs(r.error) for r in results if r.case.kind == "large"]
    lines.append("")
    lines.append(f"Median |error| {statistics.median(errors):.1%} over {len(errors)} rows; large messages (>= 256 MiB): "
                 f"worst {max(large):.1%} over {len(large)} rows; rows missing their target: "
                 f"{sum(not r.meets for r in results)}.")
    return "\n".join(lines)


def write(text: str, doc: Path = DOC) -> None:
    body = doc.read_text()
    a, b = body.index(BEGIN) + len(BEGIN), body.index(END)
    doc.write_text(body[:a] + "\n" + text + "\n" + body[b:])


def documented(doc: Path = DOC) -> str:
    body = doc.read_text()
    return body[body.index(BEGIN) + len(BEGIN):body.index(END)].strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"replace the table in {DOC.name}")
    args = ap.parse_args()
    text = table(rows())
    print(text)
    if args.write:
        write(text)
        print(f"# wrote {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
