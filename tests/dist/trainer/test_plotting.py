"""dist.trainer.plotting: matplotlib PNGs from series and from a metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")  # a dependency of the project: setup.sh installs it
from matplotlib.image import imread  # noqa: E402

from dist.trainer import plotting  # noqa: E402


def _ink(png: Path) -> np.ndarray:
    """Mask of pixels that are not white (the plot's lines, axes and labels)."""
    rgb = imread(png)[..., :3]
    return (rgb < 0.95).any(axis=-1)


def test_write_loss_plot_writes_a_png_with_the_curves(tmp_path):
    steps = np.arange(0, 200, 10)
    path = plotting.write_loss_plot(tmp_path / "run" / "loss.png",
                                    {"train": (steps, 5 * np.exp(-steps / 60) + 1)}, title="t")
    assert path == tmp_path / "run" / "loss.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert imread(path).shape[:2] == (400, 640)
    empty = plotting.write_loss_plot(tmp_path / "empty.png", {"train": ([], [])}, title="t")
    # The curve (and its legend) put down ink that the empty plot does not have.
    assert _ink(path).sum() > _ink(empty).sum() + 500
    assert not list(tmp_path.rglob(".*.tmp")), "the temporary file should be renamed away"


def test_mismatched_lengths_raise_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="'a' has 2 != 1"):
        plotting.write_loss_plot(tmp_path / "a.png", {"a": ([0, 1], [1])})
    assert not list(tmp_path.iterdir())


def test_non_finite_points_are_dropped(tmp_path):
    path = plotting.write_loss_plot(tmp_path / "a.png",
                                    {"a": ([0, 1, 2, 3], [1.0, float("nan"), 3.0, float("inf")])})
    assert path.exists()


def _write_jsonl(path: Path, records: list[dict], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def test_plot_metrics_reads_the_jsonl_written_by_train(tmp_path):
    recs = [{"step": s, "train_loss": 5.0 / s, "val_loss": 5.5 / s} for s in (1, 25, 50, 75)]
    _write_jsonl(tmp_path / "metrics.jsonl", recs, tail='{"step": 100, "train_lo')  # killed
    assert plotting.read_metrics(tmp_path / "metrics.jsonl") == recs
    png = plotting.plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "loss.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plotting.main([str(tmp_path / "metrics.jsonl"), "--out", str(tmp_path / "b.png")]) == 0
    assert (tmp_path / "b.png").exists()


def test_a_broken_line_before_the_last_is_an_error(tmp_path, capsys):
    (tmp_path / "m.jsonl").write_text('{"step": 1, "train_loss": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        plotting.read_metrics(tmp_path / "m.jsonl")
    assert plotting.main([str(tmp_path / "m.jsonl")]) == 2
    assert "plotting.py: error:" in capsys.readouterr().err


def test_the_plot_is_never_written_through_a_planted_link(tmp_path):
    """Before: savefig wrote through a `.loss.png.tmp` link to a file outside OUT."""
    from gpuplan.confined_write import LinkOutsideError

    out, outside = tmp_path / "out", tmp_path / "outside.txt"
    out.mkdir()
    outside.write_text("keep")
    (out / ".loss.png.tmp").symlink_to(outside)
    plotting.write_loss_plot(out / "loss.png", {"train": ([1, 2], [3.0, 2.0])})
    assert outside.read_text() == "keep" and imread(out / "loss.png").shape[-1] in (3, 4)
    (out / "loss.png").unlink()
    (out / "loss.png").symlink_to(outside)
    with pytest.raises(LinkOutsideError, match="loss.png: resolves to"):
        plotting.write_loss_plot(out / "loss.png", {"train": ([1, 2], [3.0, 2.0])})
    assert outside.read_text() == "keep"
