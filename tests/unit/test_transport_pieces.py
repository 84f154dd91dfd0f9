"""Pieces of the MPI transport that need no launcher: measured decisions, auto's choice, the validator, the
lowering of a rank's shared-memory plan, and the one-rank warning."""

from __future__ import annotations

import json

import numpy as np
import pytest

from collectives import algorithms, decisions
from collectives.transport import calls, choose
from collectives.transport.host import Host, warn_if_alone
from collectives.transport.shm import program
from collectives.transport.shm.plan import ShmPlan, direct_messages

HOST2 = Host(ranks_per_host=2, cores=2, one_host=True, hosts=1)
HOST4 = Host(ranks_per_host=4, cores=2, one_host=True, hosts=1)


def _doc(*tables) -> dict:
    return decisions.document(list(tables), "test")


def test_a_table_picks_the_first_row_above_the_size(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(_doc({"collective": "allreduce", "transport": "shm", "ranks": 2,
                                     "oversubscribed": False,
                                     "rows": [[4096, "one_shot", {}], [1 << 20, "ring", {}],
                                              [None, "ring", {"chunks": 8}]]})))
    pick = lambda n: decisions.lookup("allreduce", n, transport="shm", ranks=2, oversubscribed=False,  # noqa: E731
                                      path=str(path))
    assert pick(8).algorithm == "one_shot" and pick(4095).algorithm == "one_shot"
    assert pick(4096).algorithm == "ring" and pick(4096).params == {}
    assert pick(64 << 20).params == {"chunks": 8} and pick(64 << 20).span.startswith(">=")
    assert decisions.lookup("broadcast", 8, transport="shm", ranks=2, oversubscribed=False, path=str(path)) is None


def test_the_nearest_rank_count_of_the_same_oversubscription_serves(tmp_path):
    path = tmp_path / "d.json"
    rows = lambda name: [[None, name, {}]]  # noqa: E731
    path.write_text(json.dumps(_doc(
        {"collective": "allreduce", "transport": "shm", "ranks": 2, "oversubscribed": False, "rows": rows("a2")},
        {"collective": "allreduce", "transport": "shm", "ranks": 4, "oversubscribed": True, "rows": rows("a4")},
        {"collective": "allreduce", "transport": "shm", "ranks": 8, "oversubscribed": True, "rows": rows("a8")})))
    look = lambda r, o: decisions.lookup("allreduce", 8, transport="shm", ranks=r, oversubscribed=o,  # noqa: E731
                                         path=str(path)).algorithm
    assert look(3, False) == "a2" and look(3, True) == "a4" and look(6, True) == "a8" and look(16, True) == "a8"


@pytest.mark.parametrize("bad,match", [({"format": "other"}, "not a decisions file"),
                                       (_doc({"collective": "allreduce"}), "malformed"),
                                       (_doc({"collective": "allreduce", "transport": "shm", "ranks": 2,
                                              "oversubscribed": False, "rows": [[8, "a", {}], [4, "b", {}]]}),
                                        "strictly increasing")])
def test_bad_decision_files_say_what_is_wrong(tmp_path, bad, match):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=match):
        decisions.tables(str(path))


def test_a_missing_decisions_file_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="collectives calibrate --decisions"):
        decisions.tables(str(tmp_path / "nope.json"))


def test_the_default_decisions_load_and_cover_every_collective():
    covered = {t.collective for t in decisions.tables()}
    assert {"allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"} <= covered


def test_auto_reads_the_decisions_and_says_why(monkeypatch, tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(_doc({"collective": "allreduce", "transport": "shm", "ranks": 2,
                                     "oversubscribed": False, "rows": [[1024, "native", {}], [None, "ring", {}]]})))
    monkeypatch.setenv("COLLECTIVES_DECISIONS", str(path))
    small = choose.auto("allreduce", 8, np.dtype(np.float32), 2, HOST2, True)
    assert small.algorithm == "native" and "MPI's own" in small.reason and str(path) in small.reason
    # MPI cannot reduce bfloat16: the library's schedule instead, and the reason says so
    import ml_dtypes
    bf = choose.auto("allreduce", 8, np.dtype(ml_dtypes.bfloat16), 2, HOST2, True)
    assert bf.algorithm != "native" and "bfloat16" in bf.reason
    assert choose.auto("allreduce", 1 << 20, np.dtype(np.float32), 2, HOST2, True).algorithm == "ring"
    assert choose.auto("allreduce", 8, np.dtype(np.float32), 1, HOST2, True).algorithm == "copy"


def test_auto_is_the_one_chooser_reading_measurements_as_data(monkeypatch, tmp_path):
    """Where no measurement covers a call (here: no allgather table) the one chooser prices the schedules that
    need no topology on the host's model, and COLLECTIVES_ALGO filters the transport's auto as it filters
    simulate's."""
    from collectives import choice

    path = tmp_path / "d.json"
    path.write_text(json.dumps(_doc({"collective": "allreduce", "transport": "shm", "ranks": 2,
                                     "oversubscribed": False, "rows": [[None, "ring", {}]]})))
    monkeypatch.setenv("COLLECTIVES_DECISIONS", str(path))
    three = choose.auto("allgather", 1 << 20, np.dtype(np.float32), 3, HOST2, True)
    model = choice.select("allgather", 1 << 20, choose.host_model(3),
                          candidates=[n for n in algorithms.names("allgather")
                                      if not algorithms.info(n).needs_topology])
    assert (three.algorithm, three.params) == model[:2]
    assert "no measurement covers this call" in three.reason and "analytic model" in three.reason
    monkeypatch.setenv("COLLECTIVES_ALGO", "allreduce:^ring")
    choice._choose.cache_clear()
    not_ring = choose.auto("allreduce", 1 << 20, np.dtype(np.float32), 2, HOST2, True)
    assert not_ring.algorithm != "ring" and "COLLECTIVES_ALGO excludes ring" in not_ring.reason


def test_named_algorithms_are_checked():
    with pytest.raises(ValueError, match="valid algorithms"):
        choose.requested("allreduce", "nope", np.dtype(np.float32), {})
    with pytest.raises(ValueError, match="does not implement allgather"):
        choose.requested("allgather", "rabenseifner", np.dtype(np.float32), {})
    import ml_dtypes
    with pytest.raises(TypeError, match="bfloat16"):
        choose.requested("allreduce", "native", np.dtype(ml_dtypes.bfloat16), {})
    with pytest.raises(ValueError, match="deterministic"):
        choose.deterministic("allreduce", "ring", {}, True)


def test_the_validator_names_what_is_wrong():
    x = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="multiple of the world size"):
        calls.check_call("alltoall", np.ones(7), "sum", None, 2, None)
    with pytest.raises(ValueError, match="root must be an integer in"):
        calls.check_call("broadcast", x, "sum", 3, 2, None)
    with pytest.raises(ValueError, match="out must have 16 elements"):
        calls.check_buffers("allgather", x, np.empty(8, np.float32), 2)
    with pytest.raises(ValueError, match="overlaps x"):
        calls.check_buffers("allreduce", x[:4], x[2:6], 2)
    with pytest.raises(ValueError, match="2 integers >= 0"):
        calls.check_split([1, -1], 2, "send_counts")
    with pytest.raises(TypeError, match="integers"):
        calls.check_split([1.5, 2], 2, "send_counts")
    assert calls.output_shape("reduce_scatter", (6, 3), 2) == (3, 3)
    assert calls.output_shape("allgather", (2, 3), 4) == (8, 3)


def test_the_quick_check_sends_unusual_buffers_to_the_validator():
    x = np.ones(8, np.float32)
    assert calls.buffers_fit(x, None, calls.NEW, 8)
    assert calls.buffers_fit(x, np.empty(8, np.float32), calls.SEPARATE, 8)
    assert not calls.buffers_fit(x, np.empty(8, np.float64), calls.SEPARATE, 8)
    assert not calls.buffers_fit(np.ones(16, np.float32)[::2], None, calls.NEW, 8)
    view = np.ones(16, np.float32)
    assert not calls.buffers_fit(view[:8], view[4:12], calls.SEPARATE, 8)  # overlapping views


def test_the_lowering_checks_every_peer_and_reads_a_peer_at_its_end_of_the_message():
    s = algorithms.build("pairwise", collective="alltoall", world_size=3, count=6)
    prog = program.compile_plan(ShmPlan.build(s, 1), 4, lazy=False)
    words = prog.code.tolist()
    assert words[-2:] == [program.CHECK_ALL, program.END]
    # rank 1 receives rank 0's block for it: rank 0 sends from its input region (element 1*2 = 2), and rank 1
    # lands it in its output region (6 + 0*2 = 6): the copy reads the peer's window at the peer's offset
    copies = [words[i:i + 6] for i in range(len(words) - 5) if words[i] == program.COPY
              and words[i + 3] == program.WINDOW + 0]
    assert [6 * 4, 2 * 4, 2 * 4] in [[c[2], c[4], c[5]] for c in copies]


def _instructions(code: list[int]) -> list[list[int]]:
    """A program's words cut into instructions (csrc/plan.h: the operand count of each)."""
    width = {program.END: 1, program.CHECK_ALL: 1, program.WAIT_DONE: 3, program.WAIT_READ: 3, program.COPY: 6,
             program.PUBLISH: 2, program.SET_READ: 2, program.PEER_READ: 6}
    out, i = [], 0
    while i < len(code):
        n = 5 + 2 * code[i + 4] if code[i] == program.REDUCE else width[code[i]]
        out.append(code[i:i + n])
        i += n
    return out


def test_the_lowering_reads_the_input_where_it_lies_and_writes_the_output_last():
    """An alltoall's input region read from the caller's input (SOURCE offsets shifted to its start) and its
    output region copied into the caller's output after the agreement, or kept there throughout: the binding
    copies nothing."""
    s = algorithms.build("pairwise", collective="alltoall", world_size=3, count=6)
    splan = ShmPlan.build(s, 1)
    src, dst = s.input_range(1), s.output_range(1)
    code = _instructions(program.compile_plan(splan, 4, True, tuple(src), tuple(dst)).code.tolist())
    assert code[-3:] == [[program.CHECK_ALL], [program.COPY, program.OUT, 0, program.WORK, dst[0] * 4,
                                               (dst[1] - dst[0]) * 4], [program.END]]
    reads = [c for c in code if c[0] == program.COPY and c[3] == program.SOURCE]
    assert reads and all(0 <= c[4] and c[4] + c[5] <= (src[1] - src[0]) * 4 for c in reads)
    # out_direct: the output region is the caller's output throughout, so the receives land there (OUT at the
    # region's offsets) and nothing is copied at the end; the unobserved input region is not copied back
    direct = _instructions(program.compile_plan(splan, 4, True, tuple(src), tuple(dst), out_direct=True)
                           .code.tolist())
    assert direct[-2:] == [[program.CHECK_ALL], [program.END]]
    landings = [c[1:3] for c in direct if c[0] == program.COPY and c[3] >= program.WINDOW]
    assert sorted(landings) == [[program.OUT, 0], [program.OUT, 8], [program.OUT, 16]]
    assert not any(c[0] == program.COPY and c[1] == program.WORK for c in direct)
    # an input range that leaves out what the schedule reads before writing it cannot be placed
    with pytest.raises(program.UnplacedInput, match="outside"):
        program.compile_plan(splan, 4, True, (src[0] + 2, src[1]), tuple(dst))
    # an allgather's own block: the ring sends it first and keeps it, both read at offset 0 of the input
    g = algorithms.build("ring", collective="allgather", world_size=3, count=6)
    code = _instructions(program.compile_plan(ShmPlan.build(g, 2), 4, True, (12, 18), None).code.tolist())
    assert [c[4] for c in code if c[0] == program.COPY and c[3] == program.SOURCE] == [0, 0]
    # a reduce_scatter's block: the last landing (a fused reduce) writes the caller's output at offset 0
    r = algorithms.build("ring", collective="reduce_scatter", world_size=3, count=6)
    code = _instructions(program.compile_plan(ShmPlan.build(r, 0), 4, True, None, (0, 2), out_direct=True)
                         .code.tolist())
    assert [c[1:3] for c in code if c[0] == program.REDUCE][-1] == [program.OUT, 0]


def test_single_copy_messages_are_the_unchanged_ranges_stored_as_they_are():
    """direct_messages: a message of at least min_bytes whose range the sender never writes during the call and
    the receiver stores as it is (shm/plan.py); only those."""
    a2a = algorithms.build("pairwise", collective="alltoall", world_size=4, count=4 * 1024)
    sends = [(o.round, v, o.peer, o.start) for v in range(4) for o in a2a.program(v) if o.kind == 0]
    assert direct_messages(a2a, 4, 4096) == frozenset(sends)  # every block comes from the input region
    assert direct_messages(a2a, 4, 4097) == frozenset()  # 1,024-element blocks of 4 bytes: under the size
    assert direct_messages(a2a, 4, 0) == frozenset()
    ring = algorithms.build("ring", collective="allgather", world_size=4, count=4 * 1024)
    direct = direct_messages(ring, 4, 4096)
    # each rank's own block, sent in the first round; the blocks it forwards were written by a receive
    assert direct == {(0, v, (v + 1) % 4, v * 4096) for v in range(4)}  # count: per rank
    reduce_scatter = algorithms.build("ring", collective="reduce_scatter", world_size=4, count=4 * 1024)
    assert direct_messages(reduce_scatter, 4, 1) == frozenset()  # every landing reduces
    # broadcast one_shot: the root keeps nothing in its window and waits for its three readers at the end; a
    # receiver reads the root's memory at the root's offset
    b = algorithms.build("one_shot", collective="broadcast", world_size=4, count=8192, root=2)
    direct = direct_messages(b, 4, 4096)
    root = ShmPlan.build(b, 2, direct)
    assert root.readers == (0, 1, 3) and not root.writes_window
    code = _instructions(program.compile_plan(root, 4, False).code.tolist())
    assert code[-5:-2] == [[program.WAIT_READ, q, root.total] for q in (0, 1, 3)]
    leaf = _instructions(program.compile_plan(ShmPlan.build(b, 0, direct), 4, False).code.tolist())
    assert [program.PEER_READ, program.WORK, 0, 2, 0, 8192 * 4] in leaf
    assert not any(c[0] == program.COPY for c in leaf)
    # a lazy sender's single-copy ranges must lie in its input (else it keeps copying)
    a2a_direct = direct_messages(a2a, 4, 4096)
    with pytest.raises(program.UnplacedInput):
        program.compile_plan(ShmPlan.build(a2a, 1, a2a_direct), 4, True, (0, 1024), None)


def test_calls_alternate_window_halves_and_wait_for_the_readers_of_theirs():
    """Double-buffered windows (csrc/plan.h): a call that fits in half a window writes half seq & 1 once the peers
    are done with the last call that wrote that half; a call that does not fit takes the whole window and waits
    for both; a mismatch's restart frees everything."""
    from types import SimpleNamespace

    from collectives.transport.shm import arena as _arena

    a = _arena.Arena.__new__(_arena.Arena)
    a.rank, a.size = 0, 2
    a.ctrl = [np.zeros(_arena.CTRL_WORDS, np.int64) for _ in range(2)]
    a.ctrl_segments = SimpleNamespace(sync=lambda: None)
    assert a.reserve(1, 2048, 3) == (2048, 0)  # call 1: half 1, free from the start
    assert a.reserve(2, 2048, 6) == (0, 0)  # call 2: half 0, while the peers may still read call 1
    assert a.reserve(3, 2048, 9) == (2048, 3)  # call 3: half 1 again once they are done with call 1
    assert a.reserve(4, 0, 12) == (0, 9)  # a call that needs the whole window waits for both halves
    assert a.reserve(5, 2048, 15) == (2048, 12)
    a.resynchronise(20)  # a stopped call's reservation (15) may exceed where the counters restart
    assert a.reserve(6, 2048, 23) == (0, 20) and a.counter(0, _arena.READ) == 20
    s = algorithms.build("ring", collective="allreduce", world_size=2, count=8)
    prog = program.compile_plan(ShmPlan.build(s, 0), 4, False)
    assert (prog.steps, prog.window_bytes) == (ShmPlan.build(s, 0).total, 32)
    assert prog.half_bytes(64) == 32 and prog.half_bytes(32) == 0


def test_one_rank_without_a_launcher_says_so_once(monkeypatch, capsys):
    from collectives.transport import host

    monkeypatch.setattr(host, "_warned", False)
    monkeypatch.delenv("COLLECTIVES_ONE_RANK", raising=False)
    assert not warn_if_alone(1, environ={"PMI_RANK": "0"})  # started by a launcher
    assert not warn_if_alone(2, environ={})
    assert warn_if_alone(1, environ={})
    assert not warn_if_alone(1, environ={})  # once
    assert "running as 1 rank: not started by mpiexec" in capsys.readouterr().err
    monkeypatch.setattr(host, "_warned", False)
    monkeypatch.setenv("COLLECTIVES_ONE_RANK", "1")
    assert not warn_if_alone(1, environ={})
