"""The tuner, COLLECTIVES_ALGO / COLLECTIVES_DEBUG, and the `simulate` / `tune` commands."""

from __future__ import annotations

import csv
import json
import logging

import pytest

import collectives.tune as tune_mod
from collectives.cli import main
from collectives.cli.simulate import parse_size, parse_sizes
from collectives.topology import fully_connected, preset
from collectives.tune import AlgoRule, candidates, choose, parse_algo_env, tune


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv("COLLECTIVES_ALGO", raising=False)
    monkeypatch.delenv("COLLECTIVES_DEBUG", raising=False)
    tune_mod._choose.cache_clear()


def test_parse_algo_env():
    assert parse_algo_env("ring,binomial") == {None: AlgoRule(("ring", "binomial"), False)}
    assert parse_algo_env("^chain") == {None: AlgoRule(("chain",), True)}
    rules = parse_algo_env("allreduce:ring;broadcast:^chain")
    assert rules["allreduce"].allows("ring") and not rules["allreduce"].allows("binomial")
    assert rules["broadcast"].allows("binomial") and not rules["broadcast"].allows("chain")
    assert parse_algo_env("") == {}
    with pytest.raises(ValueError, match="collective"):
        parse_algo_env("allscatter:ring")


def test_candidates_follow_the_env(monkeypatch):
    t = fully_connected(8)
    assert "ring" in candidates("allreduce", t)[0]
    monkeypatch.setenv("COLLECTIVES_ALGO", "^ring,chain")
    names, how = candidates("allreduce", t)
    assert "ring" not in names and "chain" not in names and "excluded" in how
    monkeypatch.setenv("COLLECTIVES_ALGO", "ring;broadcast:binomial")
    assert candidates("allreduce", t)[0] == ["ring"]
    assert candidates("broadcast", t)[0] == ["binomial"]
    monkeypatch.setenv("COLLECTIVES_ALGO", "nosuch")
    with pytest.raises(ValueError, match="unknown algorithm"):
        candidates("allreduce", t)


def test_choose_picks_the_fastest_and_says_why():
    t = fully_connected(8, latency=5e-6, bandwidth=10e9, reduce_bandwidth=20e9)
    small, why = choose("allreduce", 64, t)
    large, why_large = choose("allreduce", 256 << 20, t)
    assert small in ("recursive_doubling", "rabenseifner", "binomial", "double_binary_tree")
    assert large in ("ring", "rabenseifner")
    assert "fastest" in why and "runners-up" in why_large
    assert choose("allreduce", 64, t) == (small, why)  # cached
    assert tune_mod._choose.cache_info().hits >= 1


def test_choose_pinned_and_logged(monkeypatch, caplog):
    monkeypatch.setenv("COLLECTIVES_ALGO", "allreduce:ring")
    monkeypatch.setenv("COLLECTIVES_DEBUG", "INFO")
    with caplog.at_level(logging.INFO, logger="collectives"):
        name, why = choose("allreduce", 1 << 20, fully_connected(4))
    assert name == "ring" and "COLLECTIVES_ALGO" in why
    assert any("ring" in rec.getMessage() for rec in caplog.records)


def test_choose_resizes_small_machines():
    name, _ = choose("allreduce", 1 << 20, preset("loopback", ranks=4), world_size=2)
    assert name in candidates("allreduce", fully_connected(2))[0]


def test_tune_table():
    t = preset("dgx-h100", nodes=2)
    table = tune(t, "allreduce", [8, 1024, 1 << 20, 1 << 28])
    assert [r.nbytes for r in table.rows] == [8, 1024, 1 << 20, 1 << 28]
    for row in table.rows:
        assert row.winner == min(row.times, key=row.times.get)
    ranges = table.ranges()
    assert ranges[0][0] == 8 and ranges[-1][1] == 1 << 28
    text = table.format()
    assert "size range" in text and "runners-up" in text
    # the module is callable: collectives.tune(topology, collective, sizes)
    assert tune_mod(t, "allreduce", [8]).rows[0].winner == table.rows[0].winner


def test_parse_sizes():
    assert parse_size("8GiB") == 8 << 30 and parse_size("64K") == 65536 and parse_size("8") == 8
    assert parse_sizes("8B:64B") == [8, 16, 32, 64]
    assert parse_sizes("1K:1M:x32") == [1024, 32768, 1 << 20]
    assert len(parse_sizes("8B:8GiB:30")) == 30
    assert parse_sizes("1K,2K") == [1024, 2048]


def test_cli_simulate(tmp_path, capsys):
    csv_path, json_path = tmp_path / "out.csv", tmp_path / "out.json"
    rc = main(["simulate", "--preset", "dgx-h100", "--nodes", "1", "--algorithms", "ring,double_binary_tree",
               "--sizes", "1K:1M:x32", "--csv", str(csv_path), "--json", str(json_path), "--param", "chunks=2"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "# algorithm: ring" in out and "# algorithm: double_binary_tree" in out
    assert "busbw(GB/s)" in out and "# Avg bus bandwidth" in out and "*" in out
    rows = list(csv.DictReader(open(csv_path)))
    assert len(rows) == 6 and {r["algorithm"] for r in rows} == {"ring", "double_binary_tree"}
    assert sum(r["winner"] == "True" for r in rows) == 3
    data = json.load(open(json_path))
    assert len(data["results"]) == 6 and data["results"][0]["params"]["chunks"] == 2


def test_cli_simulate_plot(tmp_path, capsys, monkeypatch):
    png = tmp_path / "busbw.png"
    argv = ["simulate", "--preset", "dgx-h100", "--nodes", "1", "--algorithms", "ring", "--sizes", "1K:1M:x32",
            "--plot", str(png)]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert main(argv) == 3
        assert "matplotlib" in capsys.readouterr().err
        return
    assert main(argv) == 0 and png.stat().st_size > 1000
    import builtins

    real_import = builtins.__import__

    def no_mpl(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    assert main(argv) == 3
    assert "pip install" in capsys.readouterr().err


def test_cli_tune(capsys, monkeypatch):
    monkeypatch.setenv("COLLECTIVES_ALGO", "^chain")
    rc = main(["tune", "--preset", "dgx-h100", "--nodes", "2", "--sizes", "8B:1GiB:x64", "--progress"])
    cap = capsys.readouterr()
    assert rc == 0
    assert "tuning table: allreduce on dgx-h100" in cap.out and "chain" not in cap.out.split("runners-up")[-1]
    assert "excluded chain" in cap.out
    assert "tuning allreduce" in cap.err  # the progress bar
