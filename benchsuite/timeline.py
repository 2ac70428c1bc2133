"""Draw a train.py --trace file as a per-rank timeline (PNG, matplotlib).

    python scripts/plot_trace.py runs/x/trace.json docs/figures/trace.png [--steps 2 3]

One row per rank (its process name on the left), one bar per event: forward, backward,
optimizer, evaluate and checkpoint in the compute row, collectives and transfers (all_reduce,
all_gather, reduce_scatter, broadcast, send, recv, send_wait) in a thinner row under it;
`--steps A B` keeps the time from the start of step A to the end of step B.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "optimizer": "#55a868",
          "evaluate": "#8172b3", "checkpoint": "#937860", "all_reduce": "#c44e52",
          "all_gather": "#da8bc3", "reduce_scatter": "#8c8c8c", "broadcast": "#ccb974",
          "send": "#64b5cd", "recv": "#2a9d8f", "send_wait": "#bbbbbb"}


def load(path: Path) -> tuple[dict[int, str], list[dict[str, Any]]]:
    data = json.loads(path.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    return names, spans


def window(spans: list[dict[str, Any]], steps: tuple[int, int] | None) -> tuple[float, float]:
    """(start, end) in µs: the steps' extent on rank 0, or everything."""
    if steps is not None:
        chosen = [e for e in spans if e["name"] == "step" and e["pid"] == 0
                  and steps[0] <= e["args"].get("step", -1) <= steps[1]]
        if not chosen:
            raise ValueError(f"--steps {steps[0]} {steps[1]}: no such step in the trace")
        return min(e["ts"] for e in chosen), max(e["ts"] + e["dur"] for e in chosen)
    return min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans)


def draw(names: dict[int, str], spans: list[dict[str, Any]], out: Path,
         steps: tuple[int, int] | None = None, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lo, hi = window(spans, steps)
    pids = sorted(names or {e["pid"] for e in spans})
    fig, ax = plt.subplots(figsize=(11, 0.9 + 0.8 * len(pids)))
    seen = set()
    for row, pid in enumerate(pids):
        y = len(pids) - 1 - row
        for e in spans:
            if e["pid"] != pid or e["name"] == "step" or e["name"] not in COLORS:
                continue
            start, end = max(e["ts"], lo), min(e["ts"] + e["dur"], hi)
            if end <= start:
                continue
            comm = e.get("cat") == "comm"
            ax.broken_barh([((start - lo) / 1e3, (end - start) / 1e3)],
                           (y - (0.45 if comm else 0.1), 0.3 if comm else 0.5),
                           facecolors=COLORS[e["name"]],
                           label=None if e["name"] in seen else e["name"])
            seen.add(e["name"])
    ax.set_yticks(range(len(pids)))
    ax.set_yticklabels([names.get(p, f"rank {p}") for p in reversed(pids)])
    ax.set_xlabel("ms")
    ax.set_xlim(0, (hi - lo) / 1e3)
    if title:
        ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="plot_trace.py", description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, nargs=2, default=None, metavar=("FIRST", "LAST"))
    ap.add_argument("--title", default="")
    ns = ap.parse_args(argv)
    try:
        names, spans = load(ns.trace)
        if not spans:
            raise ValueError("the trace holds no events")
        draw(names, spans, ns.out, tuple(ns.steps) if ns.steps else None, ns.title)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"plot_trace.py: error: {ns.trace}: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
