"""shm_program.StraightLine: the fixed programs `collectives calibrate` times with the plan runner's own
instructions (copies, fused reductions, and the counters a round publishes and waits on)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from collectives.transport import shm_program

pytestmark = pytest.mark.skipif(not shm_program.enabled(), reason="the C plan runner is not built")


def _kernel():
    kernel = shm_program.kernel_for(np.dtype(np.float32), "sum", 0)
    assert kernel is not None
    return kernel


def test_copies_and_reductions_run_in_order_over_the_given_ranges():
    x = np.arange(8, dtype=np.float32)
    own = np.zeros(8, np.float32)
    peer = np.full(8, 10, np.float32)
    steps = [("copy", 1, 0, 0, 4), ("reduce", 0, [0, 2], 4, 8), ("copy", 0, 2, 0, 2)]
    shm_program.StraightLine(steps, [x, own, peer], 4, _kernel())()
    assert own.tolist() == [0, 1, 2, 3, 0, 0, 0, 0]
    assert x.tolist() == [10, 10, 2, 3, 14, 15, 16, 17]


def test_publish_and_wait_count_from_the_pass_s_start():
    """A pass publishes base + k (base: the rank's counter when the pass starts) and waits for base + k: run
    twice, the counter ends at 2 x the last publish, and a wait on a rank that never publishes times out."""
    x = np.zeros(4, np.float32)
    mine, silent = np.zeros(1, np.int64), np.zeros(1, np.int64)
    line = shm_program.StraightLine([("publish", 1), ("wait", 0, 1), ("copy", 0, 0, 0, 4), ("publish", 3)],
                                    [x], 4, _kernel(), [mine, silent], 0)
    line()
    line()
    assert mine[0] == 6
    stuck = shm_program.StraightLine([("publish", 1), ("wait", 1, 1)], [x], 4, _kernel(), [mine, silent], 0)
    with pytest.raises(RuntimeError, match="rank 1 did not publish"):
        stuck(polls=8, timeout=0.05)


def test_publish_and_wait_need_counters():
    with pytest.raises(ValueError, match="publish/wait with counters"):
        shm_program.StraightLine([("wait", 0, 1)], [np.zeros(1, np.float32)], 4, _kernel())


def _cpu_share_of_a_wait(monkeypatch, nap_after_ns: int, wait_s: float = 0.3) -> float:
    """CPU time the waiting thread spent over the wall time of a yielding wait that a second thread ends after
    `wait_s` (the C call releases the GIL, so the other thread runs meanwhile)."""
    monkeypatch.setattr(shm_program, "NAP_AFTER_NS", nap_after_ns)
    mine, peer = np.zeros(1, np.int64), np.zeros(1, np.int64)
    line = shm_program.StraightLine([("wait", 1, 1)], [np.zeros(1, np.float32)], 4, _kernel(), [mine, peer], 0)
    publisher = threading.Timer(wait_s, lambda: peer.__setitem__(0, 1))
    wall, cpu = time.perf_counter(), time.thread_time()
    publisher.start()
    line(polls=1024, yield_cpu=1, timeout=10.0)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    publisher.join()
    assert wall >= wait_s * 0.9, "the wait passed before the peer published"
    return cpu / wall


def test_a_long_yielding_wait_sleeps_and_leaves_the_core_to_others(monkeypatch):
    """Ranks that share cores yield between polls; once a wait has lasted NAP_AFTER_NS the runner sleeps between
    polls instead (a yielding rank still took a share of a working core-mate's core). Yielding on an idle CPU
    costs the waiter the whole wait in CPU time; napping leaves most of it to others (here ~0.2 of the wall time
    is spent napping's system calls, 20 us naps on a VM)."""
    napping = _cpu_share_of_a_wait(monkeypatch, 1_000_000)
    never = _cpu_share_of_a_wait(monkeypatch, 0)  # 0: never nap
    later = _cpu_share_of_a_wait(monkeypatch, 10_000_000_000)  # a threshold the wait never reaches
    assert napping < 0.5
    assert never > 2 * napping and later > 2 * napping, (napping, never, later)


def test_a_wait_s_clock_runs_across_resumes_and_restarts_with_the_call():
    """The runner returns to the caller's waiter after `polls` polls and resumes at the wait (ip 0 when the
    program begins with one): the time the wait began must survive the resume (or no wait would ever last long
    enough to sleep), and a new call or a passed wait starts the clock again."""
    from collectives._ckernels import lib

    mine, peer = np.zeros(1, np.int64), np.zeros(1, np.int64)
    line = shm_program.StraightLine([("wait", 1, 1)], [np.zeros(1, np.float32)], 4, _kernel(), [mine, peer], 0)
    call = line.call
    assert lib.coll_plan_run(call, 1, 1, 1) == 1 and call.ip == 0
    began = call.wait_since_ns
    assert began > 0
    assert lib.coll_plan_run(call, 1, 1, 0) == 1
    assert call.wait_since_ns == began  # resumed, not restarted
    assert lib.coll_plan_run(call, 1, 1, 1) == 1
    assert call.wait_since_ns > began  # a new call
    peer[0] = 1
    assert lib.coll_plan_run(call, 1, 1, 0) == 0
    assert call.wait_since_ns == 0 and call.events == 1


@pytest.mark.parametrize("value", ["soon", "-5"])
def test_a_bad_nap_setting_names_the_variable(value):
    env = {**os.environ, "COLLECTIVES_NAP_AFTER_US": value}
    run = subprocess.run([sys.executable, "-c", "import collectives.transport.shm_program"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert f"COLLECTIVES_NAP_AFTER_US={value!r}" in run.stderr and "microseconds" in run.stderr
