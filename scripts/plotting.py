"""Loss-curve PNGs: matplotlib when installed, else a NumPy + zlib rasterizer with its own font.

    write_loss_plot("runs/x/loss.png", {"train": (steps, train), "val": (steps, val)})

The built-in renderer needs nothing beyond NumPy, so a fresh machine still gets a plot:
white canvas, framed axes with 1/2/5 x 10^k ticks and light grid lines, one anti-aliased
2-px polyline per series (markers when the points are sparse), a legend, a title and axis
labels in a 5x7 bitmap font, written as an 8-bit RGB PNG (filter 0, one IDAT).
"""

from __future__ import annotations

import math
import os
import struct
import zlib
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path

import numpy as np

Series = Mapping[str, tuple[Sequence[float], Sequence[float]]]

# matplotlib's tab10, so both renderers colour a run's series alike.
SERIES_COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
                 (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207)]
BACKGROUND, GRID, FRAME, TEXT = (255, 255, 255), (228, 228, 228), (80, 80, 80), (30, 30, 30)
LEGEND_EDGE = (190, 190, 190)

# 5x9 cells, one hex byte per row (bit 4 = leftmost column). Rows 0-6 hold capitals and
# digits, lowercase has its x-height on rows 2-6, rows 7-8 are descenders; missing rows are 0.
_FONT_HEX = {
    " ": "", "!": "04040404040004", '"': "0A0A", "#": "0A0A1F0A1F0A0A", "$": "040F140E051E04",
    "%": "18190204081303", "&": "0C12140815120D", "'": "040408",
    "(": "02040808080402", ")": "08040202020408", "*": "0004150E150400", "+": "0004041F040400",
    ",": "00000000000C0408", "-": "0000001F", ".": "00000000000C0C", "/": "00010204081000",
    "0": "0E11131519110E", "1": "040C040404040E", "2": "0E11010204081F",
    "3": "1F02040201110E", "4": "02060A121F0202", "5": "1F101E0101110E",
    "6": "0608101E11110E", "7": "1F010204080808", "8": "0E11110E11110E", "9": "0E11110F01020C",
    ":": "000C0C000C0C", ";": "000C0C000C0408", "<": "02040810080402", "=": "00001F001F",
    ">": "08040201020408", "?": "0E110102040004", "@": "0E11010D15150E", "A": "0E11111F111111",
    "B": "1E11111E11111E", "C": "0E11101010110E", "D": "1C12111111121C",
    "E": "1F10101E10101F", "F": "1F10101E101010", "G": "0E11101711110F",
    "H": "1111111F111111", "I": "0E04040404040E", "J": "0702020202120C", "K": "11121418141211",
    "L": "1010101010101F", "M": "111B1515111111", "N": "11111915131111", "O": "0E11111111110E",
    "P": "1E11111E101010", "Q": "0E11111115120D", "R": "1E11111E141211", "S": "0F10100E01011E",
    "T": "1F040404040404", "U": "1111111111110E", "V": "11111111110A04",
    "W": "1111111515150A", "X": "11110A040A1111", "Y": "1111110A040404",
    "Z": "1F01020408101F", "[": "0E08080808080E", "\\": "00100804020100", "]": "0E02020202020E",
    "^": "040A11", "_": "000000000000001F", "`": "080402", "a": "00000E010F110F",
    "b": "1010161911111E", "c": "00000E1010110E", "d": "01010D1311110F",
    "e": "00000E111F100E", "f": "0609081C080808", "g": "00000F1111110F010E",
    "h": "10101619111111", "i": "04000C0404040E", "j": "02000602020202120C",
    "k": "10101214181412", "l": "0C04040404040E", "m": "00001A15151515", "n": "00001619111111",
    "o": "00000E1111110E", "p": "00001E1111111E1010", "q": "00000F1111110F0101",
    "r": "00001619101010", "s": "00000F100E011E", "t": "08081C08080906", "u": "0000111111130D",
    "v": "00001111110A04", "w": "0000111115150A", "x": "0000110A040A11",
    "y": "0000111111110F010E", "z": "00001F0204081F", "{": "02040408040402",
    "|": "04040404040404", "}": "08040402040408", "~": "00000815020000",
}
GLYPH_W, GLYPH_H, ADVANCE, CAP_H = 5, 9, 6, 7
MARGIN, TICK, INSET = 10, 4, 6  # pixels: canvas border, tick length, data inset from the frame


@cache
def _glyph(ch: str) -> np.ndarray:
    rows = bytes.fromhex(_FONT_HEX.get(ch, _FONT_HEX["?"])).ljust(GLYPH_H, b"\0")
    return np.array([[(r >> (GLYPH_W - 1 - c)) & 1 for c in range(GLYPH_W)] for r in rows],
                    dtype=bool)


def text_mask(text: str, scale: int = 1) -> np.ndarray:
    """Bitmap of `text` in the built-in font: bool (9 * scale, (6 * len - 1) * scale)."""
    if not text:
        return np.zeros((GLYPH_H * scale, 0), dtype=bool)
    cells = [np.pad(_glyph(ch), ((0, 0), (0, ADVANCE - GLYPH_W))) for ch in text]
    mask = np.concatenate(cells, axis=1)[:, : ADVANCE * len(text) - (ADVANCE - GLYPH_W)]
    return mask.repeat(scale, axis=0).repeat(scale, axis=1)


def nice_ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Evenly spaced ticks, step in {1, 2, 5} x 10^k, the first <= lo and the last >= hi.

    The step is the smallest nice one at least (hi - lo) / target, so there are at most
    target + 2 ticks. An empty range (lo == hi) is widened by 5% of |lo| (or by 1 at 0).
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"nice_ticks: need finite bounds, got lo={lo}, hi={hi}")
    lo, hi = min(lo, hi), max(lo, hi)
    if lo == hi:
        pad = abs(lo) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(target, 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw * (1 - 1e-9))
    first = math.floor(lo / step + 1e-9)
    last = math.ceil(hi / step - 1e-9)
    # Re-rounding k * step to 12 significant digits drops float noise like 0.30000000000000004.
    return [float(f"{k * step:.12g}") for k in range(first, last + 1)]


def format_ticks(ticks: Sequence[float]) -> list[str]:
    """Tick labels with just enough decimals for the step; 1e6 and up or tiny steps in e-form."""
    ticks = list(ticks)
    if not ticks:
        return []
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else abs(ticks[0]) or 1.0
    top = max(abs(t) for t in ticks)
    step_exp = math.floor(math.log10(step) + 1e-9)
    if top >= 1e6 or step_exp < -4:
        digits = max(0, math.floor(math.log10(top) + 1e-9) - step_exp)
        return [_compact_e(f"{t:.{digits}e}") if abs(t) > step * 1e-9 else "0" for t in ticks]
    decimals = max(0, -step_exp)
    return [f"{0.0 if abs(t) < step * 1e-9 else t:.{decimals}f}" for t in ticks]


def _compact_e(text: str) -> str:
    mantissa, exp = text.split("e")
    return f"{mantissa}e{int(exp)}"


def _clean_series(series: Series) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, xs, ys) float64 arrays with the points where either coordinate is NaN/inf dropped."""
    out = []
    for name, (xs, ys) in series.items():
        x = np.asarray(xs, dtype=np.float64).ravel()
        y = np.asarray(ys, dtype=np.float64).ravel()
        if x.shape != y.shape:
            raise ValueError(f"plot series {name!r}: Expect: len(xs) == len(ys)  "
                             f"Actual: {x.size} != {y.size}")
        keep = np.isfinite(x) & np.isfinite(y)
        out.append((str(name), x[keep], y[keep]))
    return out


def _paint(rgb: np.ndarray, alpha: np.ndarray, color, top: int = 0, left: int = 0) -> None:
    """rgb <- (1 - alpha) * rgb + alpha * color over the window at (top, left), clipped."""
    h, w = alpha.shape
    t0, l0 = max(top, 0), max(left, 0)
    t1, l1 = min(top + h, rgb.shape[0]), min(left + w, rgb.shape[1])
    if t0 >= t1 or l0 >= l1:
        return
    a = alpha[t0 - top : t1 - top, l0 - left : l1 - left].astype(np.float32)[..., None]
    win = rgb[t0:t1, l0:l1].astype(np.float32)
    rgb[t0:t1, l0:l1] = np.rint(win * (1 - a) + np.float32(color) * a).astype(np.uint8)


def _fill(rgb: np.ndarray, top: int, left: int, bottom: int, right: int, color) -> None:
    """Fill rows top..bottom and columns left..right, both inclusive."""
    rgb[max(top, 0) : bottom + 1, max(left, 0) : right + 1] = color


def _text(rgb, text, x, y, color=TEXT, scale=1, align="left", rotate=False) -> None:
    """Draw `text` with its cap-top at row y; x is its left, centre or right end per `align`."""
    mask = text_mask(text, scale)
    if rotate:  # reads bottom to top; x is then the left column and y the vertical centre
        mask = np.rot90(mask)
        _paint(rgb, mask, color, y - mask.shape[0] // 2, x)
        return
    shift = {"left": 0, "center": mask.shape[1] // 2, "right": mask.shape[1]}[align]
    _paint(rgb, mask, color, y, x - shift)


def _segment_alpha(alpha: np.ndarray, a, b, half_width: float) -> None:
    """alpha <- max(alpha, coverage of the capsule of radius half_width around segment a-b)."""
    pad = half_width + 1.0
    c0, c1 = int(math.floor(min(a[0], b[0]) - pad)), int(math.ceil(max(a[0], b[0]) + pad))
    r0, r1 = int(math.floor(min(a[1], b[1]) - pad)), int(math.ceil(max(a[1], b[1]) + pad))
    c0, r0 = max(c0, 0), max(r0, 0)
    c1, r1 = min(c1, alpha.shape[1] - 1), min(r1, alpha.shape[0] - 1)
    if c0 > c1 or r0 > r1:
        return
    py, px = np.mgrid[r0 : r1 + 1, c0 : c1 + 1].astype(np.float64)
    dx, dy = b[0] - a[0], b[1] - a[1]
    length2 = dx * dx + dy * dy
    t = np.zeros_like(px) if length2 == 0 else ((px - a[0]) * dx + (py - a[1]) * dy) / length2
    t = np.clip(t, 0.0, 1.0)
    dist = np.hypot(px - a[0] - t * dx, py - a[1] - t * dy)
    cover = np.clip(half_width + 0.5 - dist, 0.0, 1.0)
    win = alpha[r0 : r1 + 1, c0 : c1 + 1]
    np.maximum(win, cover, out=win)


def _thin(px: np.ndarray, py: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep first, last, lowest and highest point per pixel column: same picture, fewer segments."""
    if px.size <= max_points or np.any(np.diff(px) < 0):
        return px, py
    col = np.floor(px).astype(np.int64)
    starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
    ends = np.r_[starts[1:], px.size] - 1
    by_height = np.lexsort((py, col))  # groups stay in place since col is non-decreasing
    keep = np.unique(np.concatenate([starts, ends, by_height[starts], by_height[ends]]))
    return px[keep], py[keep]


def _legend_box(names: list[str]) -> tuple[int, int]:
    width = 8 + 20 + 6 + max(text_mask(n).shape[1] for n in names) + 8
    return width, 6 + 13 * len(names) + 3


def _draw_legend(rgb, names, marked, ink, plot) -> None:
    """Legend in the plot corner that covers the least ink (upper right on a tie).

    Each row is a line swatch in the series colour, with a marker if its curve has them.
    """
    top, left, bottom, right = plot
    w, h = _legend_box(names)
    corners = [(top + 8, right - 8 - w), (top + 8, left + 8), (bottom - 8 - h, right - 8 - w),
               (bottom - 8 - h, left + 8)]
    y, x = min(corners, key=lambda c: ink[c[0] : c[0] + h, c[1] : c[1] + w].sum())
    _fill(rgb, y, x, y + h - 1, x + w - 1, LEGEND_EDGE)
    _fill(rgb, y + 1, x + 1, y + h - 2, x + w - 2, BACKGROUND)
    for i, (name, with_marker) in enumerate(zip(names, marked, strict=True)):
        cy = y + 6 + 13 * i + CAP_H // 2
        swatch = np.zeros((9, 21))
        _segment_alpha(swatch, (0, 4), (20, 4), 1.0)
        if with_marker:
            _disc_alpha(swatch, 10, 4, 2.5)
        _paint(rgb, swatch, SERIES_COLORS[i % len(SERIES_COLORS)], cy - 4, x + 8)
        _text(rgb, name, x + 8 + 20 + 6, cy - CAP_H // 2)


def _disc_alpha(alpha: np.ndarray, cx: float, cy: float, radius: float) -> None:
    _segment_alpha(alpha, (cx, cy), (cx, cy), radius)


def render_rgb(series: Series, *, title: str = "", xlabel: str = "step", ylabel: str = "loss",
               size: tuple[int, int] = (640, 400), legend: bool = True) -> np.ndarray:
    """Rasterize the series into an RGB uint8 image of shape (height, width, 3).

    Args:
        series: name -> (xs, ys); NaN/inf points are skipped, a series may be empty.
        size: (width, height) in pixels.
        legend: draw the legend box (tests turn it off to find the curves alone).
    """
    width, height = size
    clean = _clean_series(series)
    xs = np.concatenate([x for _, x, _ in clean] + [np.zeros(0)])
    ys = np.concatenate([y for _, _, y in clean] + [np.zeros(0)])
    x_lo, x_hi = (float(xs.min()), float(xs.max())) if xs.size else (0.0, 1.0)
    y_lo, y_hi = (float(ys.min()), float(ys.max())) if ys.size else (0.0, 1.0)

    top = MARGIN + (2 * CAP_H + 12 if title else 4)
    bottom = height - 1 - MARGIN - TICK - 3 - GLYPH_H - (CAP_H + 8 if xlabel else 0)
    yticks = nice_ticks(y_lo, y_hi, max(2, (bottom - top) // 50))
    ylabels = format_ticks(yticks)
    left = (MARGIN + (GLYPH_H + 8 if ylabel else 0) + max(text_mask(s).shape[1] for s in ylabels)
            + TICK + 4)
    right = width - 1 - 16
    for target in range(max(2, (right - left) // 60), 0, -1):
        xticks = nice_ticks(x_lo, x_hi, target)
        xlabels = format_ticks(xticks)
        spacing = (right - left - 2 * INSET) / max(len(xticks) - 1, 1)
        if max(text_mask(s).shape[1] for s in xlabels) + 12 <= spacing:
            break

    x_scale = (right - left - 2 * INSET) / (xticks[-1] - xticks[0])
    y_scale = (bottom - top - 2 * INSET) / (yticks[-1] - yticks[0])

    def to_px(v):
        return left + INSET + (v - xticks[0]) * x_scale

    def to_py(v):
        return bottom - INSET - (v - yticks[0]) * y_scale

    rgb = np.empty((height, width, 3), dtype=np.uint8)
    rgb[:] = BACKGROUND
    for t, label in zip(xticks, xlabels, strict=True):
        c = round(to_px(t))
        _fill(rgb, top + 1, c, bottom - 1, c, GRID)
        _fill(rgb, bottom + 1, c, bottom + TICK, c, FRAME)
        _text(rgb, label, c, bottom + TICK + 3, align="center")
    for t, label in zip(yticks, ylabels, strict=True):
        r = round(to_py(t))
        _fill(rgb, r, left + 1, r, right - 1, GRID)
        _fill(rgb, r, left - TICK, r, left - 1, FRAME)
        _text(rgb, label, left - TICK - 3, r - CAP_H // 2, align="right")
    for r0, c0, r1, c1 in [(top, left, top, right), (bottom, left, bottom, right),
                           (top, left, bottom, left), (top, right, bottom, right)]:
        _fill(rgb, r0, c0, r1, c1, FRAME)

    ink = np.zeros((height, width), dtype=np.float32)
    marked = []
    for i, (_, x, y) in enumerate(clean):
        px, py = _thin(to_px(x), to_py(y), 4 * (right - left))
        alpha = np.zeros((height, width), dtype=np.float32)
        for k in range(px.size - 1):
            _segment_alpha(alpha, (px[k], py[k]), (px[k + 1], py[k + 1]), 1.0)
        # Markers only where points are at least 8 px apart on average: denser, they blot.
        marked.append(px.size == 1 or (px.size > 1 and np.ptp(px) / (px.size - 1) >= 8))
        if marked[-1]:
            for cx, cy in zip(px, py, strict=True):
                _disc_alpha(alpha, cx, cy, 2.5)
        alpha[: top + 1], alpha[bottom:], alpha[:, : left + 1], alpha[:, right:] = 0, 0, 0, 0
        _paint(rgb, alpha, SERIES_COLORS[i % len(SERIES_COLORS)])
        np.maximum(ink, alpha, out=ink)

    if legend and clean:
        _draw_legend(rgb, [name for name, _, _ in clean], marked, ink, (top, left, bottom, right))
    if title:
        _text(rgb, title, width // 2, MARGIN, scale=2, align="center")
    if xlabel:
        _text(rgb, xlabel, (left + right) // 2, bottom + TICK + 3 + GLYPH_H + 7, align="center")
    if ylabel:
        _text(rgb, ylabel, MARGIN, (top + bottom) // 2, rotate=True)
    return rgb


def encode_png(rgb: np.ndarray) -> bytes:
    """8-bit RGB PNG bytes: signature, IHDR, one IDAT of filter-0 scanlines, IEND."""
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"encode_png: Expect: uint8 (h, w, 3)  Actual: {rgb.dtype} {rgb.shape}")
    height, width, _ = rgb.shape
    scanlines = np.zeros((height, 1 + 3 * width), dtype=np.uint8)  # leading 0 = filter "None"
    scanlines[:, 1:] = rgb.reshape(height, 3 * width)

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # depth 8, colour type 2
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(scanlines.tobytes(), 6)) + chunk(b"IEND", b""))


def render_png(path: str | os.PathLike, series: Series, *, title: str = "", xlabel: str = "step",
               ylabel: str = "loss", size: tuple[int, int] = (640, 400),
               legend: bool = True) -> None:
    """Draw the series with the built-in renderer and write them to `path` as a PNG."""
    rgb = render_rgb(series, title=title, xlabel=xlabel, ylabel=ylabel, size=size, legend=legend)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(encode_png(rgb))


def _render_matplotlib(path, series: Series, title: str, xlabel: str, ylabel: str) -> None:
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state

    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    ax = fig.subplots()
    clean = _clean_series(series)
    for i, (name, x, y) in enumerate(clean):
        color = [c / 255 for c in SERIES_COLORS[i % len(SERIES_COLORS)]]
        ax.plot(x, y, color=color, label=name, linewidth=1.5,
                marker="o" if x.size <= 50 else None, markersize=3)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    if clean:
        ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(os.fspath(path), format="png")


def write_loss_plot(path: str | os.PathLike, series: Series, *, title: str = "",
                    xlabel: str = "step", ylabel: str = "loss", renderer: str = "auto") -> str:
    """Write a PNG line plot of `series` (name -> (xs, ys)) and return the renderer used.

    renderer: "auto" (matplotlib if it imports and works, else built-in), "matplotlib"
    (errors propagate) or "builtin". Returns "matplotlib" or "builtin".
    """
    if renderer not in ("auto", "matplotlib", "builtin"):
        raise ValueError(f"write_loss_plot: renderer must be auto, matplotlib or builtin, "
                         f"got {renderer!r}")
    _clean_series(series)  # shape errors are the caller's bug: raise them before any fallback
    if renderer != "builtin":
        try:
            _render_matplotlib(path, series, title, xlabel, ylabel)
            return "matplotlib"
        except Exception:
            # The end of a long run must still leave a plot, whatever is wrong with matplotlib.
            if renderer == "matplotlib":
                raise
    render_png(path, series, title=title, xlabel=xlabel, ylabel=ylabel)
    return "builtin"
