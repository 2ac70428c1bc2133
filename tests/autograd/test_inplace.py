"""In-place writes to arrays saved for backward: a clear error instead of a wrong gradient."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import autograd as ag
from autograd import inplace, optim
from autograd.function import Function
from autograd.nn import functional as F


class Times(Function):
    """y = k * x, saving nothing (written with array operators: no plan needed)."""

    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        return x * k

    @staticmethod
    def backward(ctx, dy):
        return dy * ctx.k


def leaf(values, device="cpu", requires_grad=True):
    return ag.tensor(np.asarray(values, dtype=np.float64), requires_grad=requires_grad,
                     device=device)


MODIFIED = r"modified in place after the op was recorded"


def test_zero_on_saved_input_raises(device):
    x, w = leaf([1.0, 2.0, 3.0], device), leaf([4.0, 5.0, 6.0], device)
    y = x * w                       # Binary('mul') saves x and w
    with ag.no_grad():  # a leaf that requires grad: as torch, not recorded
        w.zero_()
    with pytest.raises(RuntimeError, match=r"Binary\('mul'\) needs input 1 \(shape \(3,\), "
                                           r"float64\).*" + MODIFIED + r".*Tensor\.zero_\(\)"
                                           r" on a tensor of shape \(3,\), now at version 1"):
        y.sum().backward()
    assert x.grad is None


def test_raw_write_is_the_silently_wrong_gradient_the_check_prevents(device):
    """A raw write through ``.data`` (the escape hatch, as before the check existed) is
    invisible: backward multiplies by the zeroed weights, dL/dx = 0 instead of w."""
    x, w = leaf([1.0, 2.0, 3.0], device), leaf([4.0, 5.0, 6.0], device)
    y = x * w
    w.data[...] = 0
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0, 0.0])


def test_write_through_a_view_reaches_the_saved_array(device):
    x, w = leaf([1.0, 2.0, 3.0, 4.0], device), leaf([4.0, 5.0, 6.0, 7.0], device)
    y = F.gelu(x) * w
    x.detach().reshape(2, 2).zero_()   # same memory as x, saved by gelu
    with pytest.raises(RuntimeError, match=r"Unary\('gelu'\) needs input 0 .*" + MODIFIED):
        y.sum().backward()


def test_saved_input_that_needs_no_grad_is_checked_too(device):
    x, mask = leaf([1.0, 2.0], device), leaf([1.0, 0.0], device, requires_grad=False)
    y = x * mask
    mask.zero_()
    with pytest.raises(RuntimeError, match=r"Binary\('mul'\) needs saved array 1 .*" + MODIFIED):
        y.sum().backward()


def test_saved_output_modified_in_place_raises(device):
    x = leaf([[1.0, 2.0, 3.0]], device)
    y = F.softmax(x, dim=-1)           # saves its output
    z = y * 2.0                        # Scale saves nothing
    y.zero_()
    with pytest.raises(RuntimeError, match=r"Softmax needs saved array 0 \(shape \(1, 3\)"):
        z.sum().backward()


def test_unsaved_input_may_be_modified(device):
    x = leaf([1.0, 2.0], device)
    y = Times.apply(x, k=3.0)
    with ag.no_grad():  # a leaf that requires grad: as torch, not recorded
        x.zero_()
    y.backward(np.ones(2))
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


def test_writes_before_forward_or_after_backward_are_fine(device):
    x, w = leaf([1.0, 2.0], device), leaf([3.0, 4.0], device)
    with ag.no_grad():  # a leaf that requires grad: as torch, not recorded
        w.zero_()
    y = x * w                          # recorded after the write
    y.sum().backward()
    with ag.no_grad():  # a leaf that requires grad: as torch, not recorded
        w.zero_()                          # after backward: the graph is gone
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0])


def test_second_backward_after_a_write_raises(device):
    x, w = leaf([1.0, 2.0], device), leaf([3.0, 4.0], device)
    with ag.Tape() as tape:
        y = (x * w).sum()
    tape.backward(y, retain=True)
    with ag.no_grad():  # a leaf that requires grad: as torch, not recorded
        w.zero_()
    with pytest.raises(RuntimeError, match=MODIFIED):
        tape.backward(y)


@pytest.mark.parametrize("make", [
    lambda ps: optim.SGD(ps, lr=0.1),
    lambda ps: optim.AdamW(ps, lr=0.1),
    lambda ps: optim.AdamW(ps, lr=0.1, foreach=False),
])
def test_optimizer_step_between_forward_and_backward_raises(device, make):
    w, b = leaf([[1.0, 2.0], [3.0, 4.0]], device), leaf([0.5, 0.5], device)
    x = leaf([[1.0, -1.0]], device, requires_grad=False)
    opt = make([w, b])
    F.linear(x, w, b).sum().backward()
    stale = F.linear(x, w, b).sum()    # recorded before the step
    opt.step()
    assert w._version == 1 and b._version == 1
    with pytest.raises(RuntimeError, match=rf"Linear needs input 1 .*{type(opt).__name__}"
                                           r"\.step\(\)"):
        stale.backward()


def test_training_loop_has_no_false_alarm(device):
    w = leaf([[1.0, 2.0], [3.0, 4.0]], device)
    opt = optim.AdamW([w], lr=0.1)
    x = leaf([[1.0, -1.0]], device, requires_grad=False)
    for _ in range(3):
        micro = [F.linear(x, w).sum() for _ in range(2)]   # several graphs alive at once
        for loss in micro:
            loss.backward()
        optim.clip_grad_norm_([w], 0.1)
        opt.step()
        opt.zero_grad(set_to_none=False)
    assert w._version == 3


def test_data_assignment_keeps_the_forward_values(device):
    """``t.data = a`` rebinds the tensor; backward uses what forward saw and is right."""
    x, w = leaf([1.0, 2.0], device), leaf([3.0, 4.0], device)
    y = x * w
    w.data = ag.tensor(np.zeros(2), device=device).data
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 4.0])


def test_load_state_dict_counts_as_a_write():
    lin = ag.nn.Linear(2, 2, seed=0)
    x = leaf([[1.0, 2.0]], requires_grad=False).float()
    y = lin(x).sum()
    lin.load_state_dict({k: v * 0 for k, v in lin.state_dict().items()})
    with pytest.raises(RuntimeError, match=r"Module\.load_state_dict"):
        y.backward()


def test_error_names_both_sites_under_detect_anomaly():
    x, w = leaf([1.0, 2.0]), leaf([3.0, 4.0])
    with ag.detect_anomaly():
        forward_line = sys._getframe().f_lineno + 1
        y = x * w
        write_line = sys._getframe().f_lineno + 2
        with ag.no_grad():  # a leaf that requires grad: as torch, not recorded
            w.zero_()
        with pytest.raises(RuntimeError) as info:
            y.sum().backward()
    message = str(info.value)
    assert f"created at {__file__}:{forward_line}" in message
    assert f"at {__file__}:{write_line}" in message


def test_write_log_forgets_the_oldest_storages(monkeypatch):
    monkeypatch.setattr(inplace, "_MAX_STORAGES", 8)
    monkeypatch.setattr(inplace, "_writes", {})
    temps = [ag.zeros(2) for _ in range(20)]
    for t in temps:
        t.zero_()
    assert len(inplace._writes) <= 8
    newest = inplace._writes[id(temps[-1].data)]
    assert newest[0] == inplace.last_write
