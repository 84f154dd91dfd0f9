"""What the switches can reduce: NVLink SHARP (NVLS) in a scale-up domain, InfiniBand SHARP in the fat-tree.

Facts and sources: ../shared/reference/hardware.md. A `refusal(op, dtype)` of None means the switch offloads the
pair; otherwise it is the reason a schedule builder must fall back to a host algorithm (and report).
"""

from __future__ import annotations

from dataclasses import dataclass

# dtype names as numpy (and ml_dtypes) spell them.
_F16 = ("float16", "bfloat16")
_INT32_64 = ("int32", "uint32", "int64", "uint64")

# NVLS offload (NCCL src/device/reduce_kernel.h, via hardware.md): sum for 16/32/64-bit floats and 32/64-bit
# ints; min/max only for 16-bit floats and 32/64-bit ints; no 8-bit ints; avg = sum in the switch and a divide
# at the endpoint. f16/bf16 accumulate in f32.
NVLS_OPS: dict[str, frozenset[str]] = {
    "sum": frozenset((*_F16, "float32", "float64", *_INT32_64)),
    "avg": frozenset((*_F16, "float32", "float64", *_INT32_64)),
    "min": frozenset((*_F16, *_INT32_64)),
    "max": frozenset((*_F16, *_INT32_64)),
}

# InfiniBand SHARP through NCCL (hardware.md): ops sum, min, max; types f16, f32, f64, i32, u32, i64, u64;
# bf16, i8, u8 only when the switch reports SHARPv3 datatypes.
SHARP_OPS = frozenset(("sum", "min", "max"))
SHARP_DTYPES_BASE = frozenset(("float16", "float32", "float64", *_INT32_64))
SHARP_DTYPES_V3 = SHARP_DTYPES_BASE | frozenset(("bfloat16", "int8", "uint8"))

# Per-generation limits (hardware.md, "Limits by generation"). Values hardware.md calls unpublished are
# parameters; the defaults below say where they come from.
SHARP_GENERATIONS: dict[str, dict[str, object]] = {
    # Switch-IB 2 (EDR), SHARPv1: LLT only, 256 B per OST. Tree limits not in hardware.md: taken as v2's.
    "v1": dict(switch="Switch-IB 2", llt_trees=63, sat_trees=0, sat_scope="switch", max_sat_flows=0,
               ost_size=256, v3_dtypes=False),
    # Quantum (HDR), SHARPv2: 63 LLT + 63 SAT trees per subnet, one active SAT tree per switch, at most 2 SAT
    # flows in parallel; LLT payload "up to ~1-2 KB on Quantum": 1 KiB taken.
    "v2": dict(switch="Quantum (HDR)", llt_trees=63, sat_trees=63, sat_scope="switch", max_sat_flows=2,
               ost_size=1024, v3_dtypes=False),
    # Quantum-2 (NDR), SHARPv3: 511 + 511 trees per subnet, one active SAT tree per port; parallel SAT flows
    # not published (None = no limit modelled).
    "v3": dict(switch="Quantum-2 (NDR)", llt_trees=511, sat_trees=511, sat_scope="port", max_sat_flows=None,
               ost_size=1024, v3_dtypes=True),
    # Quantum-X800 (XDR), supported from SHARP 3.11; limits unpublished, so v3's are assumed (parameters).
    "x800": dict(switch="Quantum-X800 (XDR)", llt_trees=511, sat_trees=511, sat_scope="port", max_sat_flows=None,
                 ost_size=1024, v3_dtypes=True),
}


# NVLS efficiency: the share of the NVLink rate the switch's reduce and multicast reach per GPU.
# src/graph/tuning.cc, nvlsEfficiency: Hopper 0.85, Blackwell 0.74 (the NVLS allreduce of an 8-GPU board).
NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}
# A domain of more GPUs than one board (NVL72: 72 GPUs on 18 switch chips over two switch-tray planes) reaches
# less: 835-847 GB/s busbw for a 4-8 GiB allreduce on a full GB200 NVL72 rack (coreweave/nccl-tests#43), i.e.
# 2(N-1)/(N+1) x 721.8 GB/s x e = 840 GB/s at N = 72 gives e = 0.60. One measurement sets this figure, so the
# model's NVL72 NVLS bandwidth is not an independent prediction (docs/validation.md says so).
NVLS_EFFICIENCY_LARGE_DOMAIN = 0.60
NVLS_BOARD_GPUS = 8


def nvls_derate(generation: str | None, domain_size: int) -> float:
    """NVLS efficiency by GPU generation and domain size (no generation: Hopper's)."""
    base = NVLS_EFFICIENCY.get(generation or "hopper", NVLS_EFFICIENCY["hopper"])
    if domain_size > NVLS_BOARD_GPUS and generation == "blackwell":
        return NVLS_EFFICIENCY_LARGE_DOMAIN
    return base


def dtype_name(dtype: object) -> str:
    """'float32' for np.float32, np.dtype('float32'), 'float32' or ml_dtypes.bfloat16."""
    if isinstance(dtype, str):
        return dtype.lower()
    name = getattr(dtype, "name", None)
    if isinstance(name, str):
        return name
    name = getattr(dtype, "__name__", None)
    if isinstance(name, str):
        return name
    return str(dtype)


@dataclass(frozen=True)
class NvlsSpec:
    """NVLink SHARP of one scale-up domain's switch.

    `bandwidth` is the per-GPU NVLink bandwidth per direction (bytes/s); `derate` is the factor NCCL applies to
    NVLS bandwidth (0.85 Hopper, 0.74 Blackwell: src/graph/tuning.cc), so the switch delivers
    `bandwidth * derate` per GPU per direction when it reduces or multicasts.
    """

    enabled: bool
    bandwidth: float
    latency: float
    derate: float
    domain_size: int

    @property
    def effective_bandwidth(self) -> float:
        return self.bandwidth * self.derate

    def refusal(self, op: str, dtype: object) -> str | None:
        """None if the switch reduces `op` on `dtype`, else why not."""
        if not self.enabled:
            return "the domain's switch cannot reduce (no NVLS)"
        name = dtype_name(dtype)
        if op not in NVLS_OPS:
            return f"NVLS does not offload op {op!r} (offloaded: {', '.join(sorted(NVLS_OPS))})"
        if name not in NVLS_OPS[op]:
            return f"NVLS does not offload {op} on {name} (offloaded: {', '.join(sorted(NVLS_OPS[op]))})"
        return None

    def supports(self, op: str, dtype: object) -> bool:
        return self.refusal(op, dtype) is None

    def accumulator(self, dtype: object) -> str:
        """The dtype the switch accumulates in: float32 for 16-bit floats, the input dtype otherwise."""
        name = dtype_name(dtype)
        return "float32" if name in _F16 else name


@dataclass(frozen=True)
class SharpSpec:
    """InfiniBand SHARP of the fat-tree switches (one generation, with its limits as parameters).

    - `llt_trees` / `sat_trees`: aggregation trees per subnet (per fabric plane);
    - `sat_scope`: "switch" (one active SAT tree per switch, SHARPv2) or "port" (per port, SHARPv3);
    - `max_sat_flows`: SAT flows in parallel (None: not limited in the model);
    - `ost_size`: LLT payload per outstanding transaction (bytes); `ost_quota`: OSTs a job may hold at once
      (SHARP_COLL_JOB_QUOTA_OSTS);
    - `sat_threshold`: messages of at least this many bytes use SAT (SHARP_COLL_SAT_THRESHOLD), smaller use LLT;
    - `min_nodes`: groups with fewer fabric endpoints use host algorithms (NCCL: 2 nodes);
    - `accumulator`: "float32" (16-bit floats widened) or "input" (accumulate in the input dtype): undocumented
      by NVIDIA, hence a parameter; `sat_efficiency`: fraction of link rate SAT reaches (~0.95);
    - `multicast`: results come down by multicast (True) or unicast (False).
    """

    generation: str | None
    switch: str
    llt_trees: int
    sat_trees: int
    sat_scope: str
    max_sat_flows: int | None
    ost_size: int
    ost_quota: int
    sat_threshold: int
    min_nodes: int
    accumulator: str
    sat_efficiency: float
    multicast: bool
    v3_dtypes: bool

    @property
    def enabled(self) -> bool:
        return self.generation is not None

    @property
    def dtypes(self) -> frozenset[str]:
        return SHARP_DTYPES_V3 if self.v3_dtypes else SHARP_DTYPES_BASE

    def protocol(self, nbytes: int) -> str:
        """'sat' for streaming aggregation (large messages, if the generation has SAT), else 'llt'."""
        return "sat" if self.sat_trees > 0 and nbytes >= self.sat_threshold else "llt"

    def refusal(self, op: str, dtype: object) -> str | None:
        """None if the switches reduce `op` on `dtype`, else why not (the reason a builder reports)."""
        if not self.enabled:
            return "the fabric has no SHARP"
        name = dtype_name(dtype)
        if op not in SHARP_OPS:
            return f"SHARP does not offload op {op!r} (offloaded: {', '.join(sorted(SHARP_OPS))})"
        if name not in self.dtypes:
            extra = " (bfloat16, int8, uint8 need SHARPv3 datatypes)" if name in SHARP_DTYPES_V3 else ""
            return f"SHARP {self.generation} does not offload dtype {name}{extra}"
        return None

    def supports(self, op: str, dtype: object) -> bool:
        return self.refusal(op, dtype) is None

    def accumulator_dtype(self, dtype: object) -> str:
        name = dtype_name(dtype)
        return "float32" if self.accumulator == "float32" and name in _F16 else name


__all__ = ["NVLS_EFFICIENCY", "NVLS_EFFICIENCY_LARGE_DOMAIN", "NVLS_OPS", "SHARP_DTYPES_BASE", "SHARP_DTYPES_V3", "SHARP_GENERATIONS", "SHARP_OPS", "NvlsSpec",
           "SharpSpec", "dtype_name", "nvls_derate"]
