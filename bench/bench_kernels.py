"""Benchmark collectives.kernels.reduce_into against numpy, and each backend per dtype.

    python bench/bench_kernels.py [--size N] [--repeat R] [--threads T] [--check] [--sweep]

Prints a markdown table per case: ours vs numpy's natural equivalent, timed as R interleaved pairs
(ours, numpy, ours, numpy, ...) after a warmup, so both sides see the same machine noise. The reported
ratio is the median over the R pairs of (numpy time / ours time) -- robust to a noisy shared machine,
where one lucky or unlucky run cannot flip pass/fail -- next to the best-of-R times and their ratio.
GB/s columns count the bytes each side really moves (reads + writes; numpy's chained adds move
3 * (k - 1) arrays, ours k + 1), beside the machine's copy rate (np.copyto, read + write).
--check exits 1 when a gated target is missed (rows with target "info" are reported, not gated).
--threads T splits each large reduction over T threads (default: collectives.kernels' default, the CPUs
available, at most 8; numpy is single-threaded either way); --threads 1 measures one core.
--sweep adds a per-dtype table of backends (c, numba, numpy) for the 2-input and 8-input sums, the
measurement behind the backend choice in collectives/kernels/__init__.py.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import ml_dtypes
import numpy as np

from collectives import kernels
from collectives.kernels import SUPPORTED_DTYPES, _use_backend, reduce_into


def best_time(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warmup (page faults, JIT compilation)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def paired(ours: Callable[[], object], theirs: Callable[[], object], repeat: int) -> tuple[float, float, float]:
    """Interleaved timing: (median of per-pair ratios theirs/ours, best ours, best theirs)."""
    ours(), theirs()  # warmup
    ratios, best_o, best_t = [], float("inf"), float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        ours()
        t1 = time.perf_counter()
        theirs()
        t2 = time.perf_counter()
        ratios.append((t2 - t1) / (t1 - t0))
        best_o, best_t = min(best_o, t1 - t0), min(best_t, t2 - t1)
    return statistics.median(ratios), best_o, best_t


def make_inputs(dtype: np.dtype, n_inputs: int, size: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(size, dtype=np.float32).astype(dtype) if dtype.kind in "fV"
            else rng.integers(-50, 50, size).astype(dtype) for _ in range(n_inputs)]


def chained_numpy(out: np.ndarray, inputs: list[np.ndarray]) -> None:
    """numpy's best plain way: ((a + b) + c) + ... with in-place adds into out."""
    np.add(inputs[0], inputs[1], out=out)
    for x in inputs[2:]:
        np.add(out, x, out=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=16 * 2**20, help="elements per array (default 16M)")
    parser.add_argument("--repeat", type=int, default=21,
                        help="interleaved (ours, numpy) pairs per case, median ratio reported (>= 15)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads per large reduction (default: the kernels' default, CPUs available)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    parser.add_argument("--sweep", action="store_true", help="also time every backend per dtype")
    args = parser.parse_args(argv)
    n, rep = args.size, max(15, args.repeat)
    if args.threads is not None:
        kernels.set_threads(args.threads)

    big = np.ones(n * 2, np.float64)  # 16 bytes per element, bigger than any cache
    dst = np.empty_like(big)
    t_copy = best_time(lambda dst=dst, big=big: np.copyto(dst, big), rep)
    memcpy_gbs = 2 * big.nbytes / t_copy / 1e9
    del big, dst

    info = kernels.backend_info()
    print(f"size {n} elements, {rep} interleaved pairs per case, {info['threads']} kernel thread(s) per call; "
          f"cpu path: {info['cpu_path']}"
          f"{' (+avx512 bf16)' if info.get('cpu_avx512') else ''}; np.copyto {memcpy_gbs:.1f} GB/s\n")
    print("| case | ours best (ms) | numpy best (ms) | best ratio | median ratio | target | pass "
          "| GB/s ours | GB/s numpy |")
    print("|---|---|---|---|---|---|---|---|---|")
    failed = False
    f32, f16, bf16 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
    # (label, dtype, inputs, layout, target or None for info rows). Layouts:
    #   "inplace": reduce_into(a, [a, b])       vs np.add(a, b, out=a)
    #   "out":     reduce_into(c, [a, b])       vs np.add(a, b, out=c)
    #   "chained": reduce_into(out, xs)         vs chained_numpy(out, xs)  (executor: out separate)
    #   "chained_inplace": reduce_into(xs[0], xs) vs chained_numpy(xs[0], xs)
    cases = [
        ("float32 2-input sum, in place vs np.add(a, b, out=a)", f32, 2, "inplace", 1.0),
        ("float16 2-input sum, in place vs np.add(a, b, out=a)", f16, 2, "inplace", 25.0),
        ("bfloat16 2-input sum, in place vs np.add(a, b, out=a)", bf16, 2, "inplace", 7.0),
        ("float32 8-input sum, out separate vs chained np.add", f32, 8, "chained", 2.0),
        ("float32 8-input sum, out is x0 vs chained np.add into x0", f32, 8, "chained_inplace", None),
        ("float32 2-input sum, out separate vs np.add(a, b, out=c)", f32, 2, "out", None),
    ]
    for label, dtype, k, layout, target in cases:
        xs = make_inputs(dtype, k, n)
        out = np.empty_like(xs[0])
        if layout == "inplace":
            a, b = xs[0].copy(), xs[1]
            ours, theirs = (lambda a=a, b=b: reduce_into(a, [a, b])), (lambda a=a, b=b: np.add(a, b, out=a))
            ours_bytes, np_bytes = 3, 3
        elif layout == "out":
            a, b = xs
            ours = lambda a=a, b=b, out=out: reduce_into(out, [a, b])  # noqa: E731
            theirs = lambda a=a, b=b, out=out: np.add(a, b, out=out)  # noqa: E731
            ours_bytes, np_bytes = 3, 3
        else:
            o = out if layout == "chained" else xs[0]
            ours = lambda o=o, xs=xs: reduce_into(o, xs)  # noqa: E731
            theirs = lambda o=o, xs=xs: chained_numpy(o, xs)  # noqa: E731
            ours_bytes, np_bytes = k + 1, 3 * (k - 1)
        ratio, t_ours, t_np = paired(ours, theirs, rep)
        if target is None:
            tgt, verdict = "info", "-"
        else:
            ok = ratio >= target
            failed |= not ok
            tgt, verdict = f">= {target:g}x", "pass" if ok else "FAIL"
        nbytes = xs[0].nbytes
        print(f"| {label} | {t_ours * 1e3:.2f} | {t_np * 1e3:.2f} | {t_np / t_ours:.2f}x | {ratio:.2f}x | {tgt} "
              f"| {verdict} | {ours_bytes * nbytes / t_ours / 1e9:.1f} | {np_bytes * nbytes / t_np / 1e9:.1f} |")
        del xs, out

    if args.sweep:
        backends = ["c", "numba", "numpy"] if kernels.backend_info()["c_loaded"] else ["numba", "numpy"]
        print("\nPer-dtype backend sweep: GB/s (reads + writes) of reduce_into(out, inputs, 'sum')\n")
        print("| dtype | inputs | " + " | ".join(backends) + " | numpy chained add |")
        print("|---|---|" + "---|" * (len(backends) + 1))
        for dtype in SUPPORTED_DTYPES:
            for k in (2, 8):
                xs = make_inputs(dtype, k, n // 4)
                out = np.empty_like(xs[0])
                nbytes = (k + 1) * xs[0].nbytes
                row = []
                for be in backends:
                    with _use_backend(be):
                        t = best_time(lambda out=out, xs=xs: reduce_into(out, xs), max(3, rep // 2))
                    row.append(f"{nbytes / t / 1e9:.1f}")
                t = best_time(lambda out=out, xs=xs: chained_numpy(out, xs), max(3, rep // 2))
                row.append(f"{(3 * (k - 1)) * xs[0].nbytes / t / 1e9:.1f} ({nbytes / t / 1e9:.1f} eff.)")
                print(f"| {dtype.name} | {k} | " + " | ".join(row) + " |")
    return 1 if (failed and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
