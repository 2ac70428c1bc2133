"""Default random state of autograd: the dropout (seed, offset) stream and host init draws."""

from __future__ import annotations

import numpy as np


class Generator:
    """A seed plus a running offset for the counter-based dropout RNG.

    Every dropout call takes ``(seed, offset)`` and advances the offset by the number of
    elements it masks, so successive calls draw disjoint counters: reproducible on host
    and device from `manual_seed` alone. ``host`` is a NumPy generator for host-side draws
    (``ag.randn``), reset by `manual_seed` as well.
    """

    def __init__(self, seed: int = 0) -> None:
        self.manual_seed(seed)

    def manual_seed(self, seed: int) -> Generator:
        self.seed = int(seed)
        self.offset = 0
        self.host = np.random.default_rng(self.seed)
        return self

    def next_seed_offset(self, count: int) -> tuple[int, int]:
        """(seed, offset) for a draw of `count` elements; reserves them."""
        offset = self.offset
        self.offset += int(count)
        return self.seed, offset

    def get_state(self) -> tuple[int, int]:
        return self.seed, self.offset

    def set_state(self, state: tuple[int, int]) -> None:
        self.seed, self.offset = int(state[0]), int(state[1])


default_generator = Generator(0)


def manual_seed(seed: int) -> Generator:
    """Reseed the default generator (dropout stream and host draws)."""
    return default_generator.manual_seed(seed)
