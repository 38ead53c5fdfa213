"""CompiledModel: a whole model as native kernels, one per fused subgraph, called with NumPy arrays.

``compile_model`` prepares and partitions the model as ``extract_tasks`` does, gives each
distinct subgraph the best schedule of the tuning log for its workload key and target
(best over the whole log) or else ``default_schedule``, and builds each kernel once (gcc runs
for several kernels at once, one per core: ResNet-50 has ~50 distinct ones). Weights
a kernel repacks are packed here, once; other constants are passed as they are. Buffers
between kernels are allocated once, aligned, and shared by values whose lifetimes do not
overlap; a reshape is a view. A call allocates only the model's outputs, new every call, and
makes all the kernels' calls in one C call (``runtime/plan.py``); the shared buffers make a
CompiledModel unsafe to call from several threads at once.

For a CUDA target the same steps are built with nvcc into a ``GpuModel`` (``gpu.py``).

``save`` writes a directory that ``load_model`` reads without the ONNX model, the log or a
compiler: ``model.json`` (the plan), each kernel's shared library and C source, the runner
library that calls them, and the weights as ``.npy`` files.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from rich.table import Table

from ..build import build, build_lowered
from ..database.log import best_of, load_records
from ..errors import BuildError, ScheduleError, TilecraftError
from ..runtime.cuda import element_dtype, gpu_array, is_c_contiguous
from ..runtime.module import ArgSpec, Module, PackSpec, aligned_empty
from ..runtime.plan import NativePlan, compile_plan_runner
from ..ir.lower import lower
from ..ir.slices import from_view, into_view
from ..schedule.schedule import Schedule
from ..schedule.trace import Trace
from ..search.default import default_schedule
from ..tables import table_text
from ..target import Target
from ..te.dtype import NUMPY_DTYPES, from_npy, is_float
from ..graph.fuse import partition, subgraph_dag
from ..graph.views import place
from ..graph.ir import Value
from .gpu import GpuModel
from .tasks import best_alone, describe, prepare_graph

UNTUNED_SHOWN = 5  # the untuned kernels a warning names, the largest share of the work first

FORMAT, FORMAT_VERSION = "tilecraft-compiled-model", 2


class ModelInputError(TilecraftError, ValueError):
    """A compiled model was called with inputs it does not take."""


class ModelLoadError(TilecraftError, ValueError):
    """A saved model directory is incomplete or corrupt; the message names the file."""


class DefaultScheduleWarning(UserWarning):
    """Some kernels of a compiled model have the default schedule: no tuning record was used."""


@dataclass(frozen=True, slots=True)
class Kernel:
    """One compiled subgraph, shared by all its occurrences; ``tuned``: its schedule is a log's record."""

    desc: str
    workload_key: str
    module: Module
    tuned: bool
    trace: str  # the schedule's trace as JSON


@dataclass(frozen=True, slots=True)
class KernelTime:
    """A kernel's share of a model call (``CompiledModel.profile``): ``seconds`` over its ``calls``;
    ``tuned``: its schedule is a log's record."""

    desc: str
    workload_key: str
    calls: int
    seconds: float
    tuned: bool


@dataclass(frozen=True, slots=True)
class Step:
    """``kernels[kernel]`` reads ``inputs`` and writes ``outputs`` (its arguments in order);
    ``kernel`` None: ``outputs[0]`` is a reshaped view of ``inputs[0]``."""

    kernel: int | None
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


class CompiledModel:
    """A whole model as native kernels, one per distinct fused subgraph, called with NumPy arrays.

    ``model(**inputs)`` returns the output array (a tuple of them, in output order, for several);
    ``model.run({name: array})`` returns a dict by output name. Inputs are given by name.
    Made by ``compile_model`` or ``load_model``; the constructor takes the parts they
    assemble. The buffers between kernels are allocated once and shared by all calls, so
    a model must not be called from several threads at once.

    Args:
        inputs: The model's inputs, in order.
        outputs: The names of its outputs, in order.
        values: Every value a step reads or writes, by name.
        kernels: The compiled kernels.
        steps: The kernel calls (and reshapes) in order.
        constants: The weights, by name.
        target: The target string the kernels were compiled for.
        runner: The library of the loop that makes the kernels' calls (``compile_plan_runner``).
        reuse: A model of the same steps whose buffers between kernels, and whose kernels'
            packed weights where the kernel is the same, this one shares: copies that differ
            in one task's kernels then differ in nothing else, not even in where their
            memory lies (``choose_in_place``). The two must not be called at once.

    Attributes:
        inputs: The model's inputs (name, shape, dtype), in order.
        outputs: The names of its outputs, in order.
        kernels: The compiled kernels, each with ``desc``, ``workload_key``, ``module`` and
            ``tuned`` (its schedule came from a tuning log).
        target: The target string the kernels were compiled for.
        untuned: The kernels that run their default schedule (``UntunedKernel``: desc, reason,
            share of the FLOPs), largest first; empty for a loaded model.
    """

    def __init__(self, inputs: Sequence[Value], outputs: Sequence[str], values: Mapping[str, Value],
                 kernels: Sequence[Kernel], steps: Sequence[Step], constants: Mapping[str, np.ndarray],
                 target: str, runner: Path, reuse: CompiledModel | None = None) -> None:
        self.inputs, self.outputs, self.values = tuple(inputs), tuple(outputs), dict(values)
        self.kernels, self.steps, self.constants, self.target = tuple(kernels), tuple(steps), dict(constants), target
        self.untuned: tuple[UntunedKernel, ...] = ()  # compile_model lists them, largest share of the FLOPs first
        written = {name for step in self.steps if step.kernel is not None for name in step.outputs}
        self._fresh = [name for name in dict.fromkeys(self.outputs) if name in written]
        self._root = _view_roots(self.steps)
        self._fixed = reuse._fixed if reuse is not None else {
            **self.constants, **plan_buffers(self.steps, self.values, set(self.outputs))}
        self._plan, self._plan_kernels, self._bound = self._native_plan(runner, reuse)

    def __repr__(self) -> str:
        tuned = sum(kernel.tuned for kernel in self.kernels)
        return (f"CompiledModel(({', '.join(f'{v.name}: {v}' for v in self.inputs)}) -> ({', '.join(self.outputs)}); "
                f"{len(self.steps)} steps, {len(self.kernels)} kernels of which {tuned} tuned; target {self.target})")

    def __call__(self, **inputs: np.ndarray):
        results = self.run(inputs)
        return results[self.outputs[0]] if len(self.outputs) == 1 else tuple(results[o] for o in self.outputs)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model once.

        Args:
            inputs: One array per model input, by name, of the input's shape and dtype.

        Returns:
            The outputs by name, new arrays at every call.

        Raises:
            ModelInputError: If an input is missing or unknown, or has the wrong shape or dtype.
        """
        arrays = self._arrays(inputs)
        self._plan.run(arrays)
        return {name: arrays[name] if name in self._fresh else self._array(name, arrays).copy()
                for name in self.outputs}

    def profile(self, inputs: Mapping[str, np.ndarray], rounds: int = 20) -> list[KernelTime]:
        """Where a call's time goes: per kernel, the median over ``rounds`` whole-model calls
        of the seconds spent in all its calls, timed in place (its inputs as cold or warm as the
        model leaves them), most expensive first.

        Args:
            inputs: As for ``run``.
            rounds: How many whole-model calls to time.

        Raises:
            ValueError: If ``rounds`` is below 1.
            ModelInputError: As ``run``.
        """
        arrays = self._arrays(inputs)
        return kernel_times(self.kernels, self.steps, self._plan_kernels,
                            lambda seconds: self._plan.run(arrays, seconds), rounds)

    def _arrays(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The checked inputs and new arrays for the outputs kernels write: the plan's slots."""
        arrays = check_inputs(self.inputs, inputs)
        arrays.update((name, aligned_empty(self.values[name].shape, self.values[name].dtype)) for name in self._fresh)
        return arrays

    def _array(self, name: str, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        """Value ``name``: a buffer, a slot, or a view of one (all C-contiguous, so a view starts where
        its source does)."""
        if name in self._fixed or name in arrays:
            return self._fixed[name] if name in self._fixed else arrays[name]
        root = self._root[name]
        return (self._fixed[root] if root in self._fixed else arrays[root]).reshape(self.values[name].shape)

    def _native_plan(self, runner: Path, reuse: CompiledModel | None) -> tuple[NativePlan, np.ndarray, dict]:
        """Every kernel's calls in step order, its constant packed weights bound (packed once, here,
        or taken from ``reuse`` where its kernel is the same), which kernel each call belongs to,
        and each step's bound module. A value that is not a fixed buffer (an input, a new output,
        or a view of one) is a slot of the plan, named by the value that owns its memory."""
        calls, owners, keep, bound = [], [], [], {}
        for n, step in enumerate(self.steps):
            if step.kernel is None:
                continue
            module, names = self.kernels[step.kernel].module, step.inputs + step.outputs
            for spec, name in zip(module.args, names):
                value = self.values[name]
                if spec.shape != value.shape or spec.dtype != value.dtype:
                    raise ValueError(f"kernel {self.kernels[step.kernel].desc} takes {spec.name} as "
                                     f"{spec.dtype}{list(spec.shape)} but is given {name}: {value}")
            packed = {module.args[p.arg_index].name: self.constants[names[p.arg_index]]
                      for p in module.packs if names[p.arg_index] in self.constants}
            if reuse is not None and reuse.kernels[step.kernel].module is module:
                module = bound[n] = reuse._bound[n]
            else:
                module = bound[n] = module.bind_weights(**packed) if packed else module
            free = [name for spec, name in zip(module.args, names) if spec.name not in packed]
            step_calls, buffers = module.plan_calls([self._address(name) for name in free])
            calls += step_calls
            owners += [step.kernel] * len(step_calls)
            keep += [module, *buffers]
        keep += self._fixed.values()
        return NativePlan(calls, runner, keep), np.array(owners, dtype=np.int64), bound

    def _address(self, name: str) -> int | str:
        root = self._root.get(name, name)
        return self._fixed[root].ctypes.data if root in self._fixed else root

    def save(self, directory: str | Path) -> None:
        """Write the model to ``directory`` (created if needed) for ``load_model``: ``model.json``
        (the plan), each kernel's library and C source, the runner library and the weights as
        ``.npy`` files. Files of an earlier save there are overwritten."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        kernels = []
        for n, kernel in enumerate(self.kernels):
            module = kernel.module
            library, source = f"kernel_{n}{module.lib_path.suffix}", f"kernel_{n}.c"
            shutil.copyfile(module.lib_path, directory / library)
            (directory / source).write_text(module.source)
            kernels.append({"desc": kernel.desc, "workload_key": kernel.workload_key, "tuned": kernel.tuned,
                            "trace": kernel.trace, "library": library, "source": source, "entry": module.entry_name,
                            "args": [[a.name, list(a.shape), a.dtype, a.is_output] for a in module.args],
                            "packs": [[p.arg_index, p.func_name, list(p.packed_shape)] for p in module.packs]})
        runner = f"runner{self._plan.library.suffix}"
        shutil.copyfile(self._plan.library, directory / runner)
        write_plan(directory, self, kernels, runner=runner)


def kernel_times(kernels: Sequence[Kernel], steps: Sequence[Step], owners: Sequence[int], timed_call,
                 rounds: int) -> list[KernelTime]:
    """Per kernel, the median over ``rounds`` whole-model calls of the seconds spent in all its
    calls, most expensive first: ``timed_call(seconds)`` makes one model call and writes each
    native call's seconds, ``owners`` the kernel each belongs to (``CompiledModel.profile``)."""
    if rounds < 1:
        raise ValueError(f"profile: rounds={rounds} must be >= 1")
    seconds, spent = np.zeros(len(owners)), np.zeros((rounds, len(kernels)))
    for r in range(rounds):
        timed_call(seconds)
        np.add.at(spent[r], owners, seconds)
    calls = Counter(step.kernel for step in steps)
    times = [KernelTime(kernel.desc, kernel.workload_key, calls[n], float(np.median(spent[:, n])), kernel.tuned)
             for n, kernel in enumerate(kernels)]
    return sorted(times, key=lambda t: -t.seconds)


def write_plan(directory: Path, model, kernels: list[dict], **more: Any) -> None:
    """``model``'s weights as ``.npy`` files and ``model.json``, the plan that names them, its
    ``kernels`` (as saved) and ``more`` entries."""
    (directory / "weights").mkdir(parents=True, exist_ok=True)
    weights = {name: f"weights/{n}.npy" for n, name in enumerate(model.constants)}
    for name, path in weights.items():
        np.save(directory / path, model.constants[name], allow_pickle=False)
    plan = {"format": FORMAT, "version": FORMAT_VERSION, "target": model.target,
            "inputs": [v.name for v in model.inputs], "outputs": list(model.outputs),
            "values": {name: [list(v.shape), v.dtype] for name, v in model.values.items()},
            "weights": weights, "kernels": kernels, **more,
            "steps": [[s.kernel, list(s.inputs), list(s.outputs)] for s in model.steps]}
    (directory / "model.json").write_text(json.dumps(plan, indent=1))


def check_inputs(expected: Sequence[Value], inputs: Mapping[str, Any], gpu: bool = False) -> dict[str, Any]:
    """``inputs`` checked against the model's ``expected`` ones: each by name, of its shape and
    dtype, NumPy arrays made C-contiguous; with ``gpu``, GPU arrays (``__cuda_array_interface__``)
    are taken as they are.

    Raises:
        ModelInputError: If an input is missing or unknown, or has the wrong shape, dtype or type.
    """
    expected = {value.name: value for value in expected}
    missing, unknown = sorted(set(expected) - set(inputs)), sorted(set(inputs) - set(expected))
    if missing or unknown:
        wrong = [f"{what} input(s) {names}" for what, names in (("missing", missing), ("unknown", unknown)) if names]
        raise ModelInputError(f"{' and '.join(wrong)}; the model takes "
                              f"{', '.join(f'{v.name}: {v}' for v in expected.values())}, one array each, by name")
    checked = {}
    for name, array in inputs.items():
        value = expected[name]
        if isinstance(array, np.generic):  # a NumPy scalar is a 0-d array
            array = np.asarray(array)
        array = gpu_array(array) if gpu else array
        face = getattr(array, "__cuda_array_interface__", None) if gpu else None
        if face is not None:
            shape, dtype = tuple(face["shape"]), element_dtype(array)
        elif isinstance(array, np.ndarray):
            shape, dtype = array.shape, array.dtype
        else:
            shape = dtype = None
        if shape != value.shape or dtype != NUMPY_DTYPES[value.dtype]:
            got = f"{dtype}{list(shape)}" if shape is not None else type(array).__name__
            raise ModelInputError(f"input {name} must be a {'GPU or ' if gpu else ''}numpy array {value} but got "
                                  f"{got}; pass np.asarray(x, dtype={value.dtype!r}) of shape {value.shape}")
        if face is not None and not is_c_contiguous(shape, face.get("strides"), dtype.itemsize):  # copied as bytes
            raise ModelInputError(f"input {name} is a GPU array that is not C-contiguous; pass x.contiguous() "
                                  f"(PyTorch) or cupy.ascontiguousarray(x)")
        checked[name] = array if face is not None else np.require(array, requirements="C")
    return checked


def _view_roots(steps: Sequence[Step]) -> dict[str, str]:
    """Each view -> the value that owns its memory."""
    root: dict[str, str] = {}
    for step in steps:
        if step.kernel is None:
            root[step.outputs[0]] = root.get(step.inputs[0], step.inputs[0])
    return root


def _host_bytes(nbytes: int) -> np.ndarray:
    return aligned_empty((nbytes,), np.uint8)


def _host_view(raw: np.ndarray, value: Value) -> np.ndarray:
    dtype = NUMPY_DTYPES[value.dtype]
    return raw[:math.prod(value.shape) * dtype.itemsize].view(dtype).reshape(value.shape)


def plan_buffers(steps: Sequence[Step], values: Mapping[str, Value], per_call: set[str], allocate=_host_bytes,
                 view=_host_view) -> dict[str, Any]:
    """An array for each value a kernel writes, except ``per_call`` ones (the model's outputs):
    ``view(raw, value)`` of a buffer of bytes ``allocate(nbytes)`` gave (an aligned NumPy one by
    default; GPU memory for a ``GpuModel``). A buffer whose readers have all run is reused for a
    later value (the smallest free one that fits); a view keeps its source's buffer alive until
    the view's last reader, and an output that is a view keeps it to the end (the call returns a
    copy of it)."""
    root = _view_roots(steps)
    last_read: dict[str, int] = {}
    for n, step in enumerate(steps):
        for name in step.inputs:
            last_read[root.get(name, name)] = n
    last_read.update((root.get(name, name), len(steps)) for name in per_call)  # read when the call returns
    free: list[Any] = []
    owned: dict[str, Any] = {}
    buffers = {}
    for n, step in enumerate(steps):
        for name in step.outputs if step.kernel is not None else ():
            if name in per_call or name in owned:  # a concatenation's later part
                continue
            value = values[name]
            nbytes = math.prod(value.shape) * NUMPY_DTYPES[value.dtype].itemsize
            fits = [k for k, raw in enumerate(free) if raw.nbytes >= nbytes]
            raw = free.pop(min(fits, key=lambda k: free[k].nbytes)) if fits else allocate(nbytes)
            owned[name] = raw
            buffers[name] = view(raw, value)
        for name in {root.get(name, name) for name in step.inputs}:
            if last_read[name] == n and name in owned:
                free.append(owned.pop(name))
    return buffers


def example_inputs(values: Sequence[Value], seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs to run or time a model with, by name: standard-normal floats, and zeros for
    integers and booleans (indices that are valid whatever the axis they index)."""
    rng = np.random.default_rng(seed)
    return {value.name: rng.standard_normal(value.shape).astype(value.dtype)
            if is_float(value.dtype) else np.zeros(value.shape, value.dtype)
            for value in values}


def compile_model(model_or_graph: Any, target: Target | str | None = None,
                  log: str | Path | Sequence[str | Path] | None = None,
                  input_shapes: Mapping[str, tuple[int, ...]] | None = None,
                  cache_dir: str | Path | None = None) -> CompiledModel | GpuModel:
    """Compile an ONNX model (a ``ModelProto`` or a path) or a Graph for ``target`` (the host by default),
    with the best schedules of the tuning ``log``; subgraphs without one get the default schedule,
    listed in one ``DefaultScheduleWarning``.

    The model is prepared as ``extract_tasks`` prepares it, so each distinct subgraph is
    looked up in the log by its task's workload key, best over the whole log. Each
    distinct kernel is built once, several at a time; a record that fails to replay or
    build falls back to the default schedule, with the reason in the warning. Several
    logs: a subgraph's schedule is the best of the first log that has a record for it.
    Costs measured with different protocols (say with the caches flushed before every call,
    and warm) are not comparable, so such logs are kept apart and ranked by their order.

    Args:
        model_or_graph: An ONNX model (a ``ModelProto`` or a path) or a ``Graph``.
        target: The target to compile for; None for the host. A CUDA target (``"cuda"``,
            ``"cuda -arch=sm_90"``) gives a ``GpuModel``: its kernels run on a GPU, built here
            with nvcc, and ``GpuModel.emulate`` checks them on a machine without one.
        log: A tuning log, or several in order of preference; None for default schedules only.
        input_shapes: Sizes of the ONNX model's dynamic inputs, by input name.
        cache_dir: Where kernels are compiled and cached (see ``tc.build``); None for the default.

    Returns:
        The compiled model (a ``GpuModel`` for a CUDA target).

    Raises:
        FileNotFoundError: If a log does not exist.
        OnnxImportError: If the ONNX model cannot be imported (``UnsupportedOperatorError``
            for an operator tilecraft lacks).
        ImportError: If an ONNX model is given and the onnx package is not installed.
        TargetError: If ``target`` cannot be understood.
        BuildError: If the C compiler is missing or rejects a kernel of the default schedule.

    Example:
        ::

            model = tc.compile_model("resnet50.onnx", log="resnet50.json")
            logits = model(data=image)
            model.save("resnet50_compiled")
    """
    target = target if isinstance(target, Target) else Target(target)
    logs = [] if log is None else [log] if isinstance(log, (str, Path)) else list(log)
    for path in logs:
        if not Path(path).is_file():
            raise FileNotFoundError(f"the tuning log {path} does not exist; tune the model's tasks into it first "
                                    "(tc.extract_tasks, tc.TaskScheduler with tc.RecordToFile), or compile without "
                                    "log=")
    best, alone = {}, {}
    for path in reversed(logs):  # the earlier logs' records replace the later ones'
        logged = load_records(path, target=target)  # read once, ranked two ways
        best.update((r.workload_key, r) for r in best_of(logged, path))
        alone.update(best_alone(logged, path))
    graph = prepare_graph(model_or_graph, input_shapes, target, alone)
    described = ", ".join(map(str, logs)) if logs else None  # in the warning's reasons
    jobs, steps = kernel_jobs(graph, best)
    built = compile_kernels(jobs, described, target, cache_dir)
    kernels = [kernel for kernel, _ in built]
    calls = Counter(step.kernel for step in steps if step.kernel is not None)
    work = [job.dag.flop_count() * calls[n] for n, job in enumerate(jobs)]
    untuned = sorted(((w / (sum(work) or 1), kernel.desc, why) for w, (kernel, why) in zip(work, built) if why),
                     reverse=True)
    if untuned:
        _warn_untuned(untuned, len(kernels))
    if getattr(target, "kind", "llvm") == "cuda":
        values, constants = _model_values(graph, steps)
        model = GpuModel(graph.inputs, graph.outputs, values, kernels, steps, constants, str(target), jobs)
    else:
        model = assemble(graph, steps, kernels, target, cache_dir)
    model.untuned = tuple(UntunedKernel(desc, why, share) for share, desc, why in untuned)
    return model


@dataclass(frozen=True)
class KernelJob:
    """A kernel to build: its subgraph's DAG and description, the record to build it from
    (None: the default schedule), ``into`` (output, shape, offset, strides): its output written
    as that view of an array of ``shape`` (a concatenation, a transpose), or None, and ``reads``
    ((input, shape, offset, strides), ...): inputs read as views of larger arrays."""

    dag: Any
    desc: str
    record: Any
    into: tuple | None
    reads: tuple = ()

    def placed(self, func):
        """The lowered kernel ``func`` writing and reading the views the job names."""
        for read in self.reads:
            func = from_view(func, *read)
        return into_view(func, *self.into) if self.into else func


def kernel_jobs(graph, best: Mapping[str, Any]) -> tuple[list[KernelJob], list[Step]]:
    """The distinct kernels of a prepared ``graph`` (one per workload key and views), each with
    its record in ``best`` (by workload key), and the steps that call them. A value that kernels
    write or read as a view of a larger array (``graph.views``) is not computed on its own: the
    step of its kernel, or of its readers, names that array instead."""
    jobs: dict[tuple, KernelJob] = {}
    index: dict[tuple, int] = {}
    steps = []
    parts = partition(graph)
    placement = place(graph, parts)
    for subgraph in parts:
        if subgraph.outputs[0] in placement.skipped:
            continue
        if subgraph.is_view:
            steps.append(Step(None, subgraph.inputs, subgraph.outputs))
            continue
        dag = subgraph_dag(graph, subgraph)
        written = placement.written.get(subgraph.outputs[0])
        into = None if written is None else (dag.outputs[0].name, graph.values[written.source].shape,
                                             written.offset, written.strides)
        inputs, reads = list(subgraph.inputs), []
        for n, name in enumerate(subgraph.inputs):
            if name in placement.read:
                view = placement.read[name]
                inputs[n] = view.source
                reads.append((dag.placeholders[n].name, graph.values[view.source].shape, view.offset, view.strides))
        key = (dag.workload_key, into, tuple(reads))
        if key not in jobs:
            index[key] = len(jobs)
            jobs[key] = KernelJob(dag, describe(graph, subgraph), best.get(dag.workload_key), into, tuple(reads))
        steps.append(Step(index[key], tuple(inputs), (written.source,) if written else subgraph.outputs))
    return list(jobs.values()), steps


def compile_kernels(jobs: Sequence[KernelJob], log: str | None, target: Target,
                    cache_dir) -> list[tuple[Kernel, str]]:
    """Each job's kernel (``_compile_kernel``), several built at once: gcc runs outside the GIL."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="tilecraft-compile") as pool:
        return list(pool.map(lambda n: _compile_kernel(jobs[n], log, target, f"kernel_{n}", cache_dir),
                             range(len(jobs))))


def _warn_untuned(untuned: list[tuple[float, str, str]], kernels: int) -> None:
    """One warning a person reads: how many kernels, what share of the work, the largest few."""
    table = Table(box=None, padding=(0, 0, 0, 2), show_header=False)
    for share, desc, why in untuned[:UNTUNED_SHOWN]:
        table.add_row(desc, f"{100 * share:.1f}% of the FLOPs", why)
    more = len(untuned) - UNTUNED_SHOWN
    warnings.warn(f"{len(untuned)} of {kernels} kernels, {100 * sum(s for s, _, _ in untuned):.0f}% of the model's "
                  f"FLOPs, have the default schedule (untuned); the largest:\n{table_text(table)}\n"
                  + (f"and {more} more: model.untuned lists them all (tilecraft run-model --profile times each)\n"
                     if more > 0 else "")
                  + "tune them (tc.extract_tasks, tc.TaskScheduler) into the log to make them faster",
                  DefaultScheduleWarning, stacklevel=3)


def _model_values(graph, steps) -> tuple[dict[str, Value], dict[str, np.ndarray]]:
    """The values the steps and the model's ends name (not those inside kernels), and the weights."""
    constants = {name: np.require(array, requirements="C") for name, array in graph.constants.items()}
    used = {*constants, *graph.outputs, *(v.name for v in graph.inputs),
            *(name for step in steps for name in step.inputs + step.outputs)}
    return {name: value for name, value in graph.values.items() if name in used}, constants


def assemble(graph, steps, kernels, target, cache_dir, reuse: CompiledModel | None = None) -> CompiledModel:
    """The model of compiled ``kernels`` and their ``steps``, with the weights and the buffers it
    keeps (those of ``reuse`` where it can, see ``CompiledModel``)."""
    values, constants = _model_values(graph, steps)
    runner = compile_plan_runner(max((len(k.module.args) for k in kernels), default=1), target, cache_dir)
    return CompiledModel(graph.inputs, graph.outputs, values, kernels, steps, constants, str(target), runner, reuse)


@dataclass(frozen=True)
class UntunedKernel:
    """A kernel of a compiled model that runs its default schedule, why, and its share of the model's FLOPs."""

    desc: str
    reason: str
    flop_share: float


def _compile_kernel(job: KernelJob, log, target: Target, name: str, cache_dir) -> tuple[Kernel, str]:
    """The kernel of ``job`` from its record, or with the default schedule and the reason why,
    writing and reading the slices it names."""
    dag, desc, record = job.dag, job.desc, job.record
    why = "no log given" if log is None else f"no record in {log}"

    def built(sch):
        if job.into is None and not job.reads:
            return build(sch, target, name, cache_dir)
        return build_lowered(job.placed(lower(sch, name)), target, cache_dir)

    if record is not None:
        try:
            sch = Trace.from_json(record.trace).replay(dag)
            return Kernel(desc, dag.workload_key, built(sch), True, sch.trace.dumps()), ""
        except TilecraftError as error:
            why = f"the record failed to {'build' if isinstance(error, BuildError) else 'replay'}: {error}"
    try:
        sch = default_schedule(dag, target)
    except ScheduleError as error:
        sch, why = Schedule(dag), f"{why}; no default schedule either ({error}): naive loops"
    return Kernel(desc, dag.workload_key, built(sch), False, sch.trace.dumps()), why


def load_model(directory: str | Path) -> CompiledModel | GpuModel:
    """The model that ``CompiledModel.save`` (or ``GpuModel.save``) wrote to ``directory``,
    loaded without the ONNX model, the tuning log or a compiler.

    Raises:
        ModelLoadError: If the directory holds no saved model, or a file of it is missing,
            corrupt, or written by another version of the format; the message names the file.
    """
    directory = Path(directory)
    path = directory / "model.json"
    if not path.is_file():
        raise ModelLoadError(f"{path} does not exist: {directory} is not a saved model (CompiledModel.save writes it)")
    try:
        plan = json.loads(path.read_text())
        if plan.get("format") != FORMAT or plan.get("version") != FORMAT_VERSION:
            raise ModelLoadError(f"{path} is not a {FORMAT} version {FORMAT_VERSION} plan; save the model again "
                                 "with this tilecraft")
        values = {name: Value(name, tuple(shape), dtype) for name, (shape, dtype) in plan["values"].items()}
        constants = {name: _load_weight(directory / file, values[name]) for name, file in plan["weights"].items()}
        steps = [Step(kernel, tuple(inputs), tuple(outputs)) for kernel, inputs, outputs in plan["steps"]]
        if plan["target"].split()[0] == "cuda":
            kernels = [_load_cuda_kernel(directory, entry) for entry in plan["kernels"]]
            return GpuModel([values[name] for name in plan["inputs"]], plan["outputs"], values, kernels, steps,
                            constants, plan["target"], jobs=())
        kernels = [_load_kernel(directory, entry) for entry in plan["kernels"]]
        runner = directory / plan["runner"]
        try:
            return CompiledModel([values[name] for name in plan["inputs"]], plan["outputs"], values, kernels, steps,
                                 constants, plan["target"], runner)
        except OSError as error:
            raise ModelLoadError(f"cannot load the runner of the kernels from {runner}: {error}; save the model "
                                 "again") from None
    except ModelLoadError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ModelLoadError(f"{path} is corrupt ({type(error).__name__}: {error}); save the model again") from None


def _load_weight(path: Path, value: Value) -> np.ndarray:
    try:
        array = from_npy(np.load(path, allow_pickle=False))
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot read the weight {value.name} from {path}: {error}; "
                             "save the model again") from None
    if array.shape != value.shape or array.dtype != NUMPY_DTYPES[value.dtype]:
        raise ModelLoadError(f"{path} holds {array.dtype}{list(array.shape)} but the weight {value.name} is {value}; "
                             "save the model again")
    return array


def _load_cuda_kernel(directory: Path, entry: dict) -> Kernel:
    from ..runtime.cuda import CudaModule

    cubin, source = directory / entry["cubin"], directory / entry["source"]
    try:
        module = CudaModule.from_artifact(cubin.read_bytes(), entry, source.read_text())
    except OSError as error:
        raise ModelLoadError(f"cannot read the kernel {entry['desc']} from {cubin}: {error}; save the model "
                             "again") from None
    return Kernel(entry["desc"], entry["workload_key"], module, entry["tuned"], entry["trace"])


def _load_kernel(directory: Path, entry: dict) -> Kernel:
    library, source = directory / entry["library"], directory / entry["source"]
    try:
        module = Module(library, source.read_text(), entry["entry"],
                        [ArgSpec(name, tuple(shape), dtype, out) for name, shape, dtype, out in entry["args"]],
                        [PackSpec(index, name, tuple(shape)) for index, name, shape in entry["packs"]])
    except (OSError, BuildError) as error:
        raise ModelLoadError(f"cannot load the kernel {entry['desc']} from {library}: {error}; save the model "
                             "again") from None
    return Kernel(entry["desc"], entry["workload_key"], module, entry["tuned"], entry["trace"])
