"""The tuner, COLLECTIVES_ALGO / COLLECTIVES_DEBUG, and the `simulate` / `tune` commands."""

from __future__ import annotations

import csv
import json
import logging

import pytest

import collectives.choice as choice_mod
import collectives.tune as tune_mod
from collectives.choice import AlgoRule, candidates, choose, parse_algo_env
from collectives.cli import main
from collectives.topology import fully_connected, preset
from collectives.tune import tune


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv("COLLECTIVES_ALGO", raising=False)
    monkeypatch.delenv("COLLECTIVES_DEBUG", raising=False)
    choice_mod._choose.cache_clear()


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
    # latency-bound: the fewest rounds win; one_shot (one round, every pair on its own link) is the minimum
    assert small == "one_shot"
    # with chunk selection a pipelined tree competes at its best chunk count (on fully_connected every pair has
    # its own link, so a pipelined double binary tree beats the ring there); the reason names the count
    # `direct` (reduce-scatter by one round of direct sends) is fastest where every pair has its own link
    assert large in ("ring", "rabenseifner", "double_binary_tree", "direct")
    if large == "double_binary_tree":
        assert "double_binary_tree (chunks=" in why_large
    assert "fastest" in why and "runners-up" in why_large
    assert choose("allreduce", 64, t) == (small, why)  # cached
    assert choice_mod._choose.cache_info().hits >= 1


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


def test_cli_simulate(tmp_path, capsys):
    csv_path, json_path = tmp_path / "out.csv", tmp_path / "out.json"
    rc = main(["simulate", "--preset", "dgx-h100", "--nodes", "1", "--algorithms", "ring,double_binary_tree",
               "-b", "1K", "-e", "1M", "-f", "32", "--csv", str(csv_path), "--json", str(json_path), "--param", "chunks=2"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "# algorithm: ring:chunks=2" in out and "# algorithm: double_binary_tree:chunks=2" in out  # as run
    assert "busbw(GB/s)" in out and "# Avg bus bandwidth" in out and "*" in out
    rows = list(csv.DictReader(open(csv_path)))
    assert len(rows) == 6 and {r["algorithm"] for r in rows} == {"ring:chunks=2", "double_binary_tree:chunks=2"}
    assert sum(r["winner"] == "True" for r in rows) == 3
    data = json.load(open(json_path))
    assert len(data["results"]) == 6 and data["results"][0]["params"]["chunks"] == 2


def test_cli_simulate_plot(tmp_path, capsys, monkeypatch):
    png = tmp_path / "busbw.png"
    argv = ["simulate", "--preset", "dgx-h100", "--nodes", "1", "--algorithms", "ring", "-b", "1K", "-e", "1M",
            "-f", "32", "--plot", str(png)]
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
    rc = main(["tune", "--preset", "dgx-h100", "--nodes", "2", "-b", "8", "-e", "1G", "-f", "64", "--progress"])
    cap = capsys.readouterr()
    assert rc == 0
    assert "tuning table: allreduce on dgx-h100" in cap.out and "chain" not in cap.out.split("runners-up")[-1]
    assert "excluded chain" in cap.out
    assert "tuning allreduce" in cap.err  # the progress bar


def test_chunk_candidates():
    assert choice_mod.chunk_candidates("double_binary_tree", 8) == [1]
    assert choice_mod.chunk_candidates("double_binary_tree", 4 * choice_mod.TUNE_MIN_CHUNK_BYTES) == [1, 2, 4]
    big = choice_mod.chunk_candidates("double_binary_tree", 1 << 40)
    assert big[0] == 1 and big[-1] == choice_mod.TUNE_MAX_CHUNKS
    assert choice_mod.chunk_candidates("rabenseifner", 1 << 30) == []  # no chunks parameter
    assert choice_mod.chunk_candidates("sharp", 1 << 30) == []  # chunks=None: the builder plans its own
    assert choice_mod.chunk_candidates("double_binary_tree", 1 << 30, {"chunks": 3}) == []  # the caller's


def test_tune_chooses_chunks_for_pipelined_trees():
    t = fully_connected(64, latency=2e-6, bandwidth=20e9, reduce_bandwidth=50e9)
    sizes = [8, 1 << 20, 256 << 20]
    table = tune(t, "allreduce", sizes, algorithms=["double_binary_tree", "ring"])
    plain = tune(t, "allreduce", sizes, algorithms=["double_binary_tree", "ring"], choose_chunks=False)
    small, _, large = table.rows
    assert "double_binary_tree" not in small.params  # 8 B: one chunk, nothing to pipeline
    c = large.params["double_binary_tree"]["chunks"]
    assert c > 1 and 256 << 20 >= c * choice_mod.TUNE_MIN_CHUNK_BYTES
    # the time reported is the simulator's at that chunk count, and no slower than the default's
    from collectives.simulate import simulate

    want = simulate("double_binary_tree", t, 256 << 20, mode="analytic", chunks=c).time
    assert large.times["double_binary_tree"] == pytest.approx(want, rel=1e-12)
    assert large.times["double_binary_tree"] < plain.rows[-1].times["double_binary_tree"]
    for r, p in zip(table.rows, plain.rows, strict=True):
        assert all(r.times[n] <= p.times[n] for n in r.times)
    assert large.label("double_binary_tree") == f"double_binary_tree (chunks={c})"
    assert f"double_binary_tree (chunks={c})" in table.format()
    # ring's pipelined form costs p rounds to analyse and cannot win: the tuner does not try it
    assert "ring" not in large.params


def test_choose_reports_chunks_and_auto_uses_them(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_ALGO", "double_binary_tree,binomial")
    t = fully_connected(64, latency=2e-6, bandwidth=20e9, reduce_bandwidth=50e9)
    name, params, why = choice_mod.select("allreduce", 256 << 20, t)
    assert name in ("double_binary_tree", "binomial") and params.get("chunks", 1) > 1
    assert f"{name} (chunks={params['chunks']})" in why
    assert choose("allreduce", 256 << 20, t) == (name, why)
    from collectives.simulate import simulate

    r = simulate("auto", t, 256 << 20, mode="analytic")
    assert r.algorithm == name and r.params["chunks"] == params["chunks"] and r.reason == why


def test_tuner_skips_in_network_algorithms_on_fully_connected():
    table = tune(fully_connected(8), "allreduce", [1024], algorithms=["ring", "hierarchical", "nvls", "sharp"])
    assert set(table.skipped) == {"hierarchical", "nvls", "sharp"}
    assert all("scale-up domains" in why for why in table.skipped.values())
