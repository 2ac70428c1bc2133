"""Named dropout RNG states for tensor parallelism: a tracker, fork(), and the seeding rule.

Dropout draws ``(seed, offset)`` from ``autograd.random.default_generator``. Under tensor
parallelism two kinds of activations need two kinds of masks:

- Activations outside the TP region (after a RowParallelLinear's all-reduce, residuals,
  embeddings) are replicated on every TP rank. Their dropout masks must agree across TP
  ranks, or the replicas drift apart. They use the default generator.
- Activations inside the TP region (attention probabilities split by head, a
  ColumnParallelLinear's sharded output) are different slices of one tensor. Each slice
  must get an independent mask, or the same pattern repeats in every shard. They are
  dropped inside ``get_rng_tracker().fork("tensor-parallel")``.

`model_parallel_seed(seed, tp_rank, pp_rank, dp_rank, data_parallel_random)` sets both:

    base       = seed + 100 * pp_rank  (+ 10 * dp_rank when data_parallel_random)
    default    = base                  same on all TP ranks of a pipeline stage
    "tensor-parallel" = base + 2718 + tp_rank   different on every TP rank

Pipeline stages hold different layers, so each gets its own streams. Data-parallel
replicas draw the same masks unless ``data_parallel_random`` is set (each replica then
sees other masks on its own micro-batches). Only the dropout stream is tracked: the
default generator's NumPy ``host`` generator (``ag.randn``, initialisation) is untouched.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from autograd import random as _random
from gpuplan.errors import InvalidProblem, describe

TENSOR_PARALLEL_RNG = "tensor-parallel"

# Offsets of the seeding rule (the values Megatron-LM uses, so seeds carry over).
PIPELINE_SEED_STRIDE = 100
DATA_PARALLEL_SEED_STRIDE = 10
TENSOR_PARALLEL_SEED_OFFSET = 2718


def _state(op: str, arg: str, value: object) -> tuple[int, int]:
    """A (seed, offset) pair of ints, offset >= 0."""
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError
        seed, offset = (int(v) for v in value)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise InvalidProblem(describe(op, arg, "a (seed, offset) pair of ints", value)) from None
    if offset < 0:
        raise InvalidProblem(describe(op, arg, "an offset >= 0", value))
    return seed, offset


class RNGStatesTracker:
    """Named (seed, offset) states that `fork` swaps into the default dropout generator.

    Each state is a separate counter stream: a fork draws from the named state where the
    previous fork of that name stopped, and leaves the default generator exactly as it was.
    """

    def __init__(self) -> None:
        self._states: dict[str, tuple[int, int]] = {}
        self._forked: set[str] = set()

    def reset(self) -> None:
        """Forget every state."""
        self._states.clear()

    def names(self) -> list[str]:
        return list(self._states)

    def __contains__(self, name: object) -> bool:
        return name in self._states

    def add(self, name: str, seed: int) -> None:
        """Register a state `name` starting at (seed, 0). Names and seeds must be unique."""
        if name in self._states:
            raise InvalidProblem(describe("RNGStatesTracker.add", "name",
                                          f"a name not yet added (have {self.names()})",
                                          repr(name)))
        seed = int(seed)
        owner = self._owner_of_seed(seed)
        if owner is not None:
            raise InvalidProblem(describe("RNGStatesTracker.add", "seed",
                                          f"a seed no other state uses ({owner!r} uses it)",
                                          seed))
        self._states[name] = (seed, 0)

    def get_states(self) -> dict[str, tuple[int, int]]:
        """A copy of every state, {name: (seed, offset)}, for checkpoints."""
        return dict(self._states)

    def set_states(self, states: Mapping[str, tuple[int, int]]) -> None:
        """Replace every state by `states` (as returned by get_states)."""
        new = {name: _state("RNGStatesTracker.set_states", f"states[{name!r}]", value)
               for name, value in states.items()}
        seeds = [seed for seed, _ in new.values()]
        if len(set(seeds)) != len(seeds):
            raise InvalidProblem(describe("RNGStatesTracker.set_states", "states",
                                          "one seed per state", new))
        self._states = new

    @contextmanager
    def fork(self, name: str = TENSOR_PARALLEL_RNG) -> Iterator[None]:
        """Run the body on state `name`; save its advanced state, restore the default's.

        The default generator's (seed, offset) is restored even when the body raises; the
        named state keeps the counters the body used, so they are never drawn twice.
        """
        if name not in self._states:
            raise InvalidProblem(describe("RNGStatesTracker.fork", "name",
                                          f"an added state (have {self.names()})", repr(name)))
        if name in self._forked:
            # An inner fork would save its state and the outer one then overwrite it with
            # counters the inner already used.
            raise InvalidProblem(describe("RNGStatesTracker.fork", "name",
                                          "a state not already forked", repr(name)))
        generator = _random.default_generator
        saved = generator.get_state()
        generator.set_state(self._states[name])
        self._forked.add(name)
        try:
            yield
        finally:
            self._forked.discard(name)
            self._states[name] = generator.get_state()
            generator.set_state(saved)

    def _owner_of_seed(self, seed: int) -> str | None:
        return next((n for n, (s, _) in self._states.items() if s == seed), None)


_TRACKER = RNGStatesTracker()


def get_rng_tracker() -> RNGStatesTracker:
    """The process-wide tracker (the one `model_parallel_seed` fills)."""
    return _TRACKER


def model_parallel_seed(seed: int, tp_rank: int, pp_rank: int = 0, dp_rank: int = 0,
                        data_parallel_random: bool = False) -> RNGStatesTracker:
    """Seed the default generator and the "tensor-parallel" state by the module's rule.

    default = seed + 100 * pp_rank (+ 10 * dp_rank if data_parallel_random), shared by
    the TP ranks of a stage; "tensor-parallel" = default + 2718 + tp_rank, one per TP rank.
    Resets the process-wide tracker (other states are dropped) and returns it. Like
    ``ag.manual_seed``, it also reseeds the default generator's host draws with `default`.
    """
    op = "model_parallel_seed"
    for arg, rank in (("tp_rank", tp_rank), ("pp_rank", pp_rank), ("dp_rank", dp_rank)):
        if int(rank) < 0:
            raise InvalidProblem(describe(op, arg, "a rank >= 0", rank))
    base = int(seed) + PIPELINE_SEED_STRIDE * int(pp_rank)
    if data_parallel_random:
        base += DATA_PARALLEL_SEED_STRIDE * int(dp_rank)
    _random.default_generator.manual_seed(base)
    tracker = get_rng_tracker()
    tracker.reset()
    tracker.add(TENSOR_PARALLEL_RNG, base + TENSOR_PARALLEL_SEED_OFFSET + int(tp_rank))
    return tracker
