"""One CLI dialect: the same flags for sizes, dtype, op, algorithms and their parameters in every subcommand
(collectives/cli/arguments.py), help text on every option, hints in the command line's own syntax; and the
pure pieces of bench's honest output (prediction errors, the closing verdict, per-algorithm averages) and of
calibrate's self-check (benchmark/host_load.py)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from collectives.benchmark import format as fmt
from collectives.benchmark.host_load import HostLoad, Trials, verdict
from collectives.cli import SUBCOMMANDS, arguments, main


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    import importlib

    parser = argparse.ArgumentParser(prog="collectives")
    sub = parser.add_subparsers(dest="command")
    for module in SUBCOMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    return dict(sub.choices)


# subcommands that take each common option, and the flags it must have there
SHARED = {
    "sizes": (("bench", "simulate", "tune"),
              ("-b", "--minbytes", "-e", "--maxbytes", "-f", "--stepfactor", "-i", "--stepbytes")),
    "dtype": (("bench", "simulate", "tune"), ("-d", "--datatype", "--dtype")),
    "op": (("bench", "simulate", "tune"), ("-o", "--op")),
    "algorithms": (("bench", "simulate", "tune"), ("--algorithms", "--param")),
    "param": (("verify", "export"), ("--param",)),
    "collective": (("bench", "verify", "export", "simulate", "tune"), ("--collective",)),
    "topology": (("export", "simulate", "tune", "topo"),
                 ("--preset", "--topology", "--racks", "--nodes", "--ranks", "--set")),
}


@pytest.mark.parametrize("what", sorted(SHARED))
def test_shared_options_are_spelled_alike(what):
    parsers = _subparsers()
    commands, flags = SHARED[what]
    for command in commands:
        have = {s for a in parsers[command]._actions for s in a.option_strings}
        assert set(flags) <= have, (command, set(flags) - have)


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_option_has_help(command):
    parser = _subparsers()[command]
    missing = [a.option_strings or a.dest for a in parser._actions
               if a.help is None and not isinstance(a, argparse._HelpAction)]
    assert not missing, f"collectives {command}: options without help: {missing}"


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("collectives ")


def test_sizes_follow_nccl_tests():
    p = argparse.ArgumentParser()
    arguments.add_sizes(p, "8", "8")
    assert arguments.sizes(p.parse_args(["-b", "8", "-e", "1K", "-f", "4"])) == ([8, 32, 128, 512], "4(factor)")
    assert arguments.sizes(p.parse_args(["--minbytes", "1K", "--maxbytes", "3K", "--stepbytes", "1K"]))[0] == \
        [1024, 2048, 3072]
    assert arguments.sizes(p.parse_args(["-b", "1MiB", "-e", "2M"]))[0] == [1 << 20, 2 << 20]
    with pytest.raises(ValueError, match="-e/--maxbytes 8 is below -b/--minbytes 16"):
        arguments.sizes(p.parse_args(["-b", "16", "-e", "8"]))
    with pytest.raises(ValueError, match="-f/--stepfactor must be > 1"):
        arguments.sizes(p.parse_args(["-f", "1"]))


def test_the_older_sizes_flag_says_what_replaces_it(capsys):
    p = argparse.ArgumentParser()
    arguments.add_sizes(p, "8", "8")
    with pytest.raises(SystemExit):
        p.parse_args(["--sizes", "8B:8GiB"])
    assert "give the sweep as -b MIN -e MAX" in capsys.readouterr().err


def test_world_sizes_take_both_range_forms():
    assert arguments.parse_world_sizes("2:8") == arguments.parse_world_sizes("2-8") == list(range(2, 9))
    assert arguments.parse_world_sizes("1,4:6,16") == [1, 4, 5, 6, 16]
    with pytest.raises(argparse.ArgumentTypeError, match="like 1:64, 1-64 or 2,4,8"):
        arguments.parse_world_sizes("0:4")


def test_dtype_names():
    assert [arguments.dtype_name(t) for t in ("float", "half", "double", "bf16", "int32")] == \
        ["float32", "float16", "float64", "bfloat16", "int32"]
    with pytest.raises(ValueError, match="unknown datatype 'complex64' for -d/--datatype"):
        arguments.dtype_name("complex64")


def test_algorithm_parameters_one_syntax():
    specs = arguments.algorithm_specs("native,ring:chunks=4,rabenseifner,ring", ["chunks=2"], "allreduce", [],
                                      special=("native", "auto"))
    assert [(s.name, s.params) for s in specs] == [("native", {}), ("ring", {"chunks": 4}),
                                                   ("rabenseifner", {}), ("ring", {"chunks": 2})]  # takes no chunks
    assert specs[1].label == "ring:chunks=4"
    with pytest.raises(ValueError, match="no listed algorithm has a parameter 'chunkz'"):
        arguments.algorithm_specs("ring", ["chunkz=2"], "allreduce", [])
    with pytest.raises(ValueError, match="ring has no parameter 'chunkz'"):
        arguments.algorithm_specs("ring:chunkz=2", [], "allreduce", [])
    with pytest.raises(ValueError, match="write --algorithms hierarchical:intra=nvls"):
        arguments.parse_params(["hierarchical.intra=nvls"])
    with pytest.raises(ValueError, match=r"unknown algorithm 'nosuch' for allreduce; choose from native, auto"):
        arguments.algorithm_specs("nosuch", [], "allreduce", [], special=("native", "auto"))
    with pytest.raises(ValueError, match="native takes no parameters"):
        arguments.algorithm_specs("native:chunks=2", [], "allreduce", [], special=("native", "auto"))


def test_nvls_hint_is_written_for_the_command_line_too():
    from collectives import algorithms
    from collectives.topology import preset

    with pytest.raises(ValueError, match="--algorithms hierarchical:intra=nvls"):
        algorithms.build("nvls", collective="allreduce", world_size=144, count=144,
                         topology=preset("gb300-nvl72", racks=2))


def test_the_nvls_hint_runs_as_written(capsys):
    """The hint nvls gives on a multi-rack cluster is accepted by the command line as written."""
    argv = ["simulate", "--preset", "gb300-nvl72", "--racks", "2", "-b", "1M", "-e", "1M"]
    assert main([*argv, "--algorithms", "nvls"]) == 2
    assert "--algorithms hierarchical:intra=nvls" in capsys.readouterr().err
    assert main([*argv, "--algorithms", "hierarchical:intra=nvls,nvls_tree"]) == 0
    out = capsys.readouterr().out
    assert "# algorithm: hierarchical:intra=nvls" in out and "# algorithm: nvls_tree" in out


def test_topo_takes_preset_like_the_others(capsys):
    assert main(["topo", "--preset", "dgx-h100", "--nodes", "2"]) == 0
    by_flag = capsys.readouterr().out
    assert main(["topo", "dgx-h100", "--nodes", "2"]) == 0
    assert capsys.readouterr().out == by_flag


def test_verify_takes_parameters_after_the_name(capsys):
    assert main(["verify", "ring:chunks=2", "--world-sizes", "2:4"]) == 0
    out = capsys.readouterr().out
    assert "{'chunks': 2}" in out and out.count(" OK") == 3
    assert main(["verify", "ring:chunkz=2", "--world-sizes", "2"]) == 2
    assert "ring has no parameter 'chunkz'" in capsys.readouterr().err


# -- bench's output ------------------------------------------------------------------------------------------------
def test_header_keeps_only_fields_that_mean_something():
    lines = fmt.header(collective="allreduce", world_size=2, min_bytes=8, max_bytes=64, step="2(factor)", warmup=1,
                       iters=2, check=1, stat="mean", hosts=[(0, 1, "h")], predict="cal.json")
    text = "\n".join(lines)
    assert "agg iters" not in text and "graph" not in text
    assert "pred(us) = predicted time of the in-place call" in text and "err = pred / in-place time - 1" in text


def test_error_column_and_closing_verdict():
    assert [fmt.error_str(e) for e in (0.12, -0.4, 2.4, None)] == ["+12%", "-40%", "x3.4", "n/a"]
    lines = fmt.prediction_summary({"ring": [0.1, -0.2, 0.3], "auto": [2.0]}, "in-place")
    assert lines[0] == "# Predictions          : 2 of 4 sizes x algorithms within 25% of the in-place time"
    assert "ring                  : 2 of 3 within 25%" in lines[1] and "worst +30%" in lines[1]
    assert fmt.footer(0, {"ring": 1.5, "native": 0.5})[1:3] == ["# Avg bus bandwidth    : 1.5 ring",
                                                                 "# Avg bus bandwidth    : 0.5 native"]


# -- calibrate's self-check and bench's warnings -------------------------------------------------------------------
def test_trials_reject_outliers_and_report_spread():
    t = Trials()
    for v in (40.0, 10.0, 11.0):  # one trial caught a busy moment: slow, never fast
        t.add("round", v)
    assert t.kept("round") == [10.0, 11.0] and t.rejected("round") == 1
    assert t.median("round") == pytest.approx(10.5) and t.spread("round") == pytest.approx(1.1)
    assert t.unstable() == []
    for v in (10.0, 14.0):
        t.add("copy", v)  # 1.4x between kept trials
    for v in (1400.0, 1.0, 1300.0):
        t.add("call", v)  # one trial kept: nothing confirms it
    assert [n for n, _ in t.unstable()] == ["call", "copy"]


def test_a_busy_host_is_named_with_what_to_do():
    quiet = HostLoad(expected=1.0, cores=2, ranks_per_host=2, shares=[0.97, 0.99])
    busy = HostLoad(expected=0.5, cores=2, ranks_per_host=4, shares=[0.5, 0.2], load=7.5)
    assert not quiet.busy and verdict(quiet) == []
    assert busy.busy
    [why] = verdict(busy)
    assert "as little as 20% of a core" in why and "should get 50%" in why and "load average 7.5" in why


def _calibration_file(tmp_path, **calibration):
    from collectives.topology import preset, save

    path = tmp_path / "cal.json"
    save(preset("loopback", ranks=4), path)
    data = json.loads(path.read_text())
    data["calibration"] = {"ranks": 4, "hosts": ["here"], "quality": {"warnings": []}, **calibration}
    path.write_text(json.dumps(data))
    return str(path)


def test_predictor_warns_about_another_rank_count_host_or_a_busy_calibration(tmp_path):
    from collectives.benchmark.runner import Predictor

    f32 = np.dtype(np.float32)
    path = _calibration_file(tmp_path)
    assert Predictor(path, 4, f32, "sum", 0).warnings(["here"]) == []
    [ranks] = Predictor(path, 2, f32, "sum", 0).warnings(["here"])
    assert "calibrated with 4 ranks and this job has 2" in ranks and "mpiexec -n 2 collectives calibrate" in ranks
    [host] = Predictor(path, 4, f32, "sum", 0).warnings(["elsewhere"])
    assert "calibrated on here and this job runs on elsewhere" in host
    busy = _calibration_file(tmp_path, quality={"warnings": ["other processes took the CPU"]})
    assert "too busy to measure reliably: other processes" in Predictor(busy, 4, f32, "sum", 0).warnings(["here"])[0]


def test_a_missing_calibration_says_how_to_make_one(tmp_path):
    from collectives.benchmark.runner import Predictor

    with pytest.raises(FileNotFoundError, match=r"run `mpiexec -n 2 collectives calibrate --out .*nope.json`"):
        Predictor(str(tmp_path / "nope.json"), 2, np.dtype(np.float32), "sum", 0)
