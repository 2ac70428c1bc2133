"""scripts/plot_trace.py: a trace of two ranks becomes a PNG; --steps keeps one step; a
trace without events or a missing step is one error line."""

from __future__ import annotations

import json

from benchsuite import timeline


def _trace(path, events):
    meta = [{"name": "process_name", "ph": "M", "pid": r, "tid": 0,
             "args": {"name": f"rank {r} (dp {r}, pp 0, tp 0)"}} for r in (0, 1)]
    path.write_text(json.dumps({"traceEvents": meta + events, "displayTimeUnit": "ms"}))


def _x(name, pid, ts, dur, cat="compute", **args):
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": 0,
            "args": args}


def test_a_two_rank_trace_is_drawn(tmp_path, capsys):
    events = []
    for pid in (0, 1):
        events += [_x("step", pid, 0, 100, step=1), _x("forward", pid, 0, 30),
                   _x("backward", pid, 30, 50), _x("all_reduce", pid, 80, 10, "comm",
                                                   bytes=64, peer=None),
                   _x("optimizer", pid, 90, 10), _x("step", pid, 100, 90, step=2),
                   _x("forward", pid, 100, 40)]
    _trace(tmp_path / "t.json", events)
    out = tmp_path / "t.png"
    assert timeline.main([str(tmp_path / "t.json"), str(out), "--steps", "2", "2"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    names, spans = timeline.load(tmp_path / "t.json")
    assert names[1] == "rank 1 (dp 1, pp 0, tp 0)"
    assert timeline.window(spans, (2, 2)) == (100, 190)


def test_empty_trace_and_missing_step_are_one_line(tmp_path, capsys):
    _trace(tmp_path / "e.json", [])
    assert timeline.main([str(tmp_path / "e.json"), str(tmp_path / "e.png")]) == 2
    assert "the trace holds no events" in capsys.readouterr().err
    _trace(tmp_path / "s.json", [_x("step", 0, 0, 5, step=1), _x("forward", 0, 0, 5)])
    assert timeline.main([str(tmp_path / "s.json"), str(tmp_path / "s.png"), "--steps", "4",
                          "4"]) == 2
    assert "--steps 4 4: no such step in the trace" in capsys.readouterr().err
