"""GpuModel: a compiled model whose kernels run on an NVIDIA GPU.

``compile_model(model, "cuda")`` builds the same steps as for a CPU (one kernel per distinct
fused subgraph, reshapes as views) into CUDA kernels, and this class runs them: the weights
are uploaded on the first call and stay on the GPU, every value has GPU memory allocated
once (the inputs too), and a call copies the inputs in, launches every kernel in order on
one stream without waiting between them (``LaunchPlan``: the arguments of each launch
packed once; from the second call, or after ``capture``, one launch of a CUDA graph of them:
0.1 ms less a call on ResNet-50's 29 kernels on an H100), and copies the outputs out.
Inputs that are already GPU arrays (PyTorch, CuPy) are copied on the GPU, and the outputs
stay there.

The values between kernels share GPU buffers once their readers have run, as the CPU plan's
do. A model runs on GPU 0 until ``to`` moves it to another. ``save`` writes the cubins,
weights and plan that ``load_model`` reads. Without a GPU, ``emulate`` runs the same steps
with each kernel's schedule emulated on the CPU (``tc.emulate_gpu``): the plan and every
default GPU schedule can be checked against NumPy on any machine.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import TilecraftError
from ..schedule.trace import Trace
from ..target import CudaTarget
from ..graph.ir import Value


class GpuModel:
    """A whole model as CUDA kernels, called with NumPy arrays (or GPU arrays) by input name.

    ``model(**inputs)`` returns the output (a tuple for several), ``model.run(inputs)`` a
    dict by output name (NumPy arrays, or GPU arrays for GPU inputs). Made by
    ``compile_model`` for a CUDA target or by ``load_model``; the GPU buffers are shared by
    all calls, so a model must not be called from several threads at once.

    Attributes:
        inputs, outputs, kernels, target, untuned: as ``CompiledModel``'s; each kernel's
            ``module`` is a ``CudaModule``.
        capture_after: The calls that launch kernel by kernel before the launches are
            captured in a CUDA graph (``capture``); None: never.
        device: The index of the GPU it runs on (``to`` changes it); 0 at first.
    """

    capture_after: int | None = 1

    def __init__(self, inputs: Sequence[Value], outputs: Sequence[str], values: Mapping[str, Value],
                 kernels: Sequence, steps: Sequence, constants: Mapping[str, np.ndarray], target: str,
                 jobs: Sequence) -> None:
        self.inputs, self.outputs, self.values = tuple(inputs), tuple(outputs), dict(values)
        self.kernels, self.steps, self.constants, self.target = tuple(kernels), tuple(steps), dict(constants), target
        self.untuned: tuple = ()
        self.device = 0
        self._jobs = tuple(jobs)  # the KernelJobs that built the kernels: emulation replays them
        self._buffers: dict[str, Any] = {}  # a GPU array for every value, from the first call
        self._plan = None  # the launches over them
        self._graph = None  # the launches captured in a CUDA graph (``capture``, or the second call); False: refused
        self._plan_runs = 0
        self._emulated: list | None = None  # each kernel's emulation, from the first call of emulate
        self._emulated_source = False  # whether those run the kernels' CUDA C

    def __repr__(self) -> str:
        tuned = sum(kernel.tuned for kernel in self.kernels)
        return (f"GpuModel(({', '.join(f'{v.name}: {v}' for v in self.inputs)}) -> ({', '.join(self.outputs)}); "
                f"{len(self.steps)} steps, {len(self.kernels)} kernels of which {tuned} tuned; target {self.target}, "
                f"on cuda:{self.device})")

    def to(self, device: Any) -> GpuModel:
        """Run the model on GPU ``device`` from its next call: ``1``, ``"cuda:1"`` or
        ``torch.device("cuda", 1)`` (``"cuda"``: GPU 0). That call uploads the weights there
        and loads the kernels there; the buffers on the GPU it leaves are freed. Returns the
        model, as ``torch.nn.Module.to`` does. Its GPU arrays (inputs, ``out``) must then be on
        that GPU. The kernels were built for the target's architecture: a GPU of another one
        refuses them at the first call (``CUDA_ERROR_NO_BINARY_FOR_GPU``).

        Raises:
            ValueError: If ``device`` names no GPU. (A GPU that this machine lacks is named by
                the first call: ``CUDA_ERROR_INVALID_DEVICE``.)
        """
        from ..runtime.cuda import gpu_index

        index = gpu_index(device)
        if index != self.device:
            self.device, self._buffers, self._plan, self._graph, self._plan_runs = index, {}, None, None, 0
            self.kernels = tuple(replace(kernel, module=kernel.module.unloaded()) for kernel in self.kernels)
        return self

    def __call__(self, **inputs: Any):
        results = self.run(inputs)
        return results[self.outputs[0]] if len(self.outputs) == 1 else tuple(results[o] for o in self.outputs)

    def run(self, inputs: Mapping[str, Any], out: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Run the model once on the GPU; new outputs at every call, by name.

        With NumPy inputs, the call waits and the outputs are NumPy arrays. With GPU inputs
        (PyTorch or CuPy arrays, on the model's GPU), it returns without waiting and the
        outputs are ``DeviceArray``s there, which ``torch.as_tensor(y, device="cuda")`` or
        ``cupy.asarray(y)`` take without a copy; with ``out`` (a GPU array for every output,
        by name), they are copied into those instead: a library's own, from its allocator,
        where a new ``DeviceArray`` costs the driver an allocation and a free that waits for
        the GPU.

        Raises:
            ModelInputError: If an input (or an array of ``out``) is missing or unknown, or has the
                wrong shape or dtype.
            TargetError: If there is no GPU or cuda-bindings here.
        """
        from ..runtime.cuda import DeviceArray, device_pointer, gpu_array
        from ..runtime.module import ArgSpec
        from .compiled import ModelInputError

        if out is not None:  # checked before anything runs
            wanted = f"out= must give each output ({', '.join(self.outputs)}) a GPU array"
            if sorted(out) != sorted(self.outputs):
                raise ModelInputError(f"{wanted}, not {sorted(out)}")
            try:
                for name, value in ((name, self.values[name]) for name in self.outputs):
                    device_pointer("out", ArgSpec(name, value.shape, value.dtype, True), out[name], self.device)
            except (TypeError, ValueError) as error:
                raise ModelInputError(f"{wanted}: {error}") from None
        on_gpu = any(hasattr(gpu_array(array), "__cuda_array_interface__") for array in inputs.values())
        self._launch(inputs)
        if out is not None:
            for name in self.outputs:
                DeviceArray.view(out[name], self.values[name].shape).copy_from(self._buffers[name])
            return dict(out)
        return {name: self._buffers[name].copy() if on_gpu else self._buffers[name].numpy() for name in self.outputs}

    def capture(self, inputs: Mapping[str, Any]) -> None:
        """Capture the model's launches in a CUDA graph now (one call with ``inputs`` first
        sets up its buffers), as a model of several kernels does by itself at its second
        call: later calls launch the graph, one launch for the whole model instead of one a
        kernel. The addresses are fixed, so the graph stays valid; ``profile`` still launches
        kernel by kernel.

        Raises:
            ModelInputError: As ``run``.
            TilecraftError: If the driver refuses the capture.
        """
        from ..runtime.cuda import LaunchGraph

        self.run(inputs)
        self._graph = self._graph or LaunchGraph(self._plan)

    def profile(self, inputs: Mapping[str, Any], rounds: int = 20) -> list:
        """Per kernel, the median over ``rounds`` calls of the seconds its launches take, each
        waited for before the next starts; most expensive first (``CompiledModel.profile``)."""
        from .compiled import kernel_times

        owners = [step.kernel for step in self.steps if step.kernel is not None]
        return kernel_times(self.kernels, self.steps, owners, lambda seconds: self._launch(inputs, seconds), rounds)

    def save(self, directory: str | Path) -> None:
        """Write the model to ``directory`` for ``load_model``: ``model.json`` (the plan), each
        kernel's cubin and CUDA source, and the weights as ``.npy`` files."""
        from .compiled import write_plan

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        kernels = []
        for n, kernel in enumerate(self.kernels):
            (directory / f"kernel_{n}.cubin").write_bytes(kernel.module.cubin)
            (directory / f"kernel_{n}.cu").write_text(kernel.module.source)
            kernels.append({"desc": kernel.desc, "workload_key": kernel.workload_key, "tuned": kernel.tuned,
                            "trace": kernel.trace, "cubin": f"kernel_{n}.cubin", "source": f"kernel_{n}.cu",
                            **kernel.module.to_json()})
        write_plan(directory, self, kernels)

    def emulate(self, inputs: Mapping[str, np.ndarray], cuda_source: bool = False) -> dict[str, np.ndarray]:
        """Run the model's steps on this CPU, each kernel's GPU schedule emulated (serially,
        as the GPU would distribute it): slow, but it checks the model where there is no GPU.
        With ``cuda_source``, each kernel's CUDA C runs instead (``tc.emulate_gpu``'s).

        Raises:
            ModelInputError: As ``run``.
        """
        from ..build import cuda_on_cpu, emulate_lowered
        from ..ir.lower import lower
        from .compiled import check_inputs

        if len(self._jobs) != len(self.kernels):
            raise TilecraftError("a GpuModel read by load_model keeps its cubins, not the compute DAGs that emulation "
                                 "replays its schedules on; compile the model with compile_model to emulate it")
        if self._emulated is None or self._emulated_source != cuda_source:
            run = cuda_on_cpu if cuda_source else emulate_lowered
            self._emulated = [run(job.placed(lower(Trace.from_json(k.trace).replay(job.dag))), CudaTarget(self.target))
                              for k, job in zip(self.kernels, self._jobs)]
            self._emulated_source = cuda_source
        arrays: dict[str, np.ndarray] = {**self.constants, **check_inputs(self.inputs, inputs)}
        for step in self.steps:
            if step.kernel is None:
                arrays[step.outputs[0]] = arrays[step.inputs[0]].reshape(self.values[step.outputs[0]].shape)
                continue
            outs = [arrays[n] if n in arrays else np.empty(self.values[n].shape, self.values[n].dtype)
                    for n in step.outputs]  # a concatenation its producers write in place: one array
            self._emulated[step.kernel](*(arrays[n] for n in step.inputs), *outs)
            arrays.update(zip(step.outputs, outs))
        return {name: arrays[name].copy() for name in self.outputs}

    def _launch(self, inputs: Mapping[str, Any], seconds: np.ndarray | None = None) -> None:
        """The inputs checked and copied into their GPU buffers, then every kernel launched."""
        from ..runtime.cuda import device_pointer
        from ..runtime.module import ArgSpec
        from .compiled import ModelInputError, check_inputs

        given = check_inputs(self.inputs, inputs, gpu=True)
        for value in self.inputs:
            if hasattr(given[value.name], "__cuda_array_interface__"):
                try:
                    where, _ = device_pointer("the model", ArgSpec(value.name, value.shape, value.dtype, False),
                                              given[value.name], None)
                except (TypeError, ValueError) as error:
                    raise ModelInputError(str(error)) from None
                if where != self.device:
                    raise ModelInputError(f"input {value.name} is on cuda:{where} but the model runs on "
                                          f"cuda:{self.device}; move it with .to('cuda:{self.device}'), or the "
                                          f"model with model.to('cuda:{where}')")
        if self._plan is None:
            self._plan = self._launch_plan()
        for name, array in given.items():
            self._buffers[name].copy_from(array)
        if (self._graph is None and self.capture_after is not None and self._plan_runs >= self.capture_after
                and len(self._plan) > 1 and seconds is None):
            self._graph = self._captured()  # one launch where the plan costs one a kernel
        if self._graph and seconds is None:
            self._graph.run()
        else:
            self._plan.run(seconds)
            self._plan_runs += 1

    def _captured(self):
        """The plan's launches as a CUDA graph; False where the driver refuses it (the plan runs)."""
        from ..runtime.cuda import LaunchGraph

        try:
            return LaunchGraph(self._plan)
        except TilecraftError:
            return False

    def _launch_plan(self):
        """On the first call: the weights uploaded, a GPU buffer for every input and output, the
        values between kernels in GPU buffers reused once their readers have run (as the CPU
        plan's, ``plan_buffers``; a reshape a view of its source's), and the launches over them."""
        from ..runtime.cuda import DeviceArray, LaunchPlan
        from .compiled import plan_buffers

        device = self.device
        buffers = {name: DeviceArray(array, device) for name, array in self.constants.items()}
        written = {name for step in self.steps if step.kernel is not None for name in step.outputs}
        buffers.update((name, DeviceArray.empty(self.values[name].shape, self.values[name].dtype, device))
                       for name in [*(v.name for v in self.inputs), *(o for o in self.outputs if o in written)])
        buffers.update(plan_buffers(self.steps, self.values, set(self.outputs),
                                    lambda nbytes: DeviceArray.empty((nbytes,), "uint8", device),
                                    lambda raw, value: DeviceArray.view(raw, value.shape, value.dtype)))
        for step in self.steps:
            if step.kernel is None:
                buffers[step.outputs[0]] = DeviceArray.view(buffers[step.inputs[0]], self.values[step.outputs[0]].shape)
        self._buffers = buffers
        return LaunchPlan([(self.kernels[step.kernel].module, [buffers[name].pointer for name in step.inputs
                                                              + step.outputs])
                           for step in self.steps if step.kernel is not None], device)
