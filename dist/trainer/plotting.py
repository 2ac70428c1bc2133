"""Loss-curve PNGs drawn with matplotlib (Agg, no pyplot), from series or from metrics.jsonl.

    write_loss_plot("runs/x/loss.png", {"train": (steps, train), "val": (steps, val)})
    plot_metrics("runs/x/metrics.jsonl", "runs/x/loss.png")
    python -m dist.trainer.plotting runs/x/metrics.jsonl        # the same, from a shell
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuplan.confined_write import atomic_file

Series = Mapping[str, tuple[Sequence[float], Sequence[float]]]


def _clean_series(series: Series) -> list[tuple[str, list[float], list[float]]]:
    """(name, xs, ys) with non-finite points dropped; unequal lengths are the caller's bug."""
    out = []
    for name, (xs, ys) in series.items():
        xs, ys = [float(v) for v in xs], [float(v) for v in ys]
        if len(xs) != len(ys):
            raise ValueError(f"write_loss_plot: series {name!r} has {len(xs)} != {len(ys)} "
                             f"x and y values")
        pairs = zip(xs, ys, strict=True)
        keep = [(x, y) for x, y in pairs if math.isfinite(x) and math.isfinite(y)]
        out.append((name, [x for x, _ in keep], [y for _, y in keep]))
    return out


def write_loss_plot(path: str | os.PathLike, series: Series, *, title: str = "",
                    xlabel: str = "step", ylabel: str = "loss") -> Path:
    """Write a PNG line plot of `series` (name -> (xs, ys)) to `path`; returns the path.

    The file is written beside its final name and renamed into place, so a run killed
    while plotting leaves the previous plot, never a truncated one.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state

    clean = _clean_series(series)
    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for name, xs, ys in clean:
        ax.plot(xs, ys, label=name, linewidth=1.5, marker="o" if len(xs) <= 50 else None,
                markersize=3)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    if clean:
        ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:  # a fresh exclusive temporary file, never a planted link
        fig.savefig(f, format="png")
    return path


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics.jsonl; a last line cut short by a kill is ignored."""
    records = []
    lines = Path(path).read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break  # written while the process died: every earlier line is whole
            raise ValueError(f"{path}: line {i + 1} is not JSON") from None
    return records


def plot_metrics(metrics: str | os.PathLike, png: str | os.PathLike, *,
                 title: str = "") -> Path:
    """Plot the train and validation loss of a metrics.jsonl (scripts/train.py's) to `png`."""
    records = read_metrics(metrics)
    steps = [r["step"] for r in records]
    series = {"train": (steps, [r["train_loss"] for r in records])}
    val = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    if val:
        series["validation"] = ([s for s, _ in val], [v for _, v in val])
    return write_loss_plot(png, series, title=title, ylabel="cross-entropy (nats/token)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Plot the loss curves of a metrics.jsonl.",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("metrics", help="OUT/metrics.jsonl of scripts/train.py")
    ap.add_argument("--out", default=None, help="PNG to write (default: loss.png beside it)")
    ap.add_argument("--title", default="")
    ns = ap.parse_args(argv)
    out = ns.out or Path(ns.metrics).with_name("loss.png")
    try:
        print(plot_metrics(ns.metrics, out, title=ns.title))
    except (OSError, ValueError, KeyError) as exc:
        print(f"plotting.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
