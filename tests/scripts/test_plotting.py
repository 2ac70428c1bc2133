"""scripts/plotting.py: PNG structure, drawn pixels, edge cases, ticks, renderer choice."""

from __future__ import annotations

import importlib.util
import math
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "plotting.py"
_spec = importlib.util.spec_from_file_location("plotting", _PATH)
plotting = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plotting)

SIZE = (320, 200)  # small canvases keep the tests quick
STEPS = np.arange(0, 200, 10, dtype=np.float64)


def read_png(data: bytes) -> tuple[dict, np.ndarray]:
    """Parse an 8-bit RGB, filter-0 PNG back into (IHDR fields, (h, w, 3) pixels)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        tag, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(tag + body) & 0xFFFFFFFF, f"bad CRC in {tag!r}"
        chunks.append((tag, body))
        pos += 12 + length
    assert pos == len(data)
    tags = [t for t, _ in chunks]
    assert tags[0] == b"IHDR" and tags[-1] == b"IEND" and b"IDAT" in tags
    width, height, depth, ctype, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    header = dict(width=width, height=height, depth=depth, color_type=ctype,
                  compression=comp, filter=filt, interlace=interlace)
    raw = zlib.decompress(b"".join(b for t, b in chunks if t == b"IDAT"))
    assert len(raw) == height * (1 + 3 * width)
    lines = np.frombuffer(raw, dtype=np.uint8).reshape(height, 1 + 3 * width)
    assert not lines[:, 0].any(), "every scanline should use filter 0"
    return header, lines[:, 1:].reshape(height, width, 3)


def color_mask(rgb: np.ndarray, color) -> np.ndarray:
    return np.all(rgb == np.array(color, dtype=np.uint8), axis=-1)


def three_series() -> dict:
    return {"train": (STEPS, 5 * np.exp(-STEPS / 60) + 1),
            "val": (STEPS, 5 * np.exp(-STEPS / 70) + 1.5),
            "lr": (STEPS, 0.02 * STEPS)}


def test_builtin_png_is_valid_and_holds_the_rendered_pixels(tmp_path):
    path = tmp_path / "loss.png"
    plotting.render_png(path, three_series(), title="loss", size=SIZE)
    header, pixels = read_png(path.read_bytes())
    assert header == dict(width=SIZE[0], height=SIZE[1], depth=8, color_type=2,
                          compression=0, filter=0, interlace=0)
    expected = plotting.render_rgb(three_series(), title="loss", size=SIZE)
    np.testing.assert_array_equal(pixels, expected)


def test_each_series_is_drawn_across_the_plot_in_its_color():
    rgb = plotting.render_rgb(three_series(), size=SIZE, legend=False)
    assert (rgb != 255).any(axis=-1).mean() > 0.05, "canvas is nearly blank"
    for i in range(3):
        rows, cols = np.nonzero(color_mask(rgb, plotting.SERIES_COLORS[i]))
        assert cols.size > 100, f"series {i}: only {cols.size} pixels in its color"
        assert np.ptp(cols) > 0.7 * SIZE[0], f"series {i} spans columns {cols.min()}..{cols.max()}"


def test_curve_goes_where_the_data_goes():
    rising = plotting.render_rgb({"up": (STEPS, STEPS)}, size=SIZE, legend=False)
    falling = plotting.render_rgb({"down": (STEPS, -STEPS)}, size=SIZE, legend=False)
    for rgb, sign in [(rising, -1), (falling, 1)]:
        rows, cols = np.nonzero(color_mask(rgb, plotting.SERIES_COLORS[0]))
        # Image rows grow downwards, so a rising curve has rows falling as columns grow.
        assert sign * np.corrcoef(cols, rows)[0, 1] > 0.95


def test_points_are_joined_by_an_unbroken_line():
    rgb = plotting.render_rgb({"a": ([0.0, 1.0], [0.0, 1.0])}, size=SIZE, legend=False)
    cols = np.unique(np.nonzero(color_mask(rgb, plotting.SERIES_COLORS[0]))[1])
    # Only the two end markers would leave a gap of ~250 columns between them.
    assert np.ptp(cols) > 0.7 * SIZE[0] and cols.size == np.ptp(cols) + 1


def test_legend_draws_a_swatch_and_the_name():
    empty = {"train": ([], [])}
    with_legend = plotting.render_rgb(empty, size=SIZE)
    without = plotting.render_rgb(empty, size=SIZE, legend=False)
    assert color_mask(with_legend, plotting.SERIES_COLORS[0]).any()
    assert not color_mask(without, plotting.SERIES_COLORS[0]).any()
    short = plotting.render_rgb({"a": ([], [])}, size=SIZE)
    ink = [color_mask(img, plotting.TEXT).sum() for img in (short, with_legend)]
    assert ink[1] > ink[0], "the longer name should put more text pixels down"


@pytest.mark.parametrize("series", [
    {},
    {"train": ([], [])},
    {"train": ([3.0], [2.5])},
    {"train": (STEPS, np.full(STEPS.size, 2.0))},
    {"train": ([0.0, 1.0, 2.0], [float("nan"), float("inf"), float("nan")])},
    {"train": ([5.0, 5.0, 5.0], [1.0, 2.0, 3.0])},
    {"train": (STEPS, -1e-7 * STEPS), "val": ([1e6], [3e-9])},
    {"train": ([0.0, 1.0], [1e12, 3e12])},
], ids=["none", "empty", "one-point", "constant", "all-nan", "constant-x", "tiny", "huge"])
def test_edge_cases_render(tmp_path, series):
    path = tmp_path / "edge.png"
    plotting.render_png(path, series, title="edge", size=SIZE)
    header, pixels = read_png(path.read_bytes())
    assert (header["width"], header["height"]) == SIZE
    assert (pixels != 255).any(), "axes and labels should always be drawn"


def test_one_point_gets_a_marker():
    rgb = plotting.render_rgb({"train": ([3.0], [2.5])}, size=SIZE, legend=False)
    assert color_mask(rgb, plotting.SERIES_COLORS[0]).sum() >= 9


def test_nan_and_inf_points_are_skipped():
    with_bad = {"a": ([0, 1, 2, 3, float("nan")], [1, float("nan"), 3, float("-inf"), 9])}
    clean = {"a": ([0, 2], [1, 3])}
    np.testing.assert_array_equal(plotting.render_rgb(with_bad, size=SIZE),
                                  plotting.render_rgb(clean, size=SIZE))


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError, match="3 != 2"):
        plotting.render_rgb({"a": ([0, 1, 2], [1, 2])})


@pytest.mark.parametrize("lo,hi", [(0, 1), (0, 300), (1.37, 7.05), (-3.2, 0.4), (2.5, 2.5),
                                   (0, 0), (1e-7, 3.3e-7), (-2e9, 5e9), (0.95, 1.05), (7, 9)])
@pytest.mark.parametrize("target", [2, 5, 8])
def test_nice_ticks_are_round_and_cover_the_range(lo, hi, target):
    ticks = plotting.nice_ticks(lo, hi, target)
    assert 2 <= len(ticks) <= target + 2
    assert ticks[0] <= lo and ticks[-1] >= hi
    steps = np.diff(ticks)
    np.testing.assert_allclose(steps, steps[0], rtol=1e-9)
    mantissa = steps[0] / 10 ** math.floor(math.log10(steps[0]))
    assert any(math.isclose(mantissa, m, rel_tol=1e-9) for m in (1, 2, 5)), steps[0]
    for t in ticks:  # each tick a whole multiple of the step, without float noise
        assert math.isclose(t / steps[0], round(t / steps[0]), abs_tol=1e-9)


def test_nice_ticks_examples():
    assert plotting.nice_ticks(0, 300, 6) == [0, 50, 100, 150, 200, 250, 300]
    assert plotting.nice_ticks(1.37, 7.05, 6) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert plotting.nice_ticks(0.1, 0.3, 2) == [0.1, 0.2, 0.3]


@pytest.mark.parametrize("ticks,labels", [
    ([0, 50, 100], ["0", "50", "100"]),
    ([0.0, 0.5, 1.0], ["0.0", "0.5", "1.0"]),
    ([-0.05, 0.0, 0.05], ["-0.05", "0.00", "0.05"]),
    ([0, 2e6, 4e6], ["0", "2e6", "4e6"]),
    ([1e-6, 2e-6, 3e-6], ["1e-6", "2e-6", "3e-6"]),
    ([2.5e6, 3.0e6], ["2.5e6", "3.0e6"]),
])
def test_format_ticks(ticks, labels):
    assert plotting.format_ticks(ticks) == labels


def test_font_has_distinct_glyphs_for_the_label_characters():
    chars = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz.-+:/()_%"
    seen = {}
    for ch in chars:
        mask = plotting.text_mask(ch)
        assert mask.shape == (9, 5) and mask.any(), ch
        key = mask.tobytes()
        assert key not in seen, f"{ch!r} draws the same as {seen.get(key)!r}"
        seen[key] = ch
    assert plotting.text_mask("ab", scale=2).shape == (18, 22)


def block_matplotlib(monkeypatch):
    for name in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import` raise ImportError


def test_write_loss_plot_builtin(tmp_path):
    path = tmp_path / "run" / "loss.png"
    used = plotting.write_loss_plot(path, three_series(), title="t", renderer="builtin")
    assert used == "builtin"
    header, _ = read_png(path.read_bytes())
    assert (header["width"], header["height"]) == (640, 400)


def test_write_loss_plot_falls_back_without_matplotlib(tmp_path, monkeypatch):
    block_matplotlib(monkeypatch)
    assert plotting.write_loss_plot(tmp_path / "a.png", three_series()) == "builtin"
    read_png((tmp_path / "a.png").read_bytes())
    with pytest.raises(ImportError):
        plotting.write_loss_plot(tmp_path / "b.png", three_series(), renderer="matplotlib")


def test_write_loss_plot_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="renderer"):
        plotting.write_loss_plot(tmp_path / "a.png", {}, renderer="svg")
    with pytest.raises(ValueError, match="2 != 1"):
        plotting.write_loss_plot(tmp_path / "a.png", {"a": ([0, 1], [1])})
    assert not (tmp_path / "a.png").exists()


def test_write_loss_plot_uses_matplotlib_when_installed(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "loss.png"
    assert plotting.write_loss_plot(path, three_series(), title="t") == "matplotlib"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
