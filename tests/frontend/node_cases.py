"""The ONNX backend node tests (``onnx.backend.test.case.node``) run through from_onnx, and then
run_reference or, with ``compiled=True``, compile_model (native kernels with default schedules).

The onnx wheel ships the generators of the node tests, not their data directories, so the
cases are made by importing the generator modules: each ``expect(...)`` records a model
with its inputs and expected outputs (the same data ``backend-test-tools generate-data``
writes as ``model.onnx`` and ``test_data_set_0``).

Many cases feed a shape, axes or pads as a run-time input; tilecraft needs those at import,
as a model exported for inference has them (initializers). Such an input, named by a
``RuntimeInputError``, or any empty input, is bound to the case's data as an initializer
and the import retried: the operator is then checked with exactly the case's values. When
the value needed is computed from the inputs (a window's size, a crop's target shape), the
case's integer inputs are bound.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import pickle
import pkgutil
import warnings

import numpy as np

from tilecraft.frontend import RuntimeInputError, UnsupportedOperatorError, from_onnx
from tilecraft.frontend.onnx_ops import CONVERTERS
from tilecraft.graph import run_reference
from tilecraft.model.compiled import DefaultScheduleWarning, compile_model
from tilecraft.runtime.compiler import default_cache_dir

PASS, FAIL, UNSUPPORTED = "pass", "fail", "unsupported"


def collect_cases(supported_only: bool) -> list:
    """The node test cases, of every operator or only of those in ``CONVERTERS`` or defined as functions, which
    the importer expands (faster: fewer modules). Running the generators takes seconds at every
    collection, in every test worker; the cases are kept in this user's cache (a pickle, only
    ever read from there), keyed by the onnx version and the operators converted."""
    import onnx

    key = hashlib.sha256(f"{onnx.__version__} {supported_only} {sorted(CONVERTERS)}".encode()).hexdigest()[:16]
    kept = default_cache_dir().parent / f"onnx-node-cases-{key}.pickle"
    with contextlib.suppress(Exception):  # missing, or written by another version of Python: made again
        return pickle.loads(kept.read_bytes())
    cases = _generated_cases(supported_only)
    with contextlib.suppress(OSError):  # a cache that cannot be written costs the next collection its seconds
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = kept.with_suffix(f".{os.getpid()}.partial")
        partial.write_bytes(pickle.dumps(cases))
        partial.replace(kept)  # whole or not at all, whichever worker writes it
    return cases


def _generated_cases(supported_only: bool) -> list:
    import onnx.backend.test.case.node as package
    import onnx.defs

    wanted = {op.lower() for op in CONVERTERS} | {schema.name.lower() for schema in onnx.defs.get_all_schemas()
                                                  if schema.has_function or schema.has_context_dependent_function}
    for module in pkgutil.iter_modules(package.__path__):
        if not module.ispkg and (not supported_only or module.name.replace("_", "") in wanted):
            importlib.import_module(f"{package.__name__}.{module.name}")
    return list(package._NodeTestCases)


def run_case(case, compiled: bool = False, cache_dir=None, target: str | None = None,
             cuda_source: bool = False) -> tuple[str, str]:
    """(status, message) of one case: unsupported is the importer's clear refusal, never a pass.
    ``cache_dir``: where compiled kernels go (see ``tc.build``). ``target``: compiled for it
    (a CUDA target's kernels emulated on this CPU; with ``cuda_source``, their CUDA C run)."""
    import onnx.numpy_helper

    inputs, expected = ([onnx.numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v for v in values]
                        for values in case.data_sets[0])
    initializers = {t.name for t in case.model.graph.initializer}
    feeds = dict(zip([i.name for i in case.model.graph.input if i.name not in initializers], inputs))
    try:
        graph, bound = _import(case.model, feeds)
    except UnsupportedOperatorError as error:
        return UNSUPPORTED, str(error)
    except Exception as error:  # noqa: BLE001 - every other failure is reported, with its type
        return FAIL, f"{type(error).__name__}: {error}"
    runtime_feeds = {name: value for name, value in feeds.items() if name not in bound}
    try:
        if compiled:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DefaultScheduleWarning)  # untuned is the point here
                model = compile_model(graph, target, cache_dir=cache_dir)
                outputs = model.emulate(runtime_feeds, cuda_source) if target and target.startswith("cuda") else \
                    model.run(runtime_feeds)
        else:
            outputs = run_reference(graph, runtime_feeds)
    except Exception as error:  # noqa: BLE001
        return FAIL, f"{type(error).__name__}: {error}"
    for info, want in zip(case.model.graph.output, expected):
        got = outputs[info.name]
        if got.shape != np.shape(want) or got.dtype != np.asarray(want).dtype:
            return FAIL, f"output {info.name}: got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}"
        # 16-bit floats: two units in the last place, as the generators round every step and tilecraft
        # accumulates in float32
        rtol = max(case.rtol, {"float16": 2e-3, "bfloat16": 1.6e-2}.get(got.dtype.name, 1e-3))
        if got.dtype.name == "bfloat16":  # NumPy compares it as float32
            got, want = got.astype(np.float32), np.asarray(want).astype(np.float32)
        if not np.allclose(got, want, rtol=rtol, atol=max(case.atol, 1e-5), equal_nan=True):
            return FAIL, f"output {info.name}: max abs error {np.max(np.abs(got.astype(float) - want)):.3g}"
    return PASS, ""


def _import(model, feeds: dict[str, np.ndarray]):
    """The graph of ``model``, with the inputs it needs at import bound to their values; (graph, bound names)."""
    import onnx.numpy_helper

    bound = {name for name, value in feeds.items() if isinstance(value, np.ndarray) and value.size == 0}
    while True:
        frozen = model.__class__()
        frozen.CopyFrom(model)
        frozen.graph.initializer.extend(onnx.numpy_helper.from_array(feeds[name], name) for name in sorted(bound))
        try:
            return from_onnx(frozen), bound
        except RuntimeInputError as error:
            # an input computed from the case's inputs (a window's size, a crop's shape): bind its integer inputs
            wanted = {error.input} if error.input in feeds else {
                name for name, value in feeds.items() if np.asarray(value).dtype.kind in "iu"}
            if not wanted - bound:
                raise
            bound |= wanted
