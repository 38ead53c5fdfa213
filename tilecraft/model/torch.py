"""PyTorch's way in, for inference: ``torch.compile(module, backend="tilecraft")`` and ``from_torch``.

``from_torch`` exports a module traced with example inputs to ONNX (``frontend.torch``) and
compiles that as ``compile_model`` does; the ``TorchModel`` it returns is called with tensors
like the module, and saves the ONNX model for ``tilecraft tune-model``.

``tilecraft_backend`` is the backend that torch finds under the name "tilecraft" through the
package's ``torch_dynamo_backends`` entry point, without importing tilecraft. It receives each
graph that torch.compile captures; code between graphs (at graph breaks) runs in PyTorch, as
with every backend. Dynamo passes a module's parameters and buffers as graph inputs: they are
frozen into the ONNX model as its weights, and a weight changed in place (``load_state_dict``)
or replaced makes the graph compile again. A graph is compiled at its first call, and again
for each new set of input shapes (dynamo's dynamic shapes become one static model per shape)
or value of a 0-d tensor (a Python number that dynamo passes as a tensor, and a trace may read).
A graph that PyTorch cannot export, or tilecraft cannot import, is split: each operator that
cannot be exported and imported alone runs in PyTorch, and each run of the others between
them compiles as a graph of its own (torch's ``CapabilityBasedPartitioner``), with one
``TorchFallbackWarning`` that names the operators left to PyTorch; where none would be
compiled, the whole graph runs in PyTorch. Outputs carry no autograd history.

A graph whose tensors are on a GPU (``module.cuda()``, ``module.to("cuda:1")``) compiles for
that GPU (``GpuModel``, for its architecture, moved there): its kernels take the tensors where
they are and leave the outputs there, launched on the legacy default stream, PyTorch's own;
where another stream is current, the call waits for it first and for the kernels after.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..frontend.onnx import from_onnx
from ..frontend.onnx_importer import OnnxImportError
from ..frontend.torch import require_torch, to_onnx
from ..runtime.cuda import gpu_index
from ..target import CudaTarget, Target
from ..te.dtype import NUMPY_DTYPES
from .compiled import CompiledModel, ModelInputError, compile_model
from .gpu import GpuModel

BACKEND_OPTIONS = ("log", "target", "cache_dir")  # compile_model's arguments, by the same names


class TorchFallbackWarning(UserWarning):
    """A graph that torch.compile captured runs in PyTorch: tilecraft cannot compile it."""


class TorchModel:
    """A PyTorch program compiled by tilecraft: called with tensors in the program's order, it returns
    a tensor (a tuple of them for several outputs), new at every call. A model compiled for a GPU
    takes CUDA tensors, read and written on the GPU (its outputs are there), or CPU ones.

    Attributes:
        onnx_model: The ONNX model it was compiled from (``save_onnx`` writes it).
        compiled: The ``CompiledModel`` (or, for a GPU, ``GpuModel``) that runs it, called with
            arrays by input name.
        input_names: The name of each positional input in the ONNX model, in order; an input the
            program does not read is not in the model, and is not passed on.
    """

    def __init__(self, onnx_model: Any, compiled: CompiledModel | GpuModel, input_names: Sequence[str]) -> None:
        self.onnx_model, self.compiled, self.input_names = onnx_model, compiled, tuple(input_names)

    def __repr__(self) -> str:
        return f"TorchModel({self.compiled!r})"

    def __call__(self, *inputs: Any) -> Any:
        outputs = self.run(inputs)
        return outputs[0] if len(outputs) == 1 else outputs

    def run(self, inputs: Sequence[Any]) -> tuple:
        """The outputs, as a tuple of tensors, for ``inputs`` in the program's order.

        Raises:
            ModelInputError: If the count, a shape or a dtype of ``inputs`` is not the program's.
        """
        torch = require_torch()
        if len(inputs) != len(self.input_names):
            raise ModelInputError(f"the model takes {len(self.input_names)} input(s) "
                                  f"({', '.join(map(str, self.compiled.inputs))}) but was given {len(inputs)}")
        taken = {value.name for value in self.compiled.inputs}
        device = next((x.device for x in inputs if isinstance(x, torch.Tensor) and x.is_cuda), None)
        if device is None:
            arrays = {name: _as_numpy(x) if isinstance(x, torch.Tensor) else x
                      for name, x in zip(self.input_names, inputs) if name in taken}
            results = self.compiled.run(arrays)
            return tuple(as_tensor(results[name]) for name in self.compiled.outputs)
        if not isinstance(self.compiled, GpuModel):
            raise ModelInputError(f"the model runs on the CPU ({self.compiled.target}) but was given tensors on "
                                  f"{device}; pass CPU tensors, or compile it with target='cuda'")
        if device.index != self.compiled.device:
            raise ModelInputError(f"the model runs on cuda:{self.compiled.device} but was given tensors on {device}; "
                                  f"move them with .to('cuda:{self.compiled.device}'), or the model with "
                                  f"model.compiled.to('{device}')")
        # The model's kernels run on the legacy default stream, PyTorch's own unless another is current.
        waits = torch.cuda.current_stream(device) != torch.cuda.default_stream(device)
        if waits:
            torch.cuda.current_stream(device).synchronize()
        values = [self.compiled.values[name] for name in self.compiled.outputs]
        outputs = {value.name: torch.empty(value.shape, device=device, dtype=_torch_dtype(value.dtype))
                   for value in values}  # by PyTorch's allocator: no driver call, no wait
        self.compiled.run({name: x.detach().contiguous() if isinstance(x, torch.Tensor) else x
                           for name, x in zip(self.input_names, inputs) if name in taken}, out=outputs)
        if waits:
            torch.cuda.synchronize(device)
        return tuple(outputs.values())

    def save_onnx(self, path: str | Path) -> None:
        """Write the ONNX model to ``path``, for ``tilecraft tune-model PATH`` and ``tc.extract_tasks``."""
        import onnx

        onnx.save(self.onnx_model, os.fspath(path))


def _as_numpy(x: Any) -> np.ndarray:
    """A CPU copy of tensor ``x`` as NumPy has it: a bfloat16 one as ml_dtypes' bfloat16 (PyTorch's
    ``numpy()`` refuses it), by its bits."""
    torch, x = require_torch(), x.detach().cpu()
    return x.view(torch.int16).numpy().view(NUMPY_DTYPES["bfloat16"]) if x.dtype == torch.bfloat16 else x.numpy()


def as_tensor(array: np.ndarray) -> Any:
    """A CPU tensor sharing ``array``'s memory; of ml_dtypes' bfloat16 (which PyTorch's
    ``from_numpy`` refuses), PyTorch's, by its bits."""
    torch = require_torch()
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _torch_dtype(dtype: str) -> Any:
    """PyTorch's type for one of ours."""
    return as_tensor(np.empty(0, NUMPY_DTYPES[dtype])).dtype


def from_torch(module: Any, example_inputs: Any, log: str | Path | Sequence[str | Path] | None = None,
               target: Any = None, cache_dir: str | Path | None = None) -> TorchModel:
    """Compile a PyTorch module for inference: traced with ``example_inputs`` (in inference mode), exported
    to ONNX and compiled with the best schedules of ``log``, as ``compile_model`` compiles.

    The model has the example inputs' shapes and dtypes. The trace follows the Python control
    flow that the example inputs take (PyTorch's TracerWarning says where it may not hold).

    Args:
        module: A ``torch.nn.Module``.
        example_inputs: A tensor, or a tuple of them: the module's positional arguments.
        log: A tuning log, or several in order of preference, as in ``compile_model``.
        target: The target to compile for; None for the host, or for the GPU where the
            example inputs are CUDA tensors (the model then runs on their GPU).
        cache_dir: Where kernels are compiled and cached; None for the default.

    Raises:
        ImportError: If torch or onnx is not installed (``pip install 'tilecraft[torch]'``).
        UnsupportedOperatorError: If PyTorch cannot export the module, or it uses an operator
            tilecraft lacks; the message names it. (``torch.compile(module, backend="tilecraft")``
            runs such a graph in PyTorch instead.)

    Example:
        ::

            model = tc.from_torch(net.eval(), torch.randn(1, 3, 224, 224), log="net.json")
            logits = model(image)
            model.save_onnx("net.onnx")   # tilecraft tune-model net.onnx --log net.json
    """
    torch = require_torch()
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    gpu = next((x.device.index for x in inputs if isinstance(x, torch.Tensor) and x.is_cuda), None)
    if gpu is not None and target is None:
        target = _gpu_target(gpu)
    return _compiled(module, inputs, gpu, log=log, target=target, cache_dir=cache_dir)


def _compiled(module: Any, inputs: Sequence[Any], gpu: int | None, **options: Any) -> TorchModel:
    """``module`` traced with ``inputs``, exported and compiled with ``compile_model``'s
    ``options``; a model for a GPU moved to GPU ``gpu``."""
    names = [f"input_{n}" for n in range(len(inputs))]
    onnx_model = to_onnx(module, inputs, names)
    compiled = compile_model(onnx_model, **options)
    if gpu is not None and isinstance(compiled, GpuModel):
        compiled.to(gpu)
    return TorchModel(onnx_model, compiled, names)


def _gpu_target(index: int) -> Any:
    """The target of GPU ``index``: ``"cuda"`` for GPU 0 (its facts, or sm_90's where none can
    be read), else that GPU's facts, which may be another architecture's."""
    return "cuda" if index == 0 else CudaTarget.device(index)


def tilecraft_backend(graph_module: Any, example_inputs: Sequence[Any], options: dict | None = None,
                      mode: str | None = None) -> CapturedGraph:
    """The torch.compile backend "tilecraft": ``torch.compile(module, backend="tilecraft", options={"log": LOG})``.

    ``options`` takes ``log`` (a tuning log or several, as in ``compile_model``), ``target``
    and ``cache_dir``. Each graph compiles at its first call (module docstring).

    Raises:
        ValueError: If ``options`` has another key, or a ``mode`` is given (tilecraft has none).
    """
    unknown = sorted(set(options or {}) - set(BACKEND_OPTIONS))
    if unknown or mode is not None:
        wrong = f"not {unknown}" if unknown else f"and no mode ({mode!r})"
        raise ValueError(f"torch.compile(backend='tilecraft') takes options={{...}} with the keys "
                         f"{', '.join(BACKEND_OPTIONS)}, {wrong}")
    static = require_torch()._dynamo.utils.get_static_address_type
    return CapturedGraph(graph_module, [static(x) is not None for x in example_inputs], dict(options or {}))


class CapturedGraph:
    """A graph that torch.compile captured, called as the graph: a ``TorchModel`` for each input signature
    (the shapes, dtypes and devices of its tensors, the values of its sizes and 0-d tensors), or the graph itself, in
    PyTorch, for a signature that tilecraft cannot compile. The models hold the weights as they were
    (each tensor and its version counter): when one changes, they are all compiled again.

    Args:
        graph_module: The captured ``torch.fx.GraphModule``.
        weights: For each of its inputs, whether it is a parameter or buffer of the module.
        options: ``compile_model``'s ``log``, ``target`` and ``cache_dir``.
    """

    def __init__(self, graph_module: Any, weights: Sequence[bool], options: dict) -> None:
        self.graph_module, self.weights, self.options = graph_module, tuple(weights), options
        self.models: dict[tuple, Callable[[Sequence[Any]], Any]] = {}
        self.weights_seen: tuple = ()

    def __call__(self, *args: Any) -> Any:
        torch = require_torch()
        weights = tuple((id(x), 0 if x.is_inference() else x._version) for x, w in zip(args, self.weights) if w)
        if weights != self.weights_seen:
            self.models, self.weights_seen = {}, weights
        fixed = self._fixed(args)
        key = tuple((tuple(x.shape), x.dtype, x.device) if isinstance(x, torch.Tensor) and not constant else
                    (x.item(), x.dtype) if isinstance(x, torch.Tensor) else x
                    for x, weight, constant in zip(args, self.weights, fixed) if not weight)
        if key not in self.models:
            self.models[key] = self._compile(args, fixed)
        return self.models[key](args)

    def _fixed(self, args: Sequence[Any]) -> list[bool]:
        """Which arguments are constants of the compiled model: the weights, sizes, and 0-d tensors (Python
        numbers that dynamo passes as tensors, which the trace may read as numbers)."""
        torch = require_torch()
        return [weight or not isinstance(x, torch.Tensor) or x.dim() == 0 for x, weight in zip(args, self.weights)]

    def _compile(self, args: Sequence[Any], fixed: Sequence[bool]) -> Callable[[Sequence[Any]], Any]:
        """What runs the graph for these arguments: a ``TorchModel``; where tilecraft cannot compile
        the graph whole, the graph split around the operators it cannot compile; else PyTorch."""
        torch = require_torch()
        inputs = [x for x, constant in zip(args, fixed) if not constant]
        frozen = torch.nn.Module()  # the graph with its weights as buffers: the exporter makes them initializers
        for n, (x, weight) in enumerate(zip(args, self.weights)):
            if weight:
                frozen.register_buffer(f"weight_{n}", x.detach())

        def forward(*given):
            given = iter(given)
            return self.graph_module(*(getattr(frozen, f"weight_{n}") if weight else x if constant else next(given)
                                       for n, (x, weight, constant) in enumerate(zip(args, self.weights, fixed))))

        frozen.forward = forward
        devices = sorted({str(x.device) for x in args if isinstance(x, torch.Tensor)} - {"cpu"})
        placed = False  # whether tilecraft can run the graph where its tensors are
        try:
            target, gpu = _placement(devices, self.options.get("target"))
            placed = True
            model = _compiled(frozen, inputs, gpu, **{**self.options, "target": target})
            return lambda given: model.run([x for x, constant in zip(given, fixed) if not constant])
        except OnnxImportError as error:
            operators = [node for node in self.graph_module.graph.nodes if node.op in _CALLS]
            split, refused = self._split(operators) if placed else (None, [])
            reason = str(error).split("\nsupported (domain")[0]
            if split is not None:
                warnings.warn(f"tilecraft compiles {len(operators) - len(refused)} of the {len(operators)} PyTorch "
                              f"operators of a graph that torch.compile captured; {len(refused)} run in PyTorch "
                              f"({', '.join(refused)}): {reason}", TorchFallbackWarning, stacklevel=2)
                return lambda given: split(*given)
            warnings.warn(f"tilecraft cannot compile a graph of {len(operators)} PyTorch operators that "
                          f"torch.compile captured; it runs in PyTorch: {reason}", TorchFallbackWarning, stacklevel=2)
            return lambda given: self.graph_module(*given)

    def _split(self, operators: Sequence[Any]) -> tuple[Any | None, list[str]]:
        """A copy of the graph whose every run of operators that tilecraft imports alone is a
        ``CapturedGraph`` of its own, the others left to PyTorch, and the names of those; None
        where there would be nothing to compile, or nothing left to PyTorch."""
        torch = require_torch()
        from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
        from torch.fx.passes.operator_support import OperatorSupportBase

        refused = {node.name for node in operators if not _imports_alone(node, self.graph_module)}
        if not refused or len(refused) == len(operators):
            return None, []

        class Imported(OperatorSupportBase):
            def is_node_supported(self, submodules: Any, node: Any) -> bool:
                return node.op in _CALLS and node.name not in refused

        weights = dict(zip((n.name for n in self.graph_module.graph.nodes if n.op == "placeholder"), self.weights))
        graph = torch.fx.Graph()
        graph.output(graph.graph_copy(self.graph_module.graph, {}))
        module = torch.fx.GraphModule(self.graph_module, graph)
        partitioner = CapabilityBasedPartitioner(module, Imported(), allows_single_node_partition=True)
        split = partitioner.fuse_partitions(partitioner.propose_partitions())
        for node in split.graph.nodes:
            if node.op == "call_module" and node.target.startswith("fused_"):
                part = getattr(split, node.target)
                flags = [isinstance(a, torch.fx.Node) and weights.get(a.name, False) for a in node.args]
                single = not isinstance(next(n for n in part.graph.nodes if n.op == "output").args[0], (tuple, list))
                setattr(split, node.target, _as_module(CapturedGraph(part, flags, self.options), single))
        return split, sorted(refused)


_CALLS = ("call_function", "call_method", "call_module")


def _placement(devices: Sequence[str], target: Any) -> tuple[Any, int | None]:
    """The target a graph whose tensors are on ``devices`` (besides the CPU) compiles for, and
    the GPU it runs on (None: the CPU): the target given, else the host; on one GPU
    (``cuda:N``), that GPU's (``_gpu_target``), or a CUDA target given.

    Raises:
        OnnxImportError: Where tilecraft cannot run the graph there (the graph runs in PyTorch).
    """
    if not devices:
        return target, None
    kind = getattr(Target.parse(target), "kind", "llvm") if target is not None else "cuda"
    if len(devices) != 1 or not devices[0].startswith("cuda:") or kind != "cuda":
        raise OnnxImportError(f"its tensors are on {', '.join(devices)}; tilecraft compiles for the CPU, or for "
                              f"one GPU with a CUDA target (options={{'target': 'cuda'}}, the default there)"
                              + (f", not {target!r}" if kind != "cuda" else ""))
    gpu = gpu_index(devices[0])
    return target or _gpu_target(gpu), gpu


def _as_module(captured: CapturedGraph, single: bool) -> Any:
    """A run of a split graph's operators as a module: its ``CapturedGraph``'s outputs, as the
    run's graph returns them (one value, or a tuple)."""
    torch = require_torch()

    class Part(torch.nn.Module):
        def forward(self, *args: Any) -> Any:
            outputs = captured(*args)
            return outputs[0] if single and isinstance(outputs, tuple) else outputs

    return Part()


def _imports_alone(node: Any, root: Any) -> bool:
    """Whether PyTorch exports ``node`` alone (on zeros of its inputs' shapes) and tilecraft imports it."""
    torch = require_torch()
    values = [arg.meta.get("example_value") for arg in node.all_input_nodes]
    if not all(isinstance(v, torch.Tensor) for v in [*values, node.meta.get("example_value")]):
        return False  # a size, a tuple, a value dynamo does not know: PyTorch handles it
    graph = torch.fx.Graph()
    placeholders = {arg: graph.placeholder(arg.name) for arg in node.all_input_nodes}
    graph.output(graph.node_copy(node, placeholders.__getitem__))
    try:
        inputs = [torch.zeros(tuple(v.shape), dtype=v.dtype) for v in values]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's advice on constant folding, once an operator
            from_onnx(to_onnx(torch.fx.GraphModule(root, graph), inputs))
    except Exception:  # noqa: BLE001 - whatever stops it, the operator stays with PyTorch
        return False
    return True

