"""What a simulation returns, and the nccl-tests bandwidth definitions."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# nccl-tests doc/PERFORMANCE.md: busbw = algbw x factor(n)
_BUS = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def bus_factor(collective: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw factor (allreduce 2(n-1)/n; reduce_scatter, allgather (n-1)/n; rooted 1)."""
    if collective not in _BUS:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(_BUS)}")
    return _BUS[collective](world_size) if world_size > 0 else 0.0


@dataclass
class PhaseTime:
    name: str
    time: float  # seconds this phase adds to the critical path


@dataclass
class SimulationResult:
    """One simulated run. SI units: seconds, bytes, bytes per second.

    `nbytes` follows nccl-tests: the full buffer (allreduce/broadcast/reduce: count x itemsize; reduce_scatter:
    the p*k-element input; allgather: the p*k-element output), and algbw = nbytes / time.
    """

    algorithm: str
    collective: str
    topology: str
    world_size: int
    nbytes: int
    count: int  # elements of each rank's input buffer (the schedule's count)
    dtype: str
    mode: str  # "event" or "analytic"
    time: float
    phases: list[PhaseTime]
    tier_bytes: dict[str, float]  # bytes crossing links of each tier (a message crossing 3 hops counts 3 times)
    bottleneck: str
    notes: list[str] = field(default_factory=list)
    reason: str = ""  # why this algorithm (algorithm="auto")
    max_link_utilization: float = 0.0  # busiest link's busy time / elapsed time (<= 1)
    params: dict[str, Any] = field(default_factory=dict)
    protocol: str | None = None  # NCCL's protocol (LL, LL128, Simple) on a runtime cluster, else None
    channels: int | None = None  # channels the schedule runs on (None: the algorithm has no channels)
    # event mode with trace=True: every message's and round's times (collectives.simulator.trace); not in to_dict
    trace: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def algbw(self) -> float:
        return self.nbytes / self.time if self.time > 0 else float("inf")

    @property
    def busbw(self) -> float:
        return self.algbw * bus_factor(self.collective, self.world_size)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("trace", None)
        d["algbw"] = self.algbw
        d["busbw"] = self.busbw
        return d

    def summary(self) -> str:
        lines = [f"{self.algorithm} {self.collective} of {self.nbytes:,} B ({self.count:,} x {self.dtype} per rank) "
                 f"on {self.topology} ({self.world_size:,} ranks), {self.mode} model"
                 + (f", protocol {self.protocol}" if self.protocol else "")
                 + (f", {self.channels} channel(s)" if self.channels else "") + ":",
                 f"  time {self.time * 1e6:,.2f} us, algbw {self.algbw / 1e9:,.2f} GB/s, "
                 f"busbw {self.busbw / 1e9:,.2f} GB/s",
                 f"  bottleneck: {self.bottleneck}"]
        for ph in self.phases:
            lines.append(f"  phase {ph.name!r}: {ph.time * 1e6:,.2f} us")
        moved = ", ".join(f"{t} {b / 1e9:,.3f} GB" for t, b in self.tier_bytes.items() if b > 0)
        if moved:
            lines.append(f"  bytes per tier: {moved}")
        if self.reason:
            lines.append(f"  chosen: {self.reason}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


__all__ = ["PhaseTime", "SimulationResult", "bus_factor"]
