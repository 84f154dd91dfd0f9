"""Schedule speed: verify() of ring allreduce at 1,024 ranks, and one rank's program at up to 331,776 ranks.

    python bench/bench_schedule.py            # print both tables
    python bench/bench_schedule.py --check    # also exit 1 if verify at 1,024 ranks misses its 10 s target

(a) `collectives.verify` expands all 1,024 programs (4 * 1,023 ops each) and executes them symbolically;
    the target (issue 3) is at most 10 s.
(b) `Schedule.program(node)` for one rank must cost time linear in that rank's own operations: a ring rank
    sends 2(p-1) messages and receives 2(p-1), so the time per operation should stay roughly constant from
    1k to 331,776 ranks. "cold" builds the schedule and the first program (including the phase's node
    index, built once per phase); "warm" is a second rank's program of the same schedule.
"""

from __future__ import annotations

import argparse
import sys
import time

from collectives import algorithms, verify

VERIFY_TARGET_S = 10.0


def best_of(repeats: int, fn) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def bench_verify(world_size: int, count: int, repeats: int) -> float:
    schedule = algorithms.build("ring", collective="allreduce", world_size=world_size, count=count)
    seconds, report = best_of(repeats, lambda: verify(schedule))
    print(f"(a) verify ring allreduce, {world_size} ranks, count={count}: {seconds:.2f} s "
          f"(target <= {VERIFY_TARGET_S:.0f} s) -- {report.summary()}")
    return seconds


def bench_program(world_sizes: list[int], repeats: int) -> list[tuple[int, int, float, float]]:
    print("(b) one rank's program of ring allreduce (chunks=1)")
    print(f"    {'ranks':>9} {'sends':>9} {'ops':>10} {'cold s':>9} {'warm s':>9} {'warm ns/op':>11} "
          f"{'cold ns/op':>11}")
    rows = []
    for p in world_sizes:
        def cold(p=p):
            schedule = algorithms.build("ring", collective="allreduce", world_size=p, count=p)
            return schedule, schedule.program(p // 2)

        cold_s, (schedule, prog) = best_of(repeats, cold)
        warm_s, prog = best_of(repeats, lambda s=schedule, node=p // 3: s.program(node))
        ops = len(prog)
        sends = 2 * (p - 1)
        assert ops == 2 * sends, (ops, sends)
        rows.append((p, ops, cold_s, warm_s))
        print(f"    {p:>9} {sends:>9} {ops:>10} {cold_s:>9.4f} {warm_s:>9.4f} {warm_s / ops * 1e9:>11.1f} "
              f"{cold_s / ops * 1e9:>11.1f}")
    big = rows[1:] or rows  # the smallest size is dominated by fixed per-call overhead
    per_op = [t / ops * 1e9 for _, ops, c, w in big for t in (c, w)]
    print(f"    from {big[0][0]} ranks on, {big[0][1]}..{big[-1][1]} ops: {min(per_op):.1f}..{max(per_op):.1f} ns "
          "per op (linear when this range stays narrow)")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if verify misses its 10 s target")
    parser.add_argument("--verify-ranks", type=int, default=1024)
    parser.add_argument("--verify-count", type=int, default=1 << 20, help="elements per rank (default 1Mi)")
    parser.add_argument("--world-sizes", default="1024,10000,100000,331776")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    seconds = bench_verify(args.verify_ranks, args.verify_count, max(1, args.repeats - 2))
    bench_program([int(x) for x in args.world_sizes.split(",")], args.repeats)
    if args.check and seconds > VERIFY_TARGET_S:
        print(f"FAIL: verify took {seconds:.2f} s > {VERIFY_TARGET_S:.0f} s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
