"""``ReplayTrace``: MetaSchedule's random search, the baseline for the evolutionary search.

Each candidate re-samples every decision of a sketch picked at random (of the generated
space or of a user's ``ScheduleFn``), as re-running the stochastic schedule would: no cost
model, no mutation, none of the initial population's heuristics (register tiles that fit,
Ansor's parallel depth). So ``tune_tir(..., strategy="replay-trace")`` measures what the
evolutionary search gains over the chapter's ``random_search`` with the same budget.
It keeps ``SketchPolicy``'s bookkeeping, so it never returns a measured candidate and
resumes from a log the same way.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..database.record import trace_key
from .cost_model import RandomModel
from .evolution import Candidate
from .policy import SketchPolicy
from .space import ScheduleFn

DRAWS_PER_BATCH = 8  # how many times a batch's worth is drawn before the space counts as exhausted


class ReplayTrace(SketchPolicy):
    """``ReplayTrace(task, seed=0, init_search_callbacks=(), space=None)``; ``next_batch``,
    ``update`` and ``preload`` as for ``SketchPolicy``."""

    def __init__(self, task, seed: int = 0, init_search_callbacks: Sequence = (), space: ScheduleFn | None = None):
        super().__init__(task, RandomModel(seed), seed=seed, init_search_callbacks=init_search_callbacks,
                         space=space)

    def next_batch(self, count: int) -> list[Candidate]:
        """Up to ``count`` distinct unmeasured random candidates; fewer only when repeated
        draws find no more (a small space, nearly all measured)."""
        chosen: dict = {}
        for _ in range(DRAWS_PER_BATCH):
            for candidate in self._draw(2 * count):
                if len(chosen) == count:
                    return list(chosen.values())
                if candidate.key in self.measured or candidate.key in chosen:
                    continue
                if self.measured_traces and trace_key(self.trace_of(candidate)) in self.measured_traces:
                    continue
                if not self._replays(candidate):  # never measured, never drawn again
                    self.update([candidate], [np.inf])
                    continue
                chosen[candidate.key] = candidate
        return list(chosen.values())

    def _draw(self, count: int) -> list[Candidate]:
        which = self.rng.integers(len(self.sketches), size=count)
        drawn = []
        for index, sketch in enumerate(self.sketches):
            rows = sketch.sample_uniform(self.rng, int((which == index).sum()))
            drawn += [Candidate(index, tuple(int(v) for v in row)) for row in rows]
        return [drawn[i] for i in self.rng.permutation(len(drawn))]
