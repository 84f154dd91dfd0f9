"""The CLI around MSCCL-IR: `verify --msccl`, `export --format msccl`, `simulate --msccl`."""

from __future__ import annotations

from pathlib import Path

from collectives import msccl, verify
from collectives.cli import main

DATA = Path(__file__).parent / "data" / "msccl"


def rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.strip() and not line.startswith("#")]


def test_verify_checks_every_declared_mode(capsys):
    assert main(["verify", "--msccl", str(DATA / "ring-allreduce.xml")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# msccl {DATA / 'ring-allreduce.xml'}: ring allreduce 3 gpus, allreduce over 3 GPUs, "
                          "proto Simple, 1 channel(s), 3 chunks per loop\n")
    assert rows(out) == [["inplace", "3", "4", "12", "3", "16", "OK"], ["outofplace", "3", "4", "12", "6", "16", "OK"]]
    assert main(["verify", "--msccl", str(DATA / "ring-allreduce.xml"), "--mode", "inplace", "--count", "6"]) == 0
    assert rows(capsys.readouterr().out) == [["inplace", "6", "4", "12", "3", "32", "OK"]]


def test_verify_reports_a_broken_file_and_fails(capsys):
    assert main(["verify", "--msccl", str(DATA / "broken-missing-receive.xml")]) == 1
    out = capsys.readouterr().out
    assert "error: node 1, op 2 (round 0, elements [2, 3)) [GPU 1, threadblock 2, step 0 (s)]: send to node 2 has " \
           "no matching receive" in out


def test_verify_takes_files_and_directories_and_counts_them(capsys, tmp_path):
    assert main(["verify", "--msccl", str(DATA)]) == 1  # the directory holds the broken fixtures too
    out = capsys.readouterr().out
    broken = sorted(p.name for p in DATA.glob("broken-*.xml"))
    total = len(list(DATA.glob("*.xml")))
    assert out.rstrip().endswith(f"# {total - len(broken)} of {total} files verified; not verified: "
                                 + ", ".join(broken))
    good = [str(DATA / "ring-allreduce.xml"), str(DATA / "alltoall-8gpu-ll.xml")]
    (tmp_path / "bad.xml").write_text("<algo/>")
    assert main(["verify", "--msccl", *good]) == 0
    assert capsys.readouterr().out.rstrip().endswith("# 2 of 2 files verified")
    assert main(["verify", "--msccl", *good, str(tmp_path)]) == 1  # an unreadable file among several: reported
    out = capsys.readouterr().out
    assert f"# msccl {tmp_path / 'bad.xml'}: error: " in out and "<algo> has no 'coll' attribute" in out
    assert out.rstrip().endswith("# 2 of 3 files verified; not verified: bad.xml")
    assert main(["verify", "--msccl", str(tmp_path / "none")]) == 2
    assert "none: no such file or directory" in capsys.readouterr().err
    (tmp_path / "bad.xml").unlink()
    assert main(["verify", "--msccl", str(tmp_path)]) == 2
    assert "is a directory without *.xml files" in capsys.readouterr().err


def test_verify_usage_errors(capsys, tmp_path):
    assert main(["verify", "--msccl", str(DATA / "alltoall-outofplace.xml"), "--mode", "inplace"]) == 2
    assert "declares outofplace only (inplace=0 outofplace=1)" in capsys.readouterr().err
    bad = tmp_path / "bad.xml"
    bad.write_text("<algo/>")
    assert main(["verify", "--msccl", str(bad)]) == 2
    assert "<algo> has no 'coll' attribute" in capsys.readouterr().err
    assert main(["verify", "ring", "--msccl", str(bad)]) == 2
    assert "give an algorithm NAME or --msccl FILE, not both" in capsys.readouterr().err


def test_export_writes_a_file_that_verifies(capsys, tmp_path):
    out = tmp_path / "ring.xml"
    assert main(["export", "ring", "--world-size", "4", "--format", "msccl", "--out", str(out), "--proto", "LL"]) == 0
    err = capsys.readouterr().err
    assert "ring allreduce over 4 GPUs at count 4: read back and verified (6 rounds, 24 messages)" in err
    text = out.read_text()
    assert 'proto="LL"' in text and 'nchunksperloop="4" ngpus="4" coll="allreduce"' in text
    assert verify(msccl.read(out, count=400)).steps == 6
    assert main(["verify", "--msccl", str(out)]) == 0


def test_export_to_stdout_and_errors(capsys):
    assert main(["export", "pairwise", "--world-size", "3", "--collective", "alltoall", "--no-check"]) == 0
    assert capsys.readouterr().out.lstrip().startswith("<!-- pairwise alltoall over 3 GPUs")
    assert main(["export", "nvls", "--preset", "dgx-h100", "--nodes", "1"]) == 2
    assert "runs on switch nodes" in capsys.readouterr().err
    assert main(["export", "hierarchical_alltoall", "--world-size", "4", "--collective", "alltoall"]) == 2
    assert "needs a topology: give --preset" in capsys.readouterr().err


def test_simulate_puts_the_file_in_the_same_table(capsys):
    code = main(["simulate", "--msccl", str(DATA / "ring-allreduce.xml"), "--preset", "loopback", "--ranks", "3",
                 "--algorithms", "ring", "-b", "1K", "-e", "3K", "-i", "2K", "--mode", "event"])
    out = capsys.readouterr().out
    assert code == 0
    assert "# algorithm: ring\n" in out and "# algorithm: msccl:ring-allreduce.xml\n" in out
    file_rows = out.split("# algorithm: msccl:ring-allreduce.xml\n")[1]
    assert "not run: ring-allreduce.xml: the MSCCL executor runs this allreduce only when count x 1 is a multiple " \
           "of nchunksperloop=3" in file_rows
    assert rows(file_rows)[1][:2] == ["3072", "768"]
    assert main(["simulate", "--msccl", str(DATA / "ring-allreduce.xml"), "--preset", "loopback", "--ranks", "4",
                 "-b", "3K", "-e", "3K"]) == 2
    assert "is for 3 GPUs but loopback" in capsys.readouterr().err
