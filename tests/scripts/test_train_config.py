"""scripts/train_options.py: --config TOML files, their precedence and errors; --help."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_DIR = Path(__file__).resolve().parents[2] / "scripts"
_spec = importlib.util.spec_from_file_location("train_options_under_test",
                                               _DIR / "train_options.py")
options = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(options)


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
    ("[model]\nn_layer = 2\n", r"unknown option 'model'"),
    ("lr = true\n", r"lr expects a value"),
    ("n_layer = \n", r"not valid TOML"),
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
