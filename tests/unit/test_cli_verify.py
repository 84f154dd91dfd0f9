"""`collectives verify`: one row per world size, OK or the error, and exit codes."""

from __future__ import annotations

import pytest

from collectives import algorithms, verify
from collectives.cli import main
from collectives.cli.verify import parse_range


def rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.strip() and not line.startswith("#")]


def test_ring_allreduce_one_row_per_world_size(capsys):
    code = main(["verify", "ring", "--collective", "allreduce", "--world-sizes", "1-8"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("# ring allreduce\n")
    table = rows(out)
    assert [int(r[0]) for r in table] == list(range(1, 9))
    for r in table:
        p = int(r[0])
        rep = verify(algorithms.build("ring", collective="allreduce", world_size=p, count=3 * p + 1))
        assert r == [str(p), str(3 * p + 1), str(rep.steps), str(rep.messages),
                     str(rep.max_bytes_sent_per_rank), "OK"]


def test_params_count_and_itemsize(capsys):
    code = main(["verify", "ring", "--collective", "allgather", "--world-sizes", "2,4", "--count", "5",
                 "--itemsize", "8", "--param", "chunks=2"])
    out = capsys.readouterr().out
    assert code == 0 and "{'chunks': 2}" in out.splitlines()[0]
    # p ranks x (p-1) steps x 2 segments messages; p-1+1 rounds; (p-1) blocks of 5 elements of 8 bytes sent
    assert rows(out) == [["2", "5", "2", "4", str(1 * 5 * 8), "OK"], ["4", "5", "4", "24", str(3 * 5 * 8), "OK"]]


def test_unknown_algorithm_exits_with_an_error(capsys):
    code = main(["verify", "no-such-algorithm", "--world-sizes", "1-4"])
    captured = capsys.readouterr()
    assert code == 2
    assert "unknown algorithm 'no-such-algorithm'; valid algorithms:" in captured.err and "ring" in captured.err
    assert rows(captured.out) == []


def test_failing_world_sizes_are_error_rows(capsys):
    # reduce_scatter with count 6 is valid only where p divides 6
    code = main(["verify", "ring", "--collective", "reduce_scatter", "--world-sizes", "2-4", "--count", "6"])
    table = rows(capsys.readouterr().out)
    assert code == 1
    assert [r[-1] for r in table[:1]] == ["OK"] and table[1][-1] == "OK"
    assert table[2][:2] == ["4", "6"] and "error:" in table[2] and "must divide by world_size=4" in " ".join(table[2])


def test_unsupported_collective_is_one_usage_error(capsys):
    # a usage error would repeat on every row: it is reported once, on stderr, with exit code 2
    code = main(["verify", "ring", "--collective", "broadcast", "--world-sizes", "2-9"])
    captured = capsys.readouterr()
    assert code == 2 and captured.err.count("does not implement broadcast") == 1 and "OK" not in captured.out


def test_bad_parameter_value_is_one_usage_error(capsys):
    assert main(["verify", "ring", "--param", "chunks=0", "--world-sizes", "1-4"]) == 2
    assert capsys.readouterr().err.count("ring chunks (pipeline segments) must be an integer >= 1, got 0") == 1


def test_bad_param_syntax(capsys):
    assert main(["verify", "ring", "--param", "chunks"]) == 2
    assert "--param takes KEY=VALUE" in capsys.readouterr().err


def test_list(capsys):
    assert main(["verify", "--list"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("allreduce"))
    assert "ring" in line


def test_world_size_ranges():
    assert parse_range("1-4") == [1, 2, 3, 4]
    assert parse_range("8,2,4-5") == [2, 4, 5, 8]
    with pytest.raises(SystemExit):
        main(["verify", "ring", "--world-sizes", "0-3"])
