"""train.py --trace PATH: one Chrome trace-event JSON for every rank (one pid per rank, named
by its mesh coordinates) holding the design contract's event names: forward and backward per
micro-batch, all_reduce of the data-parallel gradients, send/recv between pipeline stages,
optimizer, evaluate, checkpoint, step; well-formed times; a bad path is one line."""

from __future__ import annotations

import json

from tests.scripts.test_train import TINY, _errors, run, run_many

STEPS = ["--steps", "2", "--eval-interval", "2"]


def _events(path) -> list[dict]:
    data = json.loads(path.read_text())
    assert data["displayTimeUnit"] == "ms"
    return data["traceEvents"]


def test_trace_of_a_dp2_and_a_pp2_run(tmp_path):
    dp = [*TINY, *STEPS, "--dp", "2", "--tp", "1", "--pp", "1", "--micro-batches", "2",
          "--out", str(tmp_path / "dp"), "--trace", str(tmp_path / "dp.json")]
    pp = [*TINY, *STEPS, "--dp", "1", "--tp", "1", "--pp", "2", "--out", str(tmp_path / "pp"),
          "--trace", str(tmp_path / "pp.json")]
    for res in run_many([(2, dp), (2, pp)], timeout=240):
        assert res.returncode == 0, res.stderr[-3000:]
        assert "trace: " in res.stdout
    for name, moves in (("dp", {"all_reduce"}), ("pp", {"send", "recv"})):
        events = _events(tmp_path / f"{name}.json")
        meta = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
        assert sorted(e["pid"] for e in meta) == [0, 1]
        assert all(e["args"]["name"].startswith(f"rank {e['pid']} (dp ") for e in meta)
        spans = [e for e in events if e["ph"] == "X"]
        assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
        for pid in (0, 1):
            mine = {e["name"] for e in spans if e["pid"] == pid}
            assert {"forward", "backward", "optimizer", "step", "evaluate",
                    "checkpoint"} <= mine, (name, pid, mine)
        names = {e["name"] for e in spans}
        assert moves <= names, (name, names)
        comm = [e for e in spans if e["cat"] == "comm" and e["name"] != "send_wait"]
        assert comm and all(e["args"]["bytes"] > 0 for e in comm)
        steps = [e for e in spans if e["name"] == "step" and e["pid"] == 0]
        assert [e["args"]["step"] for e in steps] == [1, 2]
        forwards = [e for e in spans if e["name"] == "forward" and e["pid"] == 0]
        assert {0, 1} <= {e["args"]["micro_batch"] for e in forwards}  # 2 or 4 per step
        # Each step's work lies inside its step span.
        first = steps[0]
        inside = [e for e in forwards if e["ts"] < first["ts"] + first["dur"]]
        assert all(e["ts"] >= first["ts"] for e in inside) and inside


def test_a_trace_path_in_a_missing_folder_is_one_line(tmp_path):
    res = run(1, *TINY, "--steps", "1", "--out", str(tmp_path / "o"), "--trace",
              str(tmp_path / "nope" / "t.json"))
    assert res.returncode == 2 and _errors(res) == [
        f"train.py: error: --trace: a file path in an existing folder, given "
        f"{tmp_path / 'nope' / 't.json'}"], res.stderr
