"""dist.trainer.options: the layout rule, option checks as one line, --timeout, --config TOML
files (their precedence and errors), --help."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from dist.trainer import options


@pytest.mark.parametrize("n,given,expected", [
    (1, (None, None, None), (1, 1, 1)), (2, (None, None, None), (1, 1, 2)),
    (4, (None, None, None), (1, 2, 2)), (8, (None, None, None), (2, 2, 2)),
    (3, (None, None, None), (3, 1, 1)), (4, (None, 4, None), (1, 4, 1)),
    (4, (2, None, None), (2, 1, 2)),  # (tp, pp, dp) given -> (dp, pp, tp)
    (8, (None, None, 2), (2, 4, 1)),
])
def test_default_layout_rule(n, given, expected):
    tp, pp, dp = given
    assert options.derive_layout(n, tp, pp, dp) == expected


@pytest.mark.parametrize("args,world,message", [
    (["--tp", "3"], 4, "does not match the 4 MPI ranks"),
    (["--tp", "2", "--pp", "2", "--dp", "2"], 4, "= 8 does not match"),
    (["--n-head", "3", "--n-embd", "48", "--tp", "2"], 2, "--n-head 3 is not divisible by --tp 2"),
    (["--n-layer", "3", "--pp", "2"], 2, "--n-layer 3 is not divisible by --pp 2"),
    (["--data", "/no/such/file.txt"], 1, "no such file or folder"),
    (["--batch-size", "6", "--pp", "2", "--micro-batches", "4"], 2, "equal parts"),
    (["--n-embd", "30"], 1, "not divisible by --n-head 4"),
    (["--micro-batches", "0"], 1, "--micro-batches must be an integer >= 1, given 0"),
    (["--lr", "-1"], 1, "--lr must be a finite number > 0, given -1.0"),
    (["--lr", "nan"], 1, "--lr must be a finite number > 0, given nan"),
    (["--clip", "-1"], 1, "--clip must be a finite number >= 0, given -1.0"),
    (["--seed", "-1"], 1, "--seed must be an integer in [0, 2**32), given -1"),
    (["--out", __file__], 1, "--out must name a folder (or a new one), given"),
    (["--keep", "0"], 1, "--keep must be an integer >= 1, given 0"),
    (["--on-nonfinite", "skip", "--max-skips", "0"], 1, "--max-skips must be an integer >= 1"),
    pytest.param(["--device", "cuda"], 1, "--device cuda: no usable CUDA device",
                 marks=pytest.mark.skipif(__import__("gpuplan").device_available(),
                                          reason="a device is present")),
])
def test_option_errors_are_one_line(args, world, message):
    ns = options.parse_args(args)
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        options.validate(ns, world)
    assert "\n" not in str(e.value)


def test_timeout_option():
    assert options.parse_args(["--timeout", "30"]).timeout == 30.0
    assert options.parse_args([]).timeout is None  # $GPUPLAN_COLLECTIVE_TIMEOUT, else 600
    for bad in ("-1", "soon"):
        with pytest.raises(ValueError, match=f"argument --timeout: expected seconds >= 0 "
                                             fr"\(0: no limit\), given {bad}"):
            options.parse_args(["--timeout", bad])


def _toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return str(path)


def test_file_sets_options_and_the_command_line_overrides_it(tmp_path):
    cfg = _toml(tmp_path, 'n_layer = 6\n"n-embd" = 64\nlr = 1e-3\nschedule = "gpipe"\n'
                          'resume = true\nout = "runs/cfg"\n')
    ns = options.parse_args(["--config", cfg])
    assert (ns.n_layer, ns.n_embd, ns.lr, ns.schedule, ns.resume, ns.out) == \
        (6, 64, 1e-3, "gpipe", "latest", "runs/cfg")
    ns = options.parse_args(["--n-layer", "2", "--config", cfg, "--lr", "0.5"])
    assert (ns.n_layer, ns.n_embd, ns.lr) == (2, 64, 0.5)  # flags win, wherever they stand
    ns = options.parse_args(["--config", _toml(tmp_path, "resume = false\nsteps = 7\n")])
    assert ns.resume is None and ns.steps == 7
    assert options.parse_args([]).n_layer == 4  # no file: the defaults


@pytest.mark.parametrize("text,match", [
    ("n_layers = 3\n", r"unknown option 'n_layers' \(did you mean n_layer\?\)"),
    ("colour = 3\n", r"unknown option 'colour'; train.py --help"),
    ('n_layer = "four"\n', r"--config .*run.toml: argument --n-layer: invalid int value"),
    ('schedule = "zigzag"\n', r"--config .*: argument --schedule: invalid choice"),
    ("n_layer = [1, 2]\n", r"n_layer expects a value .* given \[1, 2\]"),
    ("[run]\nn_layer = 2\n", r"unknown option 'run'"),
    ("[model]\nn_layer = 2\n", r"model expects a value like its command-line --model takes"),
    ("lr = true\n", r"lr expects a value"),
    ("n_layer = \n", r"not valid TOML"),
    ("x = " + "[" * 5000 + "]" * 5000 + "\n", r"nested too deeply"),  # was RecursionError
])
def test_bad_files_are_one_line_naming_the_file_and_key(tmp_path, text, match):
    with pytest.raises(options.OptionError, match=match) as info:
        options.parse_args(["--config", _toml(tmp_path, text)])
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(options.OptionError, match=r"--config: cannot read .*nope.toml"):
        options.parse_args(["--config", str(tmp_path / "nope.toml")])


def test_help_shows_defaults_and_config(capsys, monkeypatch):
    for name in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "MPI_LOCALNRANKS", "SLURM_STEP_NUM_TASKS", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        options.parse_args(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "--config TOML" in text and "(default: 300)" in text and "(default: 0.003)" in text
    # Another rank (the launcher says so) exits alike but prints nothing.
    monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setenv("PMI_SIZE", "2")
    with pytest.raises(SystemExit):
        options.parse_args(["--help"])
    assert capsys.readouterr().out == ""


def test_python_310_falls_back_to_tomli(tmp_path, monkeypatch):
    pytest.importorskip("tomllib")
    import tomllib

    monkeypatch.setitem(sys.modules, "tomllib", None)  # as on Python 3.10
    monkeypatch.setitem(sys.modules, "tomli", tomllib)  # stands in for the backport
    assert options.parse_args(["--config", _toml(tmp_path, "steps = 9\n")]).steps == 9
