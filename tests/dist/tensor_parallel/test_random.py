"""RNGStatesTracker and model_parallel_seed: fork isolation, checkpoints, masks across ranks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import autograd as ag
import dist
import gpuplan as gp
from autograd.nn import functional as F
from dist.tensor_parallel import (
    TENSOR_PARALLEL_RNG,
    RNGStatesTracker,
    get_rng_tracker,
    model_parallel_seed,
)

N = 64  # two independent p=0.5 masks of N elements agree with probability 2**-N


@pytest.fixture(autouse=True)
def clean_rng():
    """Leave the default generator and the process-wide tracker as the test found them."""
    gen = ag.random.default_generator
    state, host = gen.get_state(), gen.host.bit_generator.state
    states = get_rng_tracker().get_states()
    yield
    gen.set_state(state)
    gen.host = np.random.default_rng()
    gen.host.bit_generator.state = host
    get_rng_tracker().set_states(states)


def mask() -> np.ndarray:
    """The keep-mask of one default-generator dropout draw over N elements."""
    return F.dropout(ag.tensor(np.ones(N, np.float64)), p=0.5).numpy() != 0


def explicit_mask(seed: int, offset: int) -> np.ndarray:
    x = ag.tensor(np.ones(N, np.float64))
    return F.dropout(x, p=0.5, seed=seed, offset=offset).numpy() != 0


def test_fork_restores_the_default_state_exactly():
    ag.manual_seed(7)
    first, second = mask(), mask()
    tracker = RNGStatesTracker()
    tracker.add("tp", 123)
    ag.manual_seed(7)
    assert np.array_equal(mask(), first)
    with tracker.fork("tp"):
        forked = mask()
    assert ag.random.default_generator.get_state() == (7, N)
    assert np.array_equal(mask(), second)
    # The body drew from the named state, not from the default stream.
    assert np.array_equal(forked, explicit_mask(123, 0))
    assert not np.array_equal(forked, second)
    assert tracker.get_states() == {"tp": (123, N)}


def test_fork_restores_the_default_state_on_exception():
    ag.manual_seed(5)
    tracker = RNGStatesTracker()
    tracker.add("tp", 9)
    with pytest.raises(RuntimeError, match="boom"), tracker.fork("tp"):
        mask()
        raise RuntimeError("boom")
    assert ag.random.default_generator.get_state() == (5, 0)
    # The counters the body used stay consumed, and the name can be forked again.
    assert tracker.get_states() == {"tp": (9, N)}
    with tracker.fork("tp"):
        assert np.array_equal(mask(), explicit_mask(9, N))


def test_named_state_advances_across_forks_and_set_states_replays():
    tracker = RNGStatesTracker()
    tracker.add("a", 11)
    tracker.add("b", 12)
    saved = tracker.get_states()
    with tracker.fork("a"):
        a1 = mask()
    with tracker.fork("b"):
        b1 = mask()
    with tracker.fork("a"):
        a2 = mask()
    assert not np.array_equal(a1, a2)
    assert not np.array_equal(a1, b1)
    assert tracker.get_states() == {"a": (11, 2 * N), "b": (12, N)}
    tracker.set_states(saved)
    with tracker.fork("a"):
        assert np.array_equal(mask(), a1)
    with tracker.fork("a"):
        assert np.array_equal(mask(), a2)


def test_nested_forks_of_different_states_restore_each_level():
    ag.manual_seed(3)
    tracker = RNGStatesTracker()
    tracker.add("outer", 21)
    tracker.add("inner", 22)
    with tracker.fork("outer"):
        with tracker.fork("inner"):
            inner = mask()
        assert ag.random.default_generator.get_state() == (21, 0)
        outer = mask()
    assert ag.random.default_generator.get_state() == (3, 0)
    assert np.array_equal(inner, explicit_mask(22, 0))
    assert np.array_equal(outer, explicit_mask(21, 0))


def test_get_states_is_a_copy():
    tracker = RNGStatesTracker()
    tracker.add("tp", 1)
    states = tracker.get_states()
    states["tp"] = (1, 999)
    states["other"] = (2, 0)
    assert tracker.get_states() == {"tp": (1, 0)}


def test_reset_forgets_every_state():
    tracker = RNGStatesTracker()
    tracker.add("tp", 1)
    tracker.reset()
    assert tracker.get_states() == {} and "tp" not in tracker
    tracker.add("tp", 1)  # name and seed are free again
    assert tracker.names() == ["tp"]


def test_duplicate_name_and_duplicate_seed_are_rejected():
    tracker = RNGStatesTracker()
    tracker.add("a", 1)
    with pytest.raises(gp.InvalidProblem, match=r"RNGStatesTracker.add: argument 'name'.*'a'"):
        tracker.add("a", 2)
    with pytest.raises(gp.InvalidProblem, match=r"argument 'seed'.*'a' uses it.*given 1$"):
        tracker.add("b", 1)
    assert tracker.get_states() == {"a": (1, 0)}


def test_unknown_name_is_rejected_and_leaves_the_default_alone():
    ag.manual_seed(4)
    tracker = RNGStatesTracker()
    tracker.add("a", 1)
    with pytest.raises(gp.InvalidProblem,
                       match=r"RNGStatesTracker.fork: argument 'name': expected an added state "
                             r"\(have \['a'\]\), given 'missing'"), tracker.fork("missing"):
        pass
    assert ag.random.default_generator.get_state() == (4, 0)


def test_forking_a_state_inside_its_own_fork_is_rejected():
    tracker = RNGStatesTracker()
    tracker.add("a", 1)
    with tracker.fork("a"):
        with pytest.raises(gp.InvalidProblem, match="not already forked"), tracker.fork("a"):
            pass
    with tracker.fork("a"):  # usable again after the outer fork ends
        pass


@pytest.mark.parametrize("bad", [{"a": (1,)}, {"a": "12"}, {"a": (1, -1)}, {"a": (1, 0),
                                                                            "b": (1, 5)}])
def test_set_states_rejects_malformed_states(bad):
    tracker = RNGStatesTracker()
    tracker.add("a", 3)
    with pytest.raises(gp.InvalidProblem, match="RNGStatesTracker.set_states"):
        tracker.set_states(bad)
    assert tracker.get_states() == {"a": (3, 0)}


@pytest.mark.parametrize("tp_rank,pp_rank,dp_rank,dp_random,default", [
    (0, 0, 0, False, 1000), (3, 0, 5, False, 1000), (1, 2, 5, False, 1200),
    (1, 2, 5, True, 1250), (0, 0, 3, True, 1030),
])
def test_model_parallel_seed_rule(tp_rank, pp_rank, dp_rank, dp_random, default):
    get_rng_tracker().add("stale", 77)
    tracker = model_parallel_seed(1000, tp_rank, pp_rank=pp_rank, dp_rank=dp_rank,
                                  data_parallel_random=dp_random)
    assert tracker is get_rng_tracker() is dist.get_rng_tracker()
    assert ag.random.default_generator.get_state() == (default, 0)
    assert tracker.get_states() == {TENSOR_PARALLEL_RNG: (default + 2718 + tp_rank, 0)}
    with tracker.fork():  # the default name is the tensor-parallel state
        assert np.array_equal(mask(), explicit_mask(default + 2718 + tp_rank, 0))


def test_model_parallel_seed_rejects_negative_ranks():
    with pytest.raises(gp.InvalidProblem, match=r"model_parallel_seed: argument 'pp_rank'"):
        model_parallel_seed(1, tp_rank=0, pp_rank=-1)


def test_lazy_exports():
    assert dist.RNGStatesTracker is RNGStatesTracker
    assert dist.model_parallel_seed is model_parallel_seed
    assert dist.TENSOR_PARALLEL_RNG == "tensor-parallel"


def gathered(world, m: np.ndarray) -> list[np.ndarray]:
    return [np.asarray(x) for x in world.all_gather_object(m)]


@pytest.mark.mpi
def test_masks_agree_outside_fork_and_differ_inside_across_tp_ranks(world):
    model_parallel_seed(1234, tp_rank=world.rank)
    outside = gathered(world, mask())
    with get_rng_tracker().fork(TENSOR_PARALLEL_RNG):
        inside = gathered(world, mask())
    after = gathered(world, mask())
    assert all(np.array_equal(m, outside[0]) for m in outside)
    assert all(np.array_equal(m, after[0]) for m in after)
    assert not np.array_equal(outside[0], after[0])
    for a, b in itertools.combinations(inside, 2):
        assert not np.array_equal(a, b)


@pytest.mark.mpi
def test_pipeline_stages_get_their_own_default_stream(world):
    # Ranks as a (pp, tp=2) grid: TP pairs share a default mask, stages do not.
    tp_rank, pp_rank = world.rank % 2, world.rank // 2
    model_parallel_seed(99, tp_rank=tp_rank, pp_rank=pp_rank)
    coords = world.all_gather_object((pp_rank, tp_rank))
    outside = gathered(world, mask())
    with get_rng_tracker().fork():
        inside = gathered(world, mask())
    for i, j in itertools.combinations(range(world.size), 2):
        same_stage = coords[i][0] == coords[j][0]
        assert np.array_equal(outside[i], outside[j]) == same_stage
        assert not np.array_equal(inside[i], inside[j])


@pytest.mark.mpi
def test_get_states_set_states_round_trip_reproduces_masks(world):
    model_parallel_seed(42, tp_rank=world.rank)
    tracker = get_rng_tracker()
    with tracker.fork():
        start = mask()  # advance past the start so the checkpoint is mid-stream
    checkpoint = (ag.random.default_generator.get_state(), tracker.get_states())
    with tracker.fork():
        first_inside = mask()
    first_outside = mask()
    assert not np.array_equal(first_inside, start)
    model_parallel_seed(7, tp_rank=world.rank)  # clobber both streams
    default_state, states = checkpoint
    ag.random.default_generator.set_state(default_state)
    tracker.set_states(states)
    with tracker.fork():
        assert np.array_equal(mask(), first_inside)
    assert np.array_equal(mask(), first_outside)
    inside = gathered(world, first_inside)
    assert all(not np.array_equal(a, b) for a, b in itertools.combinations(inside, 2))
