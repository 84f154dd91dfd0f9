"""The tables people already parse: nccl-tests' (src/common.cu) and OSU's (osu_allreduce & co.).

nccl-tests row: `%12li  %12li  %8s  %6s  %6i` (size, count, type, redop, root) then, out-of-place and in-place,
`  %7s  %6.2f  %6.2f  %5s` (time us, algbw, busbw GB/s, #wrong). Our extra columns come *after* the in-place
#wrong, so whitespace-splitting parsers find the 13 standard fields where they expect them: with --predict the
predicted time of the in-place call (us, or n/a; out-of-place for collectives without an in-place form) and
its error (prediction / measured time - 1), then the algorithm (`auto->ring` when auto chose ring). The header
keeps nccl-tests' fields that mean something here (not `agg iters` or `graph`: no such options); the footer
averages bus bandwidth per algorithm (an average over algorithms would mean nothing).
"""

from __future__ import annotations

import math

# nccl-tests' names for the dtypes and ops it knows (src/common.cu test_typenames / test_opnames)
NCCL_TYPE_NAMES = {"int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32", "int64": "int64",
                   "uint64": "uint64", "float16": "half", "float32": "float", "float64": "double",
                   "bfloat16": "bfloat16", "int16": "int16", "uint16": "uint16"}
# -d accepts nccl-tests' names and numpy's
DTYPE_ALIASES = {"half": "float16", "fp16": "float16", "float": "float32", "fp32": "float32", "double": "float64",
                 "fp64": "float64", "bf16": "bfloat16", "char": "int8", "int": "int32", "uint": "uint32"}
BUS_FACTOR = {"allreduce": lambda p: 2 * (p - 1) / p, "reduce_scatter": lambda p: (p - 1) / p,
              "allgather": lambda p: (p - 1) / p, "broadcast": lambda p: 1.0, "reduce": lambda p: 1.0}
OSU_NAMES = {"allreduce": "Allreduce", "reduce_scatter": "Reduce_scatter", "allgather": "Allgather",
             "broadcast": "Broadcast", "reduce": "Reduce"}
REDUCING = ("allreduce", "reduce_scatter", "reduce")
ROOTED = ("broadcast", "reduce")


def bandwidths(collective: str, nbytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s, nccl-tests' definitions (doc/PERFORMANCE.md)."""
    if not seconds or seconds <= 0 or not math.isfinite(seconds):
        return 0.0, 0.0
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * BUS_FACTOR[collective](world_size)


def time_str(us: float) -> str:
    """nccl-tests: %7.0f from 10 ms, %7.1f from 100 us, else %7.2f."""
    if us >= 10000.0:
        return f"{us:7.0f}"
    if us >= 100.0:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


def header(*, collective: str, world_size: int, min_bytes: int, max_bytes: int, step: str, warmup: int,
           iters: int, check: int, stat: str, hosts: list[tuple[int, int, str]], predict: str | None,
           comm_check: str | None = None, predicted_column: str = "in-place") -> list[str]:
    """nccl-tests' opening comment block, then the two column-title lines."""
    lines = [f"# collectives bench {collective}: nranks {world_size} minBytes {min_bytes} maxBytes {max_bytes} "
             f"step: {step} warmup iters: {warmup} iters: {iters} validation: {check}",
             "#",
             f"# time = {stat} over iterations of the slowest rank (barrier before each iteration)",
             "# algorithm column: native = MPI's own collective; auto->X = the transport's choice X",
             ]
    if comm_check is not None:
        lines.append(f"# call agreement: {comm_check} (collectives.init(check=...), --comm-check; 'off' measures the "
                     "collective alone, as MPI's)")
    if predict:
        lines.append(f"# pred(us) = predicted time of the {predicted_column} call, from the calibration in {predict}; "
                     f"err = pred / {predicted_column} time - 1 (n/a: MPI's own collective, not simulated)")
    lines += ["#", "# Using devices"]
    lines += [f"#  Rank {r:2d} Group  0 Pid {pid:6d} on {host:>10} device  0 [cpu] host memory" for r, pid, host in hosts]
    lines.append("#")
    extra_t = "  pred(us)      err" if predict else ""
    lines.append("#                                                              out-of-place                       "
                 "in-place          ")
    lines.append("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
                 f"algbw   busbw #wrong{extra_t}  algorithm")
    lines.append("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  "
                 "(GB/s)  (GB/s)       ")
    return lines


def _half(res: dict | None) -> str:
    if res is None:
        return f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>5}"
    wrong = "N/A" if res["wrong"] is None else str(res["wrong"])
    return f"  {time_str(res['time_us'])}  {res['algbw']:6.2f}  {res['busbw']:6.2f}  {wrong:>5}"


def row(*, nbytes: int, count: int, type_name: str, redop: str, root: int, out_of_place: dict | None,
        in_place: dict | None, algorithm: str, predicted_us: float | None | str = None, predict: bool = False,
        error: float | None = None) -> str:
    line = f"{nbytes:12d}  {count:12d}  {type_name:>8}  {redop:>6}  {root:6d}"
    line += _half(out_of_place) + _half(in_place)
    if predict:
        if isinstance(predicted_us, (int, float)):
            line += f"  {time_str(predicted_us):>8}"
        else:
            line += f"  {'n/a':>8}"
        line += f"  {error_str(error):>7}"
    return line + f"  {algorithm}"


def error_str(error: float | None) -> str:
    """+12%, -40%, x3.4 beyond +100% (a factor reads better than +240%), n/a."""
    if error is None or not math.isfinite(error):
        return "n/a"
    if error > 1:
        return f"x{error + 1:.1f}"
    return f"{error * 100:+.0f}%"


WITHIN = 0.25  # a prediction within 25% of the measured time counts as right


def prediction_summary(errors: dict[str, list[float]], column: str) -> list[str]:
    """The closing verdict on the predictions: how many rows fell within 25%, overall and per algorithm."""
    every = [e for v in errors.values() for e in v]
    if not every:
        return ["# Predictions          : none (only MPI's own collective ran, or the world has one rank)"]
    ok = sum(abs(e) <= WITHIN for e in every)
    lines = [f"# Predictions          : {ok} of {len(every)} sizes x algorithms within {WITHIN:.0%} of the {column} "
             "time"]
    for name, v in errors.items():
        lines.append(f"#   {name:<22}: {sum(abs(e) <= WITHIN for e in v)} of {len(v)} within {WITHIN:.0%}, "
                     f"median error {error_str(sorted(v)[len(v) // 2])}, worst {error_str(max(v, key=abs))}")
    return lines


def footer(wrong_total: int, per_algorithm: dict[str, float]) -> list[str]:
    """nccl-tests' closing lines, the bus bandwidth averaged per algorithm (over its sizes and both columns)."""
    lines = [f"# Out of bounds values : {wrong_total} {'OK' if wrong_total == 0 else 'FAILED'}"]
    for name, bw in per_algorithm.items():
        lines.append(f"# Avg bus bandwidth    : {bw:g} {name}")
    lines.append("#")
    return lines


def osu_header(collective: str, full: bool) -> list[str]:
    title = f"# OSU MPI {OSU_NAMES[collective]} Latency Test (collectives bench)"
    cols = "# Size       Avg Latency(us)"
    if full:
        cols += "   Min Latency(us)   Max Latency(us)  Iterations"
    return [title, cols]


def osu_row(nbytes: int, avg_us: float, min_us: float, max_us: float, iters: int, full: bool) -> str:
    line = f"{nbytes:<10d}{avg_us:18.2f}"
    if full:
        line += f"{min_us:18.2f}{max_us:18.2f}{iters:12d}"
    return line
