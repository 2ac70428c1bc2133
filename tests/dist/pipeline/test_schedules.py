"""Pipeline schedules, checked with no MPI: exact small cases and simulated execution."""

from __future__ import annotations

from collections import deque

import pytest

from dist.pipeline.schedules import Action, get_schedule, gpipe, one_f_one_b

SHORT = {"forward": "F", "backward": "B", "send_act": "Sa", "recv_act": "Ra",
         "send_grad": "Sg", "recv_grad": "Rg"}
GRID = [(s, m) for s in range(1, 6) for m in range(1, 9)]


def compact(actions: list[Action]) -> str:
    return " ".join(f"{SHORT[a.kind]}{a.micro_batch}" for a in actions)


def simulate(schedule: list[list[Action]]) -> list[list[tuple[str, int]]]:
    """Run every stage's actions with non-blocking sends and blocking receives.

    Messages travel on FIFO channels (MPI's non-overtaking order). Returns each stage's
    trace of (action kind, micro-batch); fails on deadlock or on a message that arrives
    out of the expected order (what a receive gets must be the micro-batch it names).
    """
    n = len(schedule)
    channels: dict[tuple[int, int, str], deque[int]] = {}
    pc = [0] * n
    trace: list[list[tuple[str, int]]] = [[] for _ in range(n)]
    peer = {"send_act": 1, "recv_act": -1, "send_grad": -1, "recv_grad": 1}
    while any(pc[s] < len(schedule[s]) for s in range(n)):
        progressed = False
        for s in range(n):
            while pc[s] < len(schedule[s]):
                a = schedule[s][pc[s]]
                if a.kind in peer:
                    other = s + peer[a.kind]
                    assert 0 <= other < n, f"stage {s}: {a} has no peer stage {other}"
                    payload = "act" if a.kind.endswith("act") else "grad"
                    if a.kind.startswith("send"):
                        channels.setdefault((s, other, payload), deque()).append(a.micro_batch)
                    else:
                        queue = channels.setdefault((other, s, payload), deque())
                        if not queue:
                            break  # blocked on this receive
                        got = queue.popleft()
                        assert got == a.micro_batch, f"stage {s}: {a} received {got}"
                trace[s].append((a.kind, a.micro_batch))
                pc[s] += 1
                progressed = True
        stuck = [str(schedule[s][pc[s]]) for s in range(n) if pc[s] < len(schedule[s])]
        assert progressed, f"deadlock: stages stuck at {stuck}"
    assert all(not q for q in channels.values()), "messages sent but never received"
    return trace


def peak_in_flight(actions: list[Action]) -> int:
    live = peak = 0
    for a in actions:
        if a.kind == "forward":
            live += 1
            peak = max(peak, live)
        elif a.kind == "backward":
            live -= 1
    return peak


def test_gpipe_exact_two_stages_two_micro_batches():
    assert [compact(s) for s in gpipe(2, 2)] == [
        "F0 Sa0 F1 Sa1 Rg0 B0 Rg1 B1",
        "Ra0 F0 Ra1 F1 B0 Sg0 B1 Sg1",
    ]


def test_one_f_one_b_exact_two_stages_three_micro_batches():
    assert [compact(s) for s in one_f_one_b(2, 3)] == [
        "F0 Sa0 F1 Sa1 Rg0 B0 F2 Sa2 Rg1 B1 Rg2 B2",
        "Ra0 F0 B0 Sg0 Ra1 F1 B1 Sg1 Ra2 F2 B2 Sg2",
    ]


def test_one_f_one_b_exact_three_stages_four_micro_batches():
    assert [compact(s) for s in one_f_one_b(3, 4)] == [
        "F0 Sa0 F1 Sa1 F2 Sa2 Rg0 B0 F3 Sa3 Rg1 B1 Rg2 B2 Rg3 B3",
        "Ra0 F0 Sa0 Ra1 F1 Sa1 Rg0 B0 Sg0 Ra2 F2 Sa2 Rg1 B1 Sg1 Ra3 F3 Sa3 Rg2 B2 Sg2 "
        "Rg3 B3 Sg3",
        "Ra0 F0 B0 Sg0 Ra1 F1 B1 Sg1 Ra2 F2 B2 Sg2 Ra3 F3 B3 Sg3",
    ]


def test_single_stage_is_forward_backward_per_micro_batch():
    assert compact(one_f_one_b(1, 3)[0]) == "F0 B0 F1 B1 F2 B2"
    assert compact(gpipe(1, 3)[0]) == "F0 F1 F2 B0 B1 B2"


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,micro", GRID)
def test_every_micro_batch_once_per_stage_and_in_order(name, stages, micro):
    schedule = get_schedule(name)(stages, micro)
    assert len(schedule) == stages
    for s, actions in enumerate(schedule):
        for kind in ("forward", "backward"):
            assert sorted(a.micro_batch for a in actions if a.kind == kind) == list(range(micro))
        position = {(a.kind, a.micro_batch): i for i, a in enumerate(actions)}
        for m in range(micro):
            assert position[("forward", m)] < position[("backward", m)]
            assert (("recv_act", m) in position) == (s > 0)
            assert (("send_grad", m) in position) == (s > 0)
            assert (("send_act", m) in position) == (s < stages - 1)
            assert (("recv_grad", m) in position) == (s < stages - 1)
            if s > 0:
                assert position[("recv_act", m)] < position[("forward", m)]
                assert position[("backward", m)] < position[("send_grad", m)]
            if s < stages - 1:
                assert position[("forward", m)] < position[("send_act", m)]
                assert position[("recv_grad", m)] < position[("backward", m)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,micro", GRID)
def test_simulated_run_completes_and_sends_match_receives(name, stages, micro):
    schedule = get_schedule(name)(stages, micro)
    trace = simulate(schedule)
    assert [len(t) for t in trace] == [len(s) for s in schedule]


@pytest.mark.parametrize("stages,micro", GRID)
def test_one_f_one_b_peak_live_activations(stages, micro):
    for s, actions in enumerate(one_f_one_b(stages, micro)):
        assert peak_in_flight(actions) == min(stages - s, micro)


@pytest.mark.parametrize("stages,micro", GRID)
def test_gpipe_all_forwards_then_all_backwards(stages, micro):
    for actions in gpipe(stages, micro):
        kinds = [a.kind for a in actions if a.kind in ("forward", "backward")]
        assert kinds == ["forward"] * micro + ["backward"] * micro
        assert peak_in_flight(actions) == micro


def test_simulator_detects_deadlock_and_misordered_messages():
    # Both stages receive first: a true deadlock the simulator must report.
    stuck = [[Action("recv_grad", 0), Action("send_act", 0)],
             [Action("recv_act", 0), Action("send_grad", 0)]]
    with pytest.raises(AssertionError, match="deadlock"):
        simulate(stuck)
    swapped = [[Action("send_act", 1), Action("send_act", 0)],
               [Action("recv_act", 0), Action("recv_act", 1)]]
    with pytest.raises(AssertionError, match="received 1"):
        simulate(swapped)


@pytest.mark.parametrize("fn", [gpipe, one_f_one_b])
@pytest.mark.parametrize("bad", [(0, 2), (2, 0), (-1, 1), (2.0, 2), (True, 2)])
def test_bad_sizes_are_rejected_with_the_value(fn, bad):
    with pytest.raises(ValueError, match="expected a positive int"):
        fn(*bad)


def test_unknown_schedule_and_action_kind():
    with pytest.raises(ValueError, match="'interleaved'"):
        get_schedule("interleaved")
    with pytest.raises(ValueError, match="'jump'"):
        Action("jump", 0)
