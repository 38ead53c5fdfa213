"""The measurement worker: a process that loads candidate kernels, checks and times them.

A candidate kernel is native code from a search, and may crash, hang or exhaust memory;
it runs here, in a process of its own, so that only this process dies. ``LocalRunner``
starts it with ``python -m tilecraft.measure.worker --request-fd R --reply-fd W`` and
speaks JSON lines over those two pipes (not stdin/stdout, which a kernel could write
to). The worker answers ``{"ready": true}`` once, then per request ``{"running": true}``
once the kernel and its data are loaded, just before its first call, and
``{"checked": true}`` once that call's outputs are checked, before the timing (so the
parent can give the first call a limit of its own), and one reply:

  request: lib_path, entry_name, args ([name, shape, dtype, is_output] each),
           packs ([arg_index, func_name, packed_shape] each), reference (an .npz of
           inputs and expected outputs by tensor name), number, repeat, min_repeat_ms, flush,
           evict_weights, slow_call_secs (a checking call at least this long is the
           measurement, one cost; null for none)
           launch ([grid, block] of a CUDA kernel, whose lib_path is a cubin; null for a CPU one)
  reply:   {"error_kind": "none", "costs": [seconds per call, ...]} or
           {"error_kind": "wrong_answer" | "runtime", "error_msg": "..."}

Each request binds the packed inputs (packing is not timed, as in deployment), calls
the kernel once on fresh copies of the reference inputs with poisoned outputs, compares
every output with the reference, and only then times it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Iterable

import numpy as np

from ..runtime.module import ArgSpec, Module, PackSpec, aligned_empty
from ..te.dtype import from_npy, is_float
from .device_check import DeviceCheck, device_check
from .result import error_line

# (rtol, atol as a fraction of max |expected|) by dtype; integers and bools must match exactly.
# float32: rtol 1e-3 is ~8000 ulps, room for what a schedule legitimately changes (sums
# reassociated by tiling and vector lanes, FMA contraction, libm against NumPy's exp/tanh);
# near zero a reassociated sum errs in absolute terms, on the scale of what was summed,
# hence an atol tied to the output's magnitude. A real bug (a lost term, a wrong index,
# an unwritten element) errs on the order of that magnitude itself, far above 1e-4 of it.
# The 16-bit floats round once when stored: float16 keeps 11 bits, bfloat16 8 (an ulp 0.8%).
TOLERANCES = {"float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2), "float32": (1e-3, 1e-4), "float64": (1e-6, 1e-8)}
PRECISION = "__precision__"  # the reference's entry naming its workload's least precise type (least_precise)
_CACHED_REFERENCES = 4  # reference files kept loaded; a tuner measures one workload at a time
_PARENT_POLL_SECS = 1.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tilecraft.measure.worker")
    parser.add_argument("--request-fd", type=int, required=True)
    parser.add_argument("--reply-fd", type=int, required=True)
    parser.add_argument("--max-memory-bytes", type=int, default=None)
    options = parser.parse_args(argv)
    if options.max_memory_bytes is not None:
        _limit_address_space(options.max_memory_bytes)
    _exit_with_parent()
    references: OrderedDict[str, Reference] = OrderedDict()
    with os.fdopen(options.request_fd, "r") as requests, os.fdopen(options.reply_fd, "w") as replies:
        _send(replies, {"ready": True})
        for line in requests:
            _send(replies, measure(json.loads(line), references, lambda stage: _send(replies, {stage: True})))


def measure(request: dict[str, Any], references: OrderedDict[str, Reference],
            reached: Callable[[str], object] = lambda stage: None) -> dict[str, Any]:
    """The reply to one request; a Python exception becomes a RUNTIME error naming the stage.
    ``reached("running")`` is called once everything is loaded, just before the kernel's
    first call, and ``reached("checked")`` once its outputs are right, before the timing."""
    stage = "loading the kernel"
    try:
        args = tuple(ArgSpec(name, tuple(shape), dtype, is_output) for name, shape, dtype, is_output in request["args"])
        if request.get("launch"):
            return _measure_cuda(request, args, _load_reference(request["reference"], references), reached)
        packs = tuple(PackSpec(index, name, tuple(shape)) for index, name, shape in request["packs"])
        module = Module(request["lib_path"], "", request["entry_name"], args, packs)
        stage = "reading the reference data"
        reference = _load_reference(request["reference"], references)
        stage = "packing the weights"
        packed = {args[pack.arg_index].name for pack in packs}
        module = module.bind_weights(**{name: reference[name] for name in packed})
        stage = "running the kernel"
        # Fresh inputs: a kernel that writes into an input must not corrupt the cached reference.
        buffers = {arg.name: aligned_copy(reference.check(arg.name).poisoned if arg.is_output else reference[arg.name])
                   for arg in args if arg.name not in packed}
        reached("running")
        started = time.perf_counter()
        module(*buffers.values())
        first_call_ms = (time.perf_counter() - started) * 1e3
        stage = "checking the outputs"
        for arg in args:
            if arg.is_output:
                message = reference.check(arg.name)(buffers[arg.name])
                if message is not None:
                    return {"error_kind": "wrong_answer", "error_msg": message}
        reached("checked")
        if request.get("slow_call_secs") is not None and first_call_ms / 1e3 >= request["slow_call_secs"]:
            return {"error_kind": "none", "costs": [first_call_ms / 1e3]}  # far slower than the fastest: enough
        stage = "timing the kernel"
        # A call that alone lasts min_repeat_ms needs no batch of `number` to be timed well,
        # and random candidates can be slow: time one call per repeat then, not `number`.
        number = 1 if first_call_ms >= max(request["min_repeat_ms"], 1.0) else request["number"]
        timer = module.time_evaluator(number, request["repeat"], request["min_repeat_ms"],
                                      request["flush"], warmup=False,  # the checked call warmed it up
                                      evict_weights=request["evict_weights"])
        return {"error_kind": "none", "costs": list(timer(*buffers.values()).results)}
    except Exception as error:  # noqa: BLE001 - every failure of a candidate is a reply
        return {"error_kind": "runtime", "error_msg": f"{stage}: {error_line(error)}"}


def _measure_cuda(request: dict[str, Any], args: tuple[ArgSpec, ...], reference: Reference,
                  reached: Callable[[str], object]) -> dict[str, Any]:
    """A CUDA candidate (a cubin and its launch): its arguments copied on the GPU from the
    workload's data there (``Reference.on_gpu``), checked after one call (on the GPU, an
    output copied back only where it is wrong somewhere: ``device_check.py``), then timed on
    the same buffers with CUDA events after an L2 flush before every launch (Triton's
    ``do_bench``). Its first call loads the cubin, so it neither stops nor
    times a slow candidate as a CPU kernel's first call does; it warms the kernel up for the
    first timed call, which tells a slow candidate and warms it up for the rest: 2 launches a
    slow candidate, ``2 + number x repeat`` another."""
    from pathlib import Path

    from ..runtime.cuda import CudaModule, DeviceArray

    stage = "loading the kernel"
    try:
        module = CudaModule.of_launch(Path(request["lib_path"]).read_bytes(), request["entry_name"], args,
                                      request["launch"])
        buffers = reference.on_gpu(args, DeviceArray)
        for arg in args:  # made and tried before the candidate runs (device_check.py)
            if arg.is_output:
                reference.device_check(arg.name, DeviceArray)
        stage = "running the kernel"
        reached("running")
        module(*buffers.values())
        stage = "checking the outputs"
        for arg in args:
            if arg.is_output and (message := _gpu_output_message(reference, arg.name, buffers[arg.name], DeviceArray)):
                return {"error_kind": "wrong_answer", "error_msg": message}
        reached("checked")
        stage = "timing the kernel"
        first = module.time_evaluator(1, 1, flush_l2=True, warmup=False)(*buffers.values()).results[0]
        if request.get("slow_call_secs") is not None and first >= request["slow_call_secs"]:
            return {"error_kind": "none", "costs": [first]}  # far slower than the fastest: enough, as on CPUs
        number = 1 if first * 1e3 >= max(request["min_repeat_ms"], 1.0) else request["number"]
        timer = module.time_evaluator(number, request["repeat"], flush_l2=True, warmup=False)
        return {"error_kind": "none", "costs": list(timer(*buffers.values()).results)}
    except Exception as error:  # noqa: BLE001 - a launch failure is the candidate's reply, not the worker's end
        return {"error_kind": "runtime", "error_msg": f"{stage}: {error_line(error)}"}


def _gpu_output_message(reference: Reference, name: str, got: Any, device_array: type) -> str | None:
    """None where output ``name`` (``got``, on the GPU) matches the reference, else what
    differs: counted on the GPU, and judged by the CPU's check where any element is outside
    the bound (or the GPU cannot count)."""
    on_gpu = reference.device_check(name, device_array)
    if on_gpu is not None and on_gpu.outside(got) == 0:
        return None
    return reference.check(name)(got.numpy())


def least_precise(dtypes: Iterable[str]) -> str:
    """Of ``dtypes``, the float type of the loosest tolerance, or "" where none is a float: a
    float32 output computed from bfloat16 stages is as precise as bfloat16 (the reference
    rounds each where it stores it, a fused kernel where it stores the output)."""
    return max((d for d in dtypes if d in TOLERANCES), key=lambda d: TOLERANCES[d][0], default="")


class OutputCheck:
    """The comparison of one output with its reference, prepared once per workload.

    A candidate's check is then a subtraction and a comparison with a bound made once
    (|expected| scaled and the tolerance added): on a 2048x2000 softmax, NumPy's
    ``isclose`` and the tolerance took 47 ms a candidate, this 6 ms. The elements outside
    the bound, and those whose expected value is not finite, are judged by ``isclose``
    itself, so the verdict is ``isclose``'s.
    """

    def __init__(self, name: str, expected: np.ndarray, precision: str = "") -> None:
        """``precision``: the workload's least precise type, whose tolerance applies where it
        is looser than the output's own (``least_precise``)."""
        self.name, self.expected = name, expected
        if expected.dtype.name in TOLERANCES:
            self.rtol, atol_fraction = max(TOLERANCES[expected.dtype.name], TOLERANCES.get(precision, (0.0, 0.0)))
            finite = np.isfinite(expected)
            magnitude = np.abs(expected, where=finite, out=np.zeros(expected.shape, np.float64)).max(initial=0.0)
            self.atol = atol_fraction * (float(magnitude) if magnitude > 0 else 1.0)
            # -1 where the reference is not finite: no difference is below it, isclose decides.
            self.bound = np.where(finite, self.atol + self.rtol * np.abs(expected), -1).astype(expected.dtype)
            self._difference = np.empty_like(expected)
            self.tolerance = f"|got - expected| <= {self.atol:.3g} + {self.rtol:g}*|expected|"
        else:
            self.bound = None
            self.tolerance = "exact, for " + expected.dtype.name

    @functools.cached_property
    def poisoned(self) -> np.ndarray:
        """An output buffer to start a candidate from (``poisoned``), made once."""
        return poisoned(self.expected)

    def __call__(self, got: np.ndarray) -> str | None:
        """None when ``got`` matches the reference within ``TOLERANCES``, else what differs and where."""
        expected = self.expected
        if self.bound is None:
            good = got == expected
        else:
            with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, nan
                np.abs(np.subtract(got, expected, out=self._difference), out=self._difference)
            good = self._difference <= self.bound
            if good.all():
                return None
            doubtful = ~good
            good[doubtful] = np.isclose(got[doubtful], expected[doubtful], rtol=self.rtol, atol=self.atol,
                                        equal_nan=True)
        if good.all():
            return None
        with np.errstate(invalid="ignore"):  # inf - inf
            error = np.abs(got.astype(np.float64) - expected.astype(np.float64))
        index = np.unravel_index(int(np.argmax(np.where(good, -1.0, np.nan_to_num(error, nan=np.inf)))), got.shape)
        return (f"output {self.name!r} differs from the NumPy reference: max abs error {error[index]:.3g} at index "
                f"{tuple(int(i) for i in index)} (expected {_format(expected[index])}, got {_format(got[index])}); "
                f"{int((~good).sum())} of {got.size} elements are outside the tolerance ({self.tolerance})")


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """A copy on a cache line, as a deployed model's buffers are: timings must not depend
    on where malloc happened to put the array."""
    copy = aligned_empty(array.shape, array.dtype)
    copy[...] = array
    return copy


def poisoned(expected: np.ndarray) -> np.ndarray:
    """An output buffer whose every element differs from ``expected``, so an element
    the kernel forgets to write cannot pass the check by chance (reused memory often
    holds the previous candidate's correct answer)."""
    if expected.dtype == np.bool_:
        return ~expected
    if np.issubdtype(expected.dtype, np.integer):
        return expected ^ 1
    return np.where(np.isnan(expected), 0, np.nan).astype(expected.dtype)


def _format(value: np.generic) -> str:
    return f"{float(value):.6g}" if is_float(value.dtype.name) else str(value)


class Reference:
    """A workload's inputs and expected outputs by tensor name, and each output's check,
    prepared when a candidate first needs it and kept while the reference is cached."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.precision = str(arrays.pop(PRECISION, ""))  # a name TOLERANCES lacks is ignored
        self.arrays = arrays
        self._checks: dict[str, OutputCheck] = {}
        self._on_gpu: dict[tuple, tuple[dict, dict]] = {}  # args -> (the data on the GPU, a candidate's copy)
        self._device_checks: dict[str, DeviceCheck | None] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def check(self, name: str) -> OutputCheck:
        if name not in self._checks:
            self._checks[name] = OutputCheck(name, self.arrays[name], self.precision)
        return self._checks[name]

    def device_check(self, name: str, device_array: type) -> DeviceCheck | None:
        """Output ``name``'s check on the GPU (``device_check.py``), made once; None where the
        CPU's must do."""
        if name not in self._device_checks:
            check = self.check(name)
            self._device_checks[name] = device_check(check.expected, check.bound, device_array)
        return self._device_checks[name]

    def on_gpu(self, args: tuple[ArgSpec, ...], device_array: type) -> dict[str, Any]:
        """A candidate's arguments on the GPU, by name: fresh copies of the inputs and of the
        poisoned outputs, made on the GPU from data uploaded once a workload (a 4096³
        matmul's 192 MB crossed PCIe for every candidate), so that a candidate still starts
        from data no earlier one can have written."""
        key = tuple(args)
        if key not in self._on_gpu:
            kept = {arg.name: device_array(self.check(arg.name).poisoned if arg.is_output else self[arg.name])
                    for arg in args}
            self._on_gpu[key] = kept, {name: data.copy() for name, data in kept.items()}
        kept, fresh = self._on_gpu[key]
        for name, data in fresh.items():
            data.copy_from(kept[name])
        return fresh


def _load_reference(path: str, references: OrderedDict[str, Reference]) -> Reference:
    if path not in references:
        with np.load(path, allow_pickle=False) as data:
            references[path] = Reference({name: from_npy(data[name]) for name in data.files})
        while len(references) > _CACHED_REFERENCES:
            references.popitem(last=False)
    references.move_to_end(path)
    return references[path]


def _limit_address_space(max_bytes: int) -> None:
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = max_bytes if hard == resource.RLIM_INFINITY else min(max_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _exit_with_parent() -> None:
    """Exit when the runner's process is gone, even while a kernel spins forever: a
    killed tuner must not leave a worker burning a core (ctypes calls release the GIL,
    so this thread runs beside any kernel)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_SECS)
        os._exit(3)

    threading.Thread(target=watch, name="tilecraft-parent-watch", daemon=True).start()


def _send(replies, message: dict[str, Any]) -> None:
    replies.write(json.dumps(message) + "\n")
    replies.flush()


if __name__ == "__main__":
    main()
