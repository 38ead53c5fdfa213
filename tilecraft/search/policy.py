"""``SketchPolicy``: Ansor's search policy over a task's sketches.

It owns what the search knows about one task: the sketches, the feature space, the cost
model with the measurements it was trained on, the candidates already measured (never
measured again) and the best ones (which seed each population). Two of its choices are
policies of their own, switchable by name: how the sketches share a round
(``sketch_policy``: "uniform" as in Ansor, or "bandit") and how mutations are chosen
(``mutation_policy``: "fixed" weights as in Ansor, or "learned" from predicted gains).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from ..database.best import for_learning
from ..database.log import load_records
from ..database.record import TuningRecord, trace_key
from ..codegen.gpu_verify import verify_gpu
from ..errors import ScheduleError
from ..ir.lower import lower
from ..schedule.trace import Trace
from .bandit import SKETCH_POLICIES
from .cost_model import CostModel, XGBModel
from .default import JOBS_PER_CORE, default_row
from .evolution import Candidate, SearchParams, evolutionary_search, rows_by_sketch
from .features import FeatureSpace
from .mutation_predictor import MUTATION_POLICIES, FixedMutations
from .shared_model import SharedCostModel
from .space import ScheduleFn, Sketch, generate_sketches


class SketchPolicy:
    """Ansor's search policy for one task: sketches, evolutionary search ranked by a cost model.

    ``space``: a ``ScheduleFn`` to search instead of the sketches of the sketch rules;
    ``program_cost_model``: a ``CostModel`` of this task's own (an ``XGBModel`` if None), or
    a ``SharedCostModel`` that several tasks' policies learn together.
    Each round (``next_batch``) evolves a population of candidates of the sketches, ranked
    by the cost model, and proposes the most promising not yet measured; ``update`` tells
    it the measured costs. The first round also offers every sketch's rule-made default
    schedule, so tuning never ends below the untuned kernel.

    Args:
        task: The ``SearchTask``.
        program_cost_model: The cost model, as above.
        params: The evolutionary search's parameters (``SearchParams``); None for Ansor's.
        seed: Seed of the search.
        init_search_callbacks: Objects whose ``apply(policy)`` runs once the policy is made,
            e.g. ``PreloadMeasuredStates(log)``.
        space: A ``ScheduleFn``; None for the sketches of the sketch rules.
        sketch_policy: How the sketches share a round: ``"uniform"`` (Ansor's) or ``"bandit"``.
        mutation_policy: How mutations are chosen: ``"fixed"`` weights (Ansor's) or ``"learned"``.

    Raises:
        ValueError: If ``sketch_policy`` or ``mutation_policy`` is unknown.
        ScheduleError: If ``space``'s function fails on the task's DAG.

    Example:
        Ansor's spelling of resuming from a log::

            policy = tc.SketchPolicy(task, tc.XGBModel(), init_search_callbacks=[tc.PreloadMeasuredStates(log)])
            task.tune(options, search_policy=policy)
    """

    def __init__(self, task, program_cost_model: CostModel | SharedCostModel | None = None,
                 params: SearchParams | None = None,
                 seed: int = 0, init_search_callbacks: Sequence = (), space: ScheduleFn | None = None,
                 sketch_policy: str = "uniform", mutation_policy: str = "fixed"):
        self.task = task
        self.sketches = (space.generate(task.compute_dag, task.target) if space is not None
                         else generate_sketches(task.compute_dag, target=task.target))
        self.feature_space = FeatureSpace(self.sketches)
        if isinstance(program_cost_model, SharedCostModel):
            program_cost_model = program_cost_model.view(task, self.feature_space.names)
        self.model = program_cost_model if program_cost_model is not None else XGBModel()
        self.params = params or SearchParams()
        self.rng = np.random.default_rng(seed)
        self.min_parallel = JOBS_PER_CORE * getattr(task.target, "num_cores", 1)  # CPU parallel loops only
        self.measured: set = set()
        self.measured_traces: set[str] = set()  # from logs: traces no sketch here stands for
        self.best: list[tuple[float, Candidate]] = []
        self.rejected = 0  # candidates the GPU verifier refused before any build
        self.matrix_suffices: dict[int, bool] = {}  # GPU sketch -> its decisions alone tell its limits
        # Offered in the first batch even when a log was preloaded: the defaults improve between
        # releases, and a log tuned before may hold nothing as fast as today's default.
        self.defaults_pending = self.params.defaults_first
        self.sketch_policy = self.mutation_policy = None
        self.use(sketch_policy, mutation_policy)
        for log in getattr(self.model, "pending_logs", ()):  # XGBModel().update_from_file(log)
            self.preload(load_records(log, task.workload_key, task.target), mark_measured=False)
        self.model.pending_logs = []
        for callback in init_search_callbacks:
            callback.apply(self)
        if self.params.sketch_quotas is None:  # a taught model ranks the sketches better than a young bandit
            self.params = replace(self.params, sketch_quotas=not self.model.is_trained)

    def use(self, sketch_policy: str | None = None, mutation_policy: str | None = None) -> None:
        """Switch the sketch policy and the mutation policy by name; None, or the name of
        the one in use, keeps it with what it has learned."""
        for kind, name, known in (("sketch_policy", sketch_policy, SKETCH_POLICIES),
                                  ("mutation_policy", mutation_policy, MUTATION_POLICIES)):
            if name is not None and name not in known:
                raise ValueError(f"{kind}={name!r} is unknown; use one of {', '.join(map(repr, known))}")
        if sketch_policy is not None and sketch_policy != getattr(self.sketch_policy, "name", None):
            self.sketch_policy = SKETCH_POLICIES[sketch_policy](len(self.sketches), tie=self.params.sketch_tie,
                                                                 temperature=self.params.sketch_temperature)
            for cost, candidate in self.best:
                self.sketch_policy.update([candidate.sketch], [cost])
        if mutation_policy is not None and mutation_policy != getattr(self.mutation_policy, "name", None):
            self.mutation_policy = MUTATION_POLICIES[mutation_policy](self.sketches)

    def trace_of(self, candidate: Candidate) -> Trace:
        """The trace of a candidate: its sketch's trace with the candidate's decisions."""
        return self.sketches[candidate.sketch].trace_of(candidate.row)

    def finalists(self, count: int) -> list[tuple[Trace, str]]:
        """What to re-measure when tuning ends (``tune/remeasure.py``): the ``count`` fastest
        distinct candidates measured, then the fastest of every other sketch, as traces
        with their sketch names. A sketch's own best may lose to another's by noise alone."""
        chosen: dict = {}
        for _, candidate in self.best:
            if len(chosen) == count:
                break
            chosen.setdefault(candidate.key, candidate)
        for sketch in range(len(self.sketches)):
            first = next((c for _, c in self.best if c.sketch == sketch), None)
            if first is not None:
                chosen.setdefault(first.key, first)
        return [(self.trace_of(c), self.sketches[c.sketch].name) for c in chosen.values()]

    def features(self, candidates: Sequence[Candidate]) -> np.ndarray:
        """The cost model's feature rows of ``candidates`` (NaN where a feature does not apply)."""
        rows = np.full((len(candidates), len(self.feature_space.names)), np.nan)
        for sketch, (positions, decisions) in rows_by_sketch(candidates).items():
            rows[positions] = self.feature_space.features(sketch, decisions)
        return rows

    def next_batch(self, count: int) -> list[Candidate]:
        """Up to ``count`` unmeasured candidates, the most promising by the model. Those
        whose compute locations do not replay, or that break the GPU's limits, are learned
        as failures and replaced, so a round (a scheduler's warm-up too) measures as many
        as it asks for."""
        chosen: list[Candidate] = []
        for _ in range(10):
            proposed = self._propose(count - len(chosen), {c.key for c in chosen})
            invalid = [c for c in proposed if not self._replays(c)]
            chosen += [c for c in proposed if c not in invalid]
            if not invalid:
                break
            self.update(invalid, [np.inf] * len(invalid))  # never measured (Ansor drops them when sampling)
        return chosen

    def _propose(self, count: int, pending: set) -> list[Candidate]:
        def score(sketch: int, rows: np.ndarray) -> np.ndarray:
            scores = self.model.predict(self.feature_space.features(sketch, rows))
            if self.sketches[sketch].gpu_limits:  # never chosen, never a parent
                kept = self.sketches[sketch].within_gpu_limits(rows) & self.sketches[sketch].full_warps(rows)
                scores = np.where(kept, scores, -np.inf)
            return scores

        seeds = [c for _, c in self.best]
        # A warm-up model's scores are random: a learned policy would learn noise from them.
        mutator = self.mutation_policy if self.model.is_trained else FixedMutations(self.sketches)
        chosen = evolutionary_search(self.sketches, score, count, self.measured | pending, seeds, self.rng,
                                     self.min_parallel, self.params, self.sketch_policy.shares(), mutator)
        if self.defaults_pending:  # so tuning never ends below them
            self.defaults_pending = False
            defaults = [c for c in (Candidate(n, tuple(int(v) for v in default_row(s, self.min_parallel)))
                                    for n, s in enumerate(self.sketches)) if c.key not in self.measured]
            keys = {c.key for c in defaults}
            chosen = (defaults + [c for c in chosen if c.key not in keys])[:count]
        if self.measured_traces:
            chosen = [c for c in chosen if trace_key(self.trace_of(c)) not in self.measured_traces]
        return chosen

    def _replays(self, candidate: Candidate) -> bool:
        """Compute locations depend on each other (a block's consumer may itself be
        inlined), so a candidate with several of them may not replay; check it here. A GPU
        candidate is lowered and verified (for what its decisions do not tell, as in a
        user's sketch rule), as MetaSchedule's postprocessors do before measuring. Where every
        limit that the decisions change is in the sketch's forms, and its default candidate
        verifies (the structure), the decision matrix's check has said it all: lowering each
        proposal again, before the builder lowers it, would only cost time."""
        sketch = self.sketches[candidate.sketch]
        if sketch.gpu_limits:
            if not sketch.within_gpu_limits(np.array([candidate.row]))[0]:  # a random draw the sampler kept
                self.rejected += 1
                return False
            if candidate.sketch not in self.matrix_suffices:
                self.matrix_suffices[candidate.sketch] = (sketch.limits_in_decisions
                                                          and self._verifies(sketch, default_row(sketch, 1)))
            if self.matrix_suffices[candidate.sketch] or self._verifies(sketch, candidate.row):
                return True
            self.rejected += 1
            return False
        if sum(slot.role == "location" for slot in sketch.slots) < 2:
            return True
        try:
            sketch.trace_of(candidate.row).replay(self.task.compute_dag)
        except ScheduleError:
            return False
        return True

    def _verifies(self, sketch: Sketch, row) -> bool:
        try:
            verify_gpu(lower(sketch.trace_of(row).replay(self.task.compute_dag)), self.task.target)
        except ScheduleError:  # a GpuLimitError too
            return False
        return True

    def update(self, candidates: Sequence[Candidate], costs: Sequence[float], mark_measured: bool = True) -> None:
        """Record measured mean costs (inf for failures) and train the model on them."""
        if mark_measured:
            for candidate, cost in zip(candidates, costs):
                self.measured.add(candidate.key)
                if np.isfinite(cost):
                    self.best.append((float(cost), candidate))
            self.best.sort(key=lambda e: e[0])
            del self.best[self.params.population:]
            self.sketch_policy.update([c.sketch for c in candidates], costs)
        if candidates:
            self.model.update(self.features(candidates), np.asarray(costs, dtype=float))

    def preload(self, records: Sequence[TuningRecord], mark_measured: bool = True) -> int:
        """Mark what ``records`` measured and learn from it; returns how many records
        matched a sketch of this task (the others are still never re-measured).
        ``mark_measured=False`` only trains the model. A schedule both searched and
        re-measured is learned once, from its search measurement (``for_learning``)."""
        records = for_learning(records)
        candidates, costs = [], []
        for record, candidate in zip(records, self.locate(records)):
            if candidate is not None:
                candidates.append(candidate)
                costs.append(record.mean_cost)
            elif mark_measured:
                self.measured_traces.add(trace_key(Trace.from_json(record.trace)))
        self.update(candidates, costs, mark_measured)
        return len(candidates)

    def locate(self, records: Sequence[TuningRecord]) -> list[Candidate | None]:
        """The candidate of this task each record's trace stands for, None where no sketch's
        does: the sketch a record names, or every sketch where it names none of them; failing
        that, the named sketch's candidate of the same decisions (``row_by_decisions``)."""
        by_name = {sketch.name: n for n, sketch in enumerate(self.sketches)}
        located = []
        for record in records:
            trace = Trace.from_json(record.trace)
            order = [by_name[record.sketch]] if record.sketch in by_name else range(len(self.sketches))
            rows = ((index, self.sketches[index].row_of(trace, record.trace_json)) for index in order)
            found = next(((index, row) for index, row in rows if row is not None), None)
            if found is None and record.sketch in by_name:  # an earlier form of the sketch it names
                row = self.sketches[by_name[record.sketch]].row_by_decisions(trace)
                found = None if row is None else (by_name[record.sketch], row)
            located.append(None if found is None else Candidate(found[0], tuple(int(v) for v in found[1])))
        return located


class PreloadMeasuredStates:
    """Ansor's init-search callback: mark every state in ``log`` as measured, seed the
    population with the best and train the cost model on them.

    Args:
        log: A tuning log; only its records of the policy's workload and target are used.
    """

    def __init__(self, log):
        self.log = log

    def apply(self, policy: SketchPolicy) -> None:
        """Preload the log's records into ``policy`` (``SketchPolicy.preload``).

        Raises:
            FileNotFoundError: If the log does not exist.
        """
        policy.preload(load_records(self.log, policy.task.workload_key, policy.task.target))
