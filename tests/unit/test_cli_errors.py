"""Usage errors found past argparse end in one line on stderr and exit code 2, never a traceback."""

import pytest

import collectives
from collectives.cli import main
from collectives.topology import preset


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--preset", "nope"], "unknown preset 'nope'"),
    (["simulate", "--preset", "dgx-h100", "--nodes", "1", "--collective", "allredcue"], "unknown collective"),
    (["simulate", "--preset", "dgx-h100", "--nodes", "1", "--dtype", "complex64", "-b", "1K", "-e", "1K"],
     "unknown datatype 'complex64' for -d/--datatype"),
    (["simulate", "--preset", "dgx-h100", "--nodes", "1", "--algorithms", "ring", "--param", "chunkz=2",
      "-b", "1K", "-e", "1K"], "no listed algorithm has a parameter 'chunkz'"),
    (["simulate", "--preset", "dgx-h100", "--nodes", "1", "--algorithms", "ring:chunkz=2", "-b", "1K", "-e", "1K"],
     "ring has no parameter 'chunkz'"),
    (["simulate", "--preset", "dgx-h100", "--nodes", "1", "--param", "ring.chunks=2"],
     "write --algorithms ring:chunks=2"),
    (["simulate", "--topology", "/nonexistent/topology.json"], "no topology file /nonexistent/topology.json"),
    (["verify", "ring", "--collective", "allredcue"], "unknown collective 'allredcue'"),
])
def test_usage_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_simulate_accepts_nccl_tests_dtype_names(capsys):
    assert main(["simulate", "--preset", "dgx-h100", "--nodes", "1", "--algorithms", "ring", "-d", "half",
                 "-b", "1K", "-e", "1K"]) == 0
    assert " half " in capsys.readouterr().out


@pytest.mark.parametrize("kwargs, error, message", [
    ({"dtype": "complex64"}, TypeError, "unsupported dtype"),
    ({"op": "add"}, ValueError, "unknown reduction op 'add'"),
    ({"op": "avg", "dtype": "int32"}, ValueError, "needs a floating-point dtype"),
    ({"nbytes": "1M"}, TypeError, "whole number of bytes"),
    ({"nbytes": 1.5}, TypeError, "whole number of bytes"),
])
def test_simulate_rejects_what_a_real_run_rejects(kwargs, error, message):
    nbytes = kwargs.pop("nbytes", 1024)
    with pytest.raises(error, match=message):
        collectives.simulate("ring", preset("dgx-h100", nodes=1), nbytes, **kwargs)


def test_verify_names_a_non_schedule_argument():
    with pytest.raises(TypeError, match="verify takes a built Schedule, got str"):
        collectives.verify("ring")


def test_public_functions_survive_submodule_imports():
    # importing a submodule binds it as an attribute of the package: the public functions must not be shadowed
    import importlib

    for module in ("collectives.verifier", "collectives.emulator", "collectives.simulate", "collectives.tune",
                   "collectives.cli.verify"):
        importlib.import_module(module)
    assert callable(collectives.verify) and callable(collectives.emulate)
    assert callable(collectives.simulate) and callable(collectives.tune)
    assert collectives.verify.__name__ == "verify" and collectives.emulate.__name__ == "emulate"
