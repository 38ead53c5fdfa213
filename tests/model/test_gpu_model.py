"""compile_model for a CUDA target: every fused subgraph built with nvcc for sm_90 on its default
GPU schedule; the model's steps checked against onnxruntime with each kernel emulated on the CPU;
and a call's traffic (weights uploaded once, activations in GPU buffers allocated once, outputs
copied back) checked with a fake driver whose kernels run their emulations on its memory."""

import ctypes
import dataclasses
import gc
import shutil
import time
import warnings

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.database.record import TuningRecord
from tilecraft.errors import TilecraftError
from tilecraft.measure import MeasureErrorKind, MeasureInput, MeasureResult
from tilecraft.model.compiled import DefaultScheduleWarning, ModelInputError, plan_buffers
from tilecraft.model.gpu import GpuModel
from tilecraft.runtime import cuda as cuda_runtime
from tilecraft.search.default import default_row
from tilecraft.search.space import generate_sketches

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx_models import tiny_cnn, tiny_transformer  # noqa: E402
from test_cuda_runtime import FakeGpuArray, FakeMemoryDriver  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not on PATH")
TARGET = "cuda -arch=sm_90"


@pytest.fixture(scope="module", params=[tiny_cnn, pytest.param(tiny_transformer, marks=pytest.mark.slow)],
                ids=["cnn", "transformer"])
def compiled(request, tmp_path_factory):
    model = request.param()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DefaultScheduleWarning)
        gpu = tc.compile_model(model, TARGET, cache_dir=tmp_path_factory.mktemp("cubins"))
    assert any(issubclass(w.category, DefaultScheduleWarning) for w in caught)  # untuned, and said so
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(v.shape).astype(v.dtype) for v in gpu.inputs}
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    return gpu, feeds, dict(zip(gpu.outputs, expected))


@pytest.mark.slow
def test_a_model_compiled_for_cuda_is_cuda_kernels_that_compute_what_onnxruntime_does(compiled):
    gpu, feeds, expected = compiled
    assert isinstance(gpu, GpuModel) and all("__global__" in k.module.source for k in gpu.kernels)
    got = gpu.emulate(feeds)
    for name in gpu.outputs:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler")
def test_a_models_kernels_cuda_c_run_on_the_cpu_computes_what_onnxruntime_does(compiled):
    gpu, feeds, expected = compiled
    got = gpu.emulate(feeds, cuda_source=True)
    for name in gpu.outputs:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5)
    gpu.emulate(feeds)  # the shared model back on its loop nests' emulations, quicker for the other tests


class EmulatedKernel:
    """What the fake driver runs for a kernel: its CPU emulation, on the fake GPU memory."""

    def __init__(self, emulated, args, driver):
        self.emulated, self.args, self.driver = emulated, args, driver

    def __call__(self, *pointers):
        host = [np.frombuffer(self.driver.memory[p], spec.dtype, count=int(np.prod(spec.shape))).reshape(spec.shape)
                .copy() for p, spec in zip(pointers, self.args)]
        self.emulated(*host)
        for p, spec, values in zip(pointers, self.args, host):
            if spec.is_output:
                self.driver.memory[p][:values.nbytes] = values.tobytes()


def on_fake_gpu(gpu, feeds, monkeypatch, driver=None):
    """A fake driver, and ``gpu`` with each kernel's cubin standing for its emulation there."""
    driver = driver or FakeMemoryDriver()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_runtime, "_KEPT_CONTEXTS", {})
    gpu.emulate(feeds)  # makes the emulations
    kernels = []
    for n, (kernel, emulated) in enumerate(zip(gpu.kernels, gpu._emulated)):
        module = cuda_runtime.CudaModule(f"kernel {n}".encode(), "", kernel.module.entry, kernel.module.args,
                                         kernel.module.launches, kernel.module.workspace)
        driver.kernels[module.cubin] = EmulatedKernel(emulated, module.args, driver)
        kernels.append(dataclasses.replace(kernel, module=module))
    return driver, GpuModel(gpu.inputs, gpu.outputs, gpu.values, kernels, gpu.steps, gpu.constants, gpu.target,
                            gpu._jobs)


@pytest.mark.slow
def test_a_call_uploads_the_weights_once_and_keeps_activations_on_the_gpu(compiled, monkeypatch):
    gpu, feeds, expected = compiled
    driver, model = on_fake_gpu(gpu, feeds, monkeypatch)
    launches = sum(step.kernel is not None for step in model.steps)
    for call in range(2):
        uploads, downloads = driver.uploads, driver.downloads
        got = model.run(feeds)
        for name in model.outputs:
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5)
        weights = len(model.constants) if call == 0 else 0
        assert driver.uploads - uploads == weights + len(feeds)  # the inputs; the weights once
        assert driver.downloads - downloads == len(model.outputs)
        assert driver.launches == (call + 1) * launches
        allocated = len(driver.memory)
    written = {name for step in model.steps if step.kernel is not None for name in step.outputs}
    between = []  # the buffers of the values between kernels, shared once their readers have run
    plan_buffers(model.steps, model.values, set(model.outputs), lambda n: between.append(n) or np.empty(n, np.uint8))
    outputs = [name for name in model.outputs if name in written]  # not views
    assert allocated == len(model.constants) + len(model.inputs) + len(outputs) + len(between)  # once
    assert len(between) < len(written) - len(model.outputs)
    on_gpu = model.run({name: cuda_runtime.DeviceArray(array) for name, array in feeds.items()})
    for name in model.outputs:  # GPU arrays in, new GPU arrays out
        assert isinstance(on_gpu[name], cuda_runtime.DeviceArray)
        np.testing.assert_allclose(on_gpu[name].numpy(), expected[name], rtol=1e-4, atol=1e-5)
    given = {name: cuda_runtime.DeviceArray.empty(model.values[name].shape, model.values[name].dtype)
             for name in model.outputs}  # a library's own arrays (PyTorch's, made by its allocator)
    inputs = {n: cuda_runtime.DeviceArray(a) for n, a in feeds.items()}
    allocated = len(driver.memory)
    assert model.run(inputs, out=given) == given and len(driver.memory) == allocated  # no output made
    for name in model.outputs:
        np.testing.assert_allclose(given[name].numpy(), expected[name], rtol=1e-4, atol=1e-5)
    first = model.outputs[0]
    for wrong, message in (({}, r"out= must give each output \(.*\) a GPU array, not \[\]"),
                           ({**given, first: expected[first]}, f"out: output '{first}' is in the CPU, not on a GPU"),
                           ({**given, first: FakeGpuArray((1,))}, f"out: output '{first}' has shape \\(1,\\)")):
        with pytest.raises(ModelInputError, match=message):
            model.run(feeds, out=wrong)
    times = model.profile(feeds, rounds=2)
    assert sorted(t.desc for t in times) == sorted(k.desc for k in model.kernels)
    assert sum(t.calls for t in times) == launches


def test_a_captured_model_is_one_graph_launch_a_call_and_computes_the_same(compiled, monkeypatch):
    gpu, feeds, expected = compiled
    driver, model = on_fake_gpu(gpu, feeds, monkeypatch)
    launches = sum(step.kernel is not None for step in model.steps)
    model.capture(feeds)
    assert driver.launches == launches and driver.graph_launches == 0  # the first call ran, the capture did not
    for call in range(1, 3):
        shifted = {name: array * call for name, array in feeds.items()}
        got = model.run(shifted)
        assert driver.graph_launches == call and driver.launches == (call + 1) * launches
        reference = model.emulate(shifted)
        for name in model.outputs:
            np.testing.assert_allclose(got[name], reference[name], rtol=1e-4, atol=1e-5)
    model.profile(feeds, rounds=1)  # kernel by kernel, to time each
    assert driver.graph_launches == 2
    graph = model._graph
    model._graph = None
    del graph
    gc.collect()
    assert sorted(driver.freed) == ["executable", "graph", "stream"]


def test_from_its_second_call_a_model_launches_one_cuda_graph_and_one_the_driver_refuses_runs_its_plan(
        compiled, monkeypatch):
    gpu, feeds, expected = compiled
    driver, model = on_fake_gpu(gpu, feeds, monkeypatch)
    launches = sum(step.kernel is not None for step in model.steps)
    for call in range(3):  # the first sets up the buffers and runs the plan; the second captures it
        got = model.run(feeds)
        assert driver.graph_launches == call and driver.launches == (call + 1) * launches
        for name in model.outputs:
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5)
    _, refusing = on_fake_gpu(gpu, feeds, monkeypatch)
    monkeypatch.setattr(cuda_runtime.LaunchGraph, "__init__",
                        lambda self, plan: (_ for _ in ()).throw(TilecraftError("capture refused")))
    for _ in range(3):
        got = refusing.run(feeds)
    assert refusing._graph is False and refusing._plan_runs == 3
    np.testing.assert_allclose(got[model.outputs[0]], expected[model.outputs[0]], rtol=1e-4, atol=1e-5)
    with pytest.raises(TilecraftError, match="capture refused"):  # asked for, it says why
        refusing.capture(feeds)


class FakeGpusDriver(FakeMemoryDriver):
    """The fake memory of several GPUs: each allocation belongs to the GPU whose context is
    current, and a copy, a kernel's loading or a launch happens on that GPU, touching its
    memory alone (as the driver would fail, or copy between GPUs, were it otherwise)."""

    def __init__(self):
        super().__init__()
        self.current, self.owner, self.loaded_on = [], {}, []

    def cuDeviceGet(self, ordinal):
        return 0, ordinal

    def cuDevicePrimaryCtxRetain(self, device):
        super().cuDevicePrimaryCtxRetain(device)
        return 0, ("context", device)

    def cuCtxPushCurrent(self, context):
        self.current.append(context[1])
        return (0,)

    def cuCtxPopCurrent(self):
        self.current.pop()
        return (0,)

    def cuMemAlloc(self, size):
        status, pointer = super().cuMemAlloc(size)
        self.owner[pointer] = self.current[-1]
        return status, pointer

    def here(self, *pointers):
        assert {self.owner[p] for p in pointers} == {self.current[-1]}, "memory of another GPU"

    def cuMemcpyHtoD(self, pointer, host, size):
        self.here(pointer)
        return super().cuMemcpyHtoD(pointer, host, size)

    def cuMemcpyDtoH(self, host, pointer, size):
        self.here(pointer)
        return super().cuMemcpyDtoH(host, pointer, size)

    def cuMemcpyDtoD(self, destination, source, size):
        self.here(destination, source)
        return super().cuMemcpyDtoD(destination, source, size)

    def cuModuleLoadData(self, cubin):
        self.loaded_on.append(self.current[-1])
        return super().cuModuleLoadData(cubin)

    def _run(self, function, params):
        count = len(self.kernels[function].args)
        addresses = np.frombuffer((ctypes.c_uint64 * count).from_address(params), np.uint64)
        self.here(*(int(np.frombuffer((ctypes.c_uint64 * 1).from_address(int(a)), np.uint64)[0]) for a in addresses))
        super()._run(function, params)


def test_a_model_moved_to_another_gpu_runs_there_alone_and_takes_arrays_from_there(compiled, monkeypatch):
    gpu, feeds, expected = compiled
    driver, model = on_fake_gpu(gpu, feeds, monkeypatch, FakeGpusDriver())
    model.run(feeds)
    assert model.device == 0 and set(driver.owner.values()) == set(driver.loaded_on) == {0}
    loads = len(driver.loaded_on)
    assert model.to("cuda:1") is model and model.device == 1 and repr(model).endswith("on cuda:1)")
    for call in range(3):  # kernel by kernel, then captured in a graph; each launch's memory on GPU 1 (the driver)
        got = model.run(feeds)
        for name in model.outputs:
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5)
    assert driver.graph_launches == 2 and driver.loaded_on[loads:] == [1] * loads
    gc.collect()
    assert {driver.owner[pointer] for pointer in driver.memory} == {1}  # GPU 0's buffers freed
    on_one = model.run({name: cuda_runtime.DeviceArray(array, 1) for name, array in feeds.items()})
    for name in model.outputs:
        assert on_one[name].device == 1
        np.testing.assert_allclose(on_one[name].numpy(), expected[name], rtol=1e-4, atol=1e-5)
    name = model.inputs[0].name
    elsewhere = {**feeds, name: FakeGpuArray(model.inputs[0].shape, device=0)}
    with pytest.raises(ModelInputError, match=fr"input {name} is on cuda:0 but the model runs on cuda:1; move it "
                                              fr"with .to\('cuda:1'\), or the model with model.to\('cuda:0'\)"):
        model.run(elsewhere)
    first = model.outputs[0]
    given = {n: cuda_runtime.DeviceArray.empty(model.values[n].shape, model.values[n].dtype, 0) for n in model.outputs}
    with pytest.raises(ModelInputError, match=f"out: output '{first}' is on cuda:0 but the kernel runs on cuda:1"):
        model.run(feeds, out=given)
    assert model.to(torch_device_like("cuda", 0)).device == 0 and model.to("cuda").device == 0
    np.testing.assert_allclose(model.run(feeds)[first], expected[first], rtol=1e-4, atol=1e-5)  # loaded on 0 again
    assert driver.loaded_on[-1] == 0
    for wrong in ("cpu", "cuda:-1", -1, "cuda1"):
        with pytest.raises(ValueError, match=f"device {wrong!r} names no GPU; name one as 1, 'cuda:1'"):
            model.to(wrong)


class torch_device_like:  # noqa: N801 - stands for torch.device, which prints as its name
    def __init__(self, kind, index):
        self.kind, self.index = kind, index

    def __str__(self):
        return f"{self.kind}:{self.index}"


def test_a_wrong_input_is_named_before_anything_reaches_the_gpu(compiled):
    gpu, feeds, _ = compiled
    name = gpu.inputs[0].name
    with pytest.raises(ModelInputError, match=f"input {name} must be a GPU or numpy array"):
        gpu.run({name: feeds[name][..., :1]})
    with pytest.raises(ModelInputError, match="missing input"):
        gpu.emulate({})
    value = gpu.inputs[0]
    itemsize = np.dtype(value.dtype).itemsize
    transposed = FakeGpuArray(value.shape, value.dtype, strides=(itemsize,) * len(value.shape))  # copied as bytes
    with pytest.raises(ModelInputError, match=rf"input {name} is a GPU array that is not C-contiguous; pass "
                                              rf"x.contiguous\(\)"):
        gpu.run({**feeds, name: transposed})


def test_a_saved_gpu_model_loads_without_a_compiler_and_runs_the_same(compiled, monkeypatch, tmp_path):
    gpu, feeds, expected = compiled
    _, model = on_fake_gpu(gpu, feeds, monkeypatch)
    model.save(tmp_path / "saved")
    assert sorted(p.suffix for p in (tmp_path / "saved").iterdir() if p.is_file()).count(".cubin") == len(gpu.kernels)
    loaded = tc.load_model(tmp_path / "saved")
    assert isinstance(loaded, GpuModel) and loaded.target == gpu.target
    assert [k.module.cubin for k in loaded.kernels] == [k.module.cubin for k in model.kernels]
    assert [k.module.launches for k in loaded.kernels] == [k.module.launches for k in gpu.kernels]
    got = loaded.run(feeds)
    for name in gpu.outputs:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5)
    with pytest.raises(tc.TilecraftError, match="compile the model with compile_model to emulate it"):
        loaded.emulate(feeds)


@pytest.mark.parametrize("axis", [1, pytest.param(0, marks=pytest.mark.slow)], ids=["columns", "rows"])
def test_a_gpu_models_concatenation_is_written_in_place_by_its_producers(axis, tmp_path):
    from tilecraft.graph import run_reference
    from test_compiled import branches_into_concat, compile_quietly

    graph = branches_into_concat(axis=axis)
    gpu = compile_quietly(graph, TARGET, cache_dir=tmp_path)
    assert not [k.desc for k in gpu.kernels if k.desc.startswith("concat")]
    x = np.random.default_rng(1).standard_normal((6, 8)).astype("float32")
    expected = run_reference(graph, {"x": x})
    got = gpu.emulate({"x": x})
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cuda_source", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["loop-nests", "cuda-c"])
def test_a_gpu_models_slices_and_transposes_are_read_where_they_lie(cuda_source, tmp_path, monkeypatch):
    """Emulated, and launched on the fake GPU (its kernels passed views of the arrays they read).
    The keys transposed for their product are read transposed by it (``transpose_b``), where a
    CPU copies them (``test_compiled``; ``graph/transposed_operands.py`` says why)."""
    from tilecraft.graph import run_reference
    from test_compiled import attention_heads, compile_quietly

    graph = attention_heads(keys_transposed=True)
    gpu = compile_quietly(graph, TARGET, cache_dir=tmp_path)
    assert not [k.desc for k in gpu.kernels if k.desc.startswith(("strided_slice", "transpose"))]
    assert [k.desc for k in gpu.kernels if k.desc.startswith("matmul")] == ["matmul 6x6", "matmul 6x8"]
    x = np.random.default_rng(1).standard_normal((6, 8)).astype("float32")
    expected = run_reference(graph, {"x": x})
    got = gpu.emulate({"x": x}, cuda_source=cuda_source)
    _, launched = on_fake_gpu(gpu, {"x": x}, monkeypatch)
    for run in (got, launched.run({"x": x})):
        for name in expected:
            np.testing.assert_allclose(run[name], expected[name], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_split_k_records_give_kernels_that_add_into_outputs_the_launch_zeroes(kernel_cache, tmp_path, monkeypatch):
    """A transformer whose projections' records split their reductions over blocks (their bias
    and residual added by the first part; the GELU'd one's parts through a workspace, added up
    by a second kernel): right in emulation and on the fake GPU, each launch zeroing what it
    adds into, though the model's buffers are shared."""
    model = tiny_transformer(seq=4, dim=128)
    target = tc.Target(TARGET)
    tasks, _ = tc.extract_tasks(model, target)
    log = tmp_path / "split_k.json"
    with open(log, "w") as lines:
        for task in tasks:
            sketch = next((s for s in generate_sketches(task.compute_dag, target=target) if "split_k" in s.name), None)
            if sketch is not None:
                candidate = MeasureInput(task.compute_dag, target, sketch.trace_of(default_row(sketch, 1)))
                measured = MeasureResult((1e-6,), MeasureErrorKind.NONE, "", 1.0, time.time())
                lines.write(TuningRecord.from_measurement(task, candidate, measured, sketch).to_json_line() + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        gpu = tc.compile_model(model, TARGET, log=log, cache_dir=kernel_cache)
    split = [k.desc for k in gpu.kernels if k.module.launches[0].zeroed]
    assert sum(desc.startswith("dense+add") for desc in split) >= 3, split  # q, k, v; the output with its residual
    in_workspace = [k.desc for k in gpu.kernels if len(k.module.launches) == 2 and k.module.workspace]
    assert in_workspace == ["dense+add+gelu 4x256"], in_workspace
    feeds = {"input": np.random.default_rng(0).standard_normal((1, 4, 128)).astype(np.float32)}
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(gpu.emulate(feeds)["output"], expected, rtol=1e-4, atol=1e-4)
    driver, on_gpu = on_fake_gpu(gpu, feeds, monkeypatch)
    for _ in range(2):
        np.testing.assert_allclose(on_gpu.run(feeds)["output"], expected, rtol=1e-4, atol=1e-4)
    on_gpu.save(tmp_path / "saved")  # the workspace kernel's launches and workspace travel with its cubin
    loaded = tc.load_model(tmp_path / "saved")
    assert [(k.module.launches, k.module.workspace) for k in loaded.kernels] == \
        [(k.module.launches, k.module.workspace) for k in gpu.kernels]
    np.testing.assert_allclose(loaded.run(feeds)["output"], expected, rtol=1e-4, atol=1e-4)


def test_a_model_without_kernels_emulates_too():
    """A reshape alone needs no kernel: there is nothing to replay, and emulation runs it."""
    from onnx import TensorProto, helper

    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [3, 4])
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "reshape",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], [shape])
    gpu = tc.compile_model(helper.make_model(graph), TARGET)
    assert not gpu.kernels
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(gpu.emulate({"x": x})["y"], x.reshape(3, 4))
