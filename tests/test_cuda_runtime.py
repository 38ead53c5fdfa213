"""The CUDA runtime: NVRTC or nvcc to a cached cubin, the checks of a call's arrays (all before any
driver call, so they run without a GPU), and, where a GPU and cuda-bindings are found,
calls and timings with NumPy arrays and PyTorch tensors."""

import collections
import ctypes
import gc
import os
import shutil
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from tilecraft.measure import device_check, worker
from tilecraft.errors import BuildError, BuildTimeoutError, TilecraftError
from tilecraft.runtime import ArgSpec, ProfileResult
from tilecraft.runtime import cuda as cuda_runtime
from tilecraft.runtime import cuda_compiler, nvrtc
from tilecraft.runtime.cuda import CudaModule, LaunchSpec, bind_arrays, cuda_available, launch_json
from tilecraft.runtime.compiler import BACKGROUND_NICENESS
from tilecraft.runtime.cuda_compiler import compile_cuda
from tilecraft.runtime.nvrtc import nvrtc_version
from tilecraft.te.dtype import NUMPY_DTYPES

N = 1000
ADD = """
extern "C" __global__ void vector_add(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < 1000) c[i] = a[i] + b[i];
}
"""
ADD_ARGS = [ArgSpec("a", (N,), "float32", False), ArgSpec("b", (N,), "float32", False),
            ArgSpec("c", (N,), "float32", True)]
ADD_LAUNCH = LaunchSpec((4, 1, 1), (256, 1, 1))

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not on PATH")
needs_gpu = pytest.mark.skipif(shutil.which("nvcc") is None or not cuda_available(),
                               reason="needs nvcc, cuda-bindings (pip install -e '.[cuda]') and an NVIDIA GPU")


class FakeGpuArray:
    """A GPU array as PyTorch and CuPy present one, at a made-up address: checks only, never launched."""

    def __init__(self, shape, dtype="float32", device=0, strides=None, address=0x7F0000000000):
        self.interface = {"shape": shape, "typestr": np.dtype(dtype).str, "data": (address, False),
                          "strides": strides, "version": 3}
        self.device = device

    @property
    def __cuda_array_interface__(self):
        return self.interface

    def __dlpack_device__(self):
        return (2, self.device)


class FakeDlpackArray:
    """An array that speaks DLPack only, on device type ``kind`` (2 CUDA, 1 CPU)."""

    def __init__(self, kind, device):
        self.where = (kind, device)

    def __dlpack__(self, stream=None):
        raise AssertionError("the check must refuse it before asking for the data")

    def __dlpack_device__(self):
        return self.where


def add_module(cubin=b"not loaded in these tests"):
    return CudaModule(cubin, ADD, "vector_add", ADD_ARGS, ADD_LAUNCH)


def host_inputs():
    return np.arange(N, dtype=np.float32), np.full(N, 0.5, dtype=np.float32)


# NVRTC, nvcc and the cache

needs_nvrtc = pytest.mark.skipif(nvrtc_version() is None, reason="NVRTC needs pip install -e '.[cuda]'")
COMPILERS = [pytest.param("nvrtc", marks=needs_nvrtc), pytest.param("nvcc", marks=needs_nvcc)]
COMPILER_CALL = {"nvrtc": "compile_with_nvrtc", "nvcc": "_run_compiler"}  # what a build calls, by compiler


@pytest.mark.parametrize("compiler", COMPILERS)
def test_compile_cuda_makes_a_cubin(tmp_path, compiler):
    cubin = compile_cuda(ADD, cache_dir=tmp_path, compiler=compiler)
    assert cubin.startswith(b"\x7fELF") and b"vector_add" in cubin  # a cubin is an ELF file with the kernel
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".cu", ".cubin"]  # no temporaries left


@pytest.mark.parametrize("compiler", COMPILERS)
def test_same_cuda_source_is_compiled_once(tmp_path, monkeypatch, compiler):
    first = compile_cuda(ADD, cache_dir=tmp_path, compiler=compiler)

    def fail(*args, **kwargs):
        raise AssertionError(f"{compiler} ran again")

    monkeypatch.setattr(cuda_compiler, COMPILER_CALL[compiler], fail)
    assert compile_cuda(ADD, cache_dir=tmp_path, compiler=compiler) == first
    with pytest.raises(AssertionError, match="ran again"):
        compile_cuda(ADD, arch="sm_80", cache_dir=tmp_path, compiler=compiler)  # other flags, another key


@needs_nvrtc
@needs_nvcc
def test_nvrtc_is_the_default_where_it_loads_and_nvcc_where_it_does_not(tmp_path, monkeypatch):
    """The two compilers' cubins are cached apart; without NVRTC's library, nvcc builds."""
    assert compile_cuda(ADD, cache_dir=tmp_path) == compile_cuda(ADD, cache_dir=tmp_path, compiler="nvrtc")
    monkeypatch.setattr(cuda_compiler, "nvrtc_version", lambda: None)
    assert compile_cuda(ADD, cache_dir=tmp_path) == compile_cuda(ADD, cache_dir=tmp_path, compiler="nvcc")
    assert len(list(tmp_path.glob("*.cubin"))) == 2
    with pytest.raises(BuildError, match="NVRTC.*could not be loaded.*tilecraft\\[cuda\\].*compiler='nvcc'"):
        compile_cuda(ADD, cache_dir=tmp_path, compiler="nvrtc")
    with pytest.raises(ValueError, match="compiler='clang'.*'nvrtc', 'nvcc' or None"):
        compile_cuda(ADD, cache_dir=tmp_path, compiler="clang")


@pytest.mark.parametrize("compiler", COMPILERS)
def test_cuda_compile_error_quotes_the_offending_line(tmp_path, compiler):
    source = 'extern "C" __global__ void k(float* a) {\n    a[0] = 1.0f;\n    a[1] = not_declared;\n}\n'
    with pytest.raises(BuildError) as info:
        compile_cuda(source, cache_dir=tmp_path, compiler=compiler)
    message = str(info.value)
    assert "not_declared" in message and "error" in message
    assert "line 3: a[1] = not_declared;" in message
    assert "line 2" not in message


@pytest.mark.parametrize("compiler", COMPILERS)
def test_cuda_compile_past_its_timeout_is_stopped(tmp_path, compiler):
    with pytest.raises(BuildTimeoutError, match=f"(?i){compiler} took longer.*timeout_secs"):
        compile_cuda(ADD + "// a source not cached yet\n", cache_dir=tmp_path, timeout_secs=0.001, compiler=compiler)


SLOW_TO_COMPILE = ('extern "C" __global__ void slow(float* a) {\n'
                   '    float x = a[threadIdx.x], y = a[threadIdx.x + 1];\n'
                   + "".join(f"    x = x * y + a[{i % 997}]; y = y * 0.999f + x * a[{i * 7 % 991}];\n"
                             for i in range(3000))
                   + "    a[threadIdx.x] = x + y;\n}\n")  # seconds in NVRTC


@needs_nvrtc
@pytest.mark.slow
def test_an_nvrtc_worker_that_dies_fails_its_kernel_alone_and_is_replaced(tmp_path, monkeypatch):
    """NVRTC runs in worker processes: one killed mid-compilation (as the OOM killer would) is
    a BuildError for that kernel, and the next kernel builds in a new worker."""
    taken = []

    def take():
        taken.append(take.original())
        return taken[-1]

    take.original = nvrtc._Worker.take
    monkeypatch.setattr(nvrtc._Worker, "take", take)
    threading.Timer(0.5, lambda: taken[0].process.kill()).start()
    with pytest.raises(BuildError, match="NVRTC's worker died compiling .*out of memory.*unroll less"):
        compile_cuda(SLOW_TO_COMPILE, cache_dir=tmp_path, compiler="nvrtc", timeout_secs=60)
    assert compile_cuda(ADD, cache_dir=tmp_path, compiler="nvrtc").startswith(b"\x7fELF")
    assert taken[1] is not taken[0] and taken[0].process.returncode == -9


@needs_nvrtc
def test_an_nvrtc_worker_that_does_not_answer_in_time_is_stopped(tmp_path, monkeypatch):
    worker = nvrtc._Worker.take()
    nvrtc._Worker.give_back(worker)
    monkeypatch.setattr(nvrtc.select, "select", lambda *args: ([], [], []))
    with pytest.raises(BuildTimeoutError, match="NVRTC took longer than 5 s.*stopped"):
        compile_cuda(ADD + "// not cached\n", cache_dir=tmp_path, compiler="nvrtc", timeout_secs=5)
    assert worker.process.poll() is not None  # killed, not given back
    monkeypatch.undo()
    assert compile_cuda(ADD, cache_dir=tmp_path, compiler="nvrtc").startswith(b"\x7fELF")


@needs_nvrtc
def test_nvrtc_compiles_nicer_than_the_tuner_so_that_timing_gpu_kernels_meanwhile_gets_a_core(tmp_path):
    worker = nvrtc._Worker.take()
    try:
        worker.ask({"source": ADD, "arch": "sm_90", "timeout": 60, "name": "add.cu", "output": str(tmp_path / "a")})
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, worker.process.pid) == min(19, ours + BACKGROUND_NICENESS)
    finally:
        nvrtc._Worker.give_back(worker)


def test_nvcc_runs_nicer_than_the_tuner(tmp_path, monkeypatch):
    """nvcc's driver is made nicer as it starts, and the programs it runs inherit it: here a
    shell in its place reports its niceness in the error."""
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\nsleep 0.2; echo niceness $(nice) >&2; exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(cuda_compiler, "_nvcc_version", lambda nvcc: "fake")
    with pytest.raises(BuildError) as info:
        compile_cuda(ADD, cache_dir=tmp_path, compiler="nvcc")
    assert f"niceness {min(19, os.getpriority(os.PRIO_PROCESS, 0) + BACKGROUND_NICENESS)}" in str(info.value)


def test_missing_nvcc_is_named_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BuildError, match="nvcc.*not found on PATH.*CUDA toolkit"):
        compile_cuda(ADD, cache_dir=tmp_path, compiler="nvcc")


def test_error_lines_are_quoted_with_their_numbers():
    message = "k.cu(2): error: bad\nk.cu(9): warning: far\nk.cu(3): catastrophic error: worse"
    assert (cuda_compiler.quote_error_lines(message, "a\n  b\nc\n")
            == "The offending source lines:\n  line 2: b\n  line 3: c\n")
    assert cuda_compiler.quote_error_lines("no line numbers", "a\n") == ""


# metadata


def test_launch_spec_and_module_metadata_round_trip_through_json():
    import json

    launch = LaunchSpec((8, 2, 1), (128, 2, 1), shared_bytes=64 << 10, zeroed=(2,))
    assert LaunchSpec.from_json(json.loads(json.dumps(launch.to_json()))) == launch
    assert LaunchSpec.from_json({"grid": [1, 1, 1], "block": [32, 1, 1]}).zeroed == ()  # written before split-K
    module = CudaModule(b"\x7fELF...", ADD, "vector_add", ADD_ARGS, launch)
    metadata = json.loads(json.dumps(module.to_json()))
    assert "cubin" not in metadata
    again = CudaModule.from_artifact(module.cubin, metadata, source=ADD)
    assert (again.entry, again.args, again.launches, again.workspace, again.cubin, again.source) == \
        (module.entry, module.args, module.launches, module.workspace, module.cubin, module.source)
    assert "vector_add" in repr(again) and "(8, 2, 1)" in repr(again)


def test_bad_launch_specs_and_metadata_are_refused():
    with pytest.raises(ValueError, match="block"):
        LaunchSpec((1, 1, 1), (0, 1, 1))
    with pytest.raises(ValueError, match="grid"):
        LaunchSpec((1, 1), (32, 1, 1))
    with pytest.raises(ValueError, match="shared_bytes"):
        LaunchSpec((1, 1, 1), (32, 1, 1), shared_bytes=-1)
    with pytest.raises(ValueError, match="lacks 'launch'"):
        CudaModule.from_artifact(b"", {"entry": "k", "args": []})
    with pytest.raises(ValueError, match="lacks 'args'"):
        CudaModule.from_artifact(b"", {"entry": "k", "launch": {"grid": [1, 1, 1], "block": [32, 1, 1]}})
    for zeroed in ((-1,), (2, 2), ("2",)):
        with pytest.raises(ValueError, match="zeroed=.* must be distinct argument indices"):
            LaunchSpec((1, 1, 1), (32, 1, 1), zeroed=zeroed)
    for zeroed in ((0,), (3,)):  # an input, and no argument at all: never set to zero
        with pytest.raises(ValueError, match="only outputs among its 3 arguments can be zeroed"):
            CudaModule(b"", ADD, "vector_add", ADD_ARGS, LaunchSpec((1, 1, 1), (32, 1, 1), zeroed=zeroed))
    with pytest.raises(ValueError, match="grid=.* must be three ints from 1 to 2\\*\\*31 - 1"):
        LaunchSpec((1 << 31, 1, 1), (32, 1, 1))
    one = LaunchSpec((1, 1, 1), (32, 1, 1))
    for launches, workspace, message in (
            ((one,), [ArgSpec("s", (4,), "float32", True)], "a workspace only between several"),
            ((), [], "at least one kernel"),
            ((one, one), [ArgSpec("c", (4,), "float32", True)], "names .* repeat"),
            ((one, one), [ArgSpec("s", (-4,), "float32", True)], "workspace shapes .* must be ints >= 0")):
        with pytest.raises(ValueError, match=message):
            CudaModule(b"", ADD, "vector_add", ADD_ARGS, launches, workspace)


def test_cuda_available_answers_without_raising():
    assert cuda_available() in (True, False)


# the checks of a call's arrays: all before any driver call


def test_numpy_arguments_of_the_wrong_dtype_or_shape_are_named():
    module, (a, b) = add_module(), host_inputs()
    with pytest.raises(ValueError, match=r"input 'b' has dtype float64, expected float32"):
        module(a, b.astype(np.float64))
    with pytest.raises(ValueError, match=r"input 'a' has shape \(999,\), expected \(1000,\)"):
        module(a[:999], b)
    with pytest.raises(ValueError, match="output 'c' must be C-contiguous and writeable"):
        module(a, b, out=np.empty(2 * N, np.float32)[::2])
    with pytest.raises(TypeError, match=r"takes its inputs \(a, b\).*got 1 array"):
        module(a)


def test_numpy_inputs_that_are_not_contiguous_are_copied():
    a = np.arange(2 * N, dtype=np.float32)[::2]
    binding = bind_arrays("vector_add", ADD_ARGS, [a, a])
    assert binding.arrays[0].flags.c_contiguous and np.array_equal(binding.arrays[0], a)
    assert not binding.on_device and binding.returns_outputs


def test_mixing_numpy_and_gpu_arrays_is_refused():
    with pytest.raises(TilecraftError, match="'a' is a NumPy array but 'b' is on the GPU"):
        add_module()(host_inputs()[0], FakeGpuArray((N,)))


def test_gpu_arrays_give_their_addresses_and_device():
    binding = bind_arrays("vector_add", ADD_ARGS, [FakeGpuArray((N,), device=1, address=32 * k) for k in (1, 2, 3)])
    assert binding.on_device and binding.device == 1 and not binding.returns_outputs
    assert binding.pointers == {0: 32, 1: 64, 2: 96}


def test_gpu_arrays_of_the_wrong_dtype_shape_or_layout_are_named():
    good = FakeGpuArray((N,))
    with pytest.raises(ValueError, match="input 'a' has dtype float16, expected float32"):
        bind_arrays("vector_add", ADD_ARGS, [FakeGpuArray((N,), "float16"), good])
    with pytest.raises(ValueError, match=r"input 'b' has shape \(10, 100\), expected \(1000,\)"):
        bind_arrays("vector_add", ADD_ARGS, [good, FakeGpuArray((10, 100))])
    with pytest.raises(ValueError, match="input 'b' is not C-contiguous"):
        bind_arrays("vector_add", ADD_ARGS, [good, FakeGpuArray((N,), strides=(8,))])
    assert bind_arrays("vector_add", ADD_ARGS, [good, FakeGpuArray((N,), strides=(4,))]).on_device
    with pytest.raises(ValueError, match=r"input 'b' starts 4 bytes past a multiple of 32 .*x\.clone\(\)"):
        bind_arrays("vector_add", ADD_ARGS, [good, FakeGpuArray((N,), address=0x7F0000000004)])


def test_a_gpu_array_on_another_gpu_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"input 'b' is on cuda:1 but the kernel runs on cuda:0; move it with "
                                         r"\.to\('cuda:0'\)"):
        bind_arrays("vector_add", ADD_ARGS, [FakeGpuArray((N,)), FakeDlpackArray(2, 1)])
    with pytest.raises(ValueError, match="'a' is on cuda:1 but the kernel runs on cuda:0"):
        bind_arrays("vector_add", ADD_ARGS, [FakeDlpackArray(2, 1), FakeGpuArray((N,))], device=0)


def test_an_array_in_host_memory_behind_dlpack_is_refused():
    with pytest.raises(ValueError, match="input 'a' is in the CPU, not on a GPU"):
        add_module()(FakeDlpackArray(1, 0), FakeGpuArray((N,)))


def test_a_dlpack_only_gpu_array_is_refused_with_the_fix():
    with pytest.raises(TypeError, match=r"offers DLPack only.*torch\.from_dlpack"):
        bind_arrays("vector_add", ADD_ARGS, [FakeDlpackArray(2, 0), FakeGpuArray((N,))])


def test_something_that_is_no_array_is_named():
    with pytest.raises(TypeError, match="input 'a' is a list; pass a numpy.ndarray or a GPU array"):
        add_module()(list(range(N)), host_inputs()[1])


@pytest.mark.slow  # importing PyTorch costs seconds; the CPU array behind DLPack is refused quickly above
def test_a_torch_cpu_tensor_is_refused_before_any_driver_call():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="input 'a' is in the CPU"):
        add_module()(torch.zeros(N), torch.zeros(N))


# on a GPU


class FakeDriver:
    """The driver calls a kernel's loading makes, counting the primary context's references."""

    def __init__(self):
        self.references, self.contexts_made = 0, 0
        self.CUfunction_attribute = SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK=0,
                                                    CU_FUNC_ATTRIBUTE_NUM_REGS=1)

    def cuDevicePrimaryCtxRetain(self, handle):
        self.contexts_made += self.references == 0  # the driver makes the context at the first reference
        self.references += 1
        return 0, "context"

    def cuDevicePrimaryCtxRelease(self, handle):
        self.references -= 1  # the driver destroys the context at the last
        return (0,)

    def cuFuncGetAttribute(self, attribute, function):
        return 0, 1024 if attribute == 0 else 32

    cuInit = cuCtxPopCurrent = staticmethod(lambda *args: (0,))
    cuDeviceGet = cuCtxPushCurrent = cuModuleLoadData = cuModuleUnload = staticmethod(lambda *args: (0, "value"))
    cuModuleGetFunction = staticmethod(lambda *args: (0, "function"))


@pytest.mark.slow
def test_a_gpus_context_outlives_its_kernels_so_the_next_kernel_does_not_make_it_again(monkeypatch):
    """A measuring worker loads one kernel a candidate: each must find the context alive."""
    driver = FakeDriver()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_runtime, "_KEPT_CONTEXTS", {})
    for _ in range(3):
        kernel = cuda_runtime._Kernel(b"cubin", (("vector_add", LaunchSpec((1, 1, 1), (32, 1, 1))),), 0, (4096,) * 3)
        del kernel
        gc.collect()
    assert driver.contexts_made == 1 and driver.references == 1


class FakeMemoryDriver(FakeDriver):
    """GPU memory as a dict of byte buffers, counting the copies each way; a cubin loaded is
    a function of the GPU addresses of its arguments (``kernels[cubin]``), run at each launch.
    A stream capture records the launches instead; launching the graph runs them."""

    CUstreamCaptureMode = SimpleNamespace(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=1)

    def __init__(self):
        super().__init__()
        self.memory, self.uploads, self.downloads, self.launches, self.allocations = {}, 0, 0, 0, 0
        self.kernels = {}
        self.captured, self.graph_launches, self.freed = None, 0, []

    def cuStreamCreate(self, flags):
        return 0, "stream"

    def cuStreamBeginCapture(self, stream, mode):
        self.captured = []
        return (0,)

    def cuStreamEndCapture(self, stream):
        graph, self.captured = self.captured, None
        return 0, graph

    def cuGraphInstantiate(self, graph, flags):
        return 0, tuple(graph)

    def cuGraphLaunch(self, executable, stream):
        self.graph_launches += 1
        for step in executable:
            step()
        return (0,)

    def cuGraphExecDestroy(self, executable):
        self.freed.append("executable")
        return (0,)

    def cuGraphDestroy(self, graph):
        self.freed.append("graph")
        return (0,)

    def cuStreamDestroy(self, stream):
        self.freed.append("stream")
        return (0,)

    def cuModuleLoadData(self, cubin):
        return 0, cubin

    def cuModuleGetFunction(self, module, entry):  # a cubin of several kernels: each by its name
        return 0, (module, entry.decode()) if (module, entry.decode()) in self.kernels else module

    def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        return self._on_stream(lambda: self._run(function, params))

    def cuMemsetD8Async(self, pointer, value, size, stream):
        def memset():
            self.memory[pointer][:size] = bytes([value]) * size

        return self._on_stream(memset)

    def _on_stream(self, step):
        """Run ``step``, or record it where a capture is on."""
        if self.captured is not None:
            self.captured.append(step)
        else:
            step()
        return (0,)

    def _run(self, function, params):
        self.launches += 1
        count = len(self.kernels[function].args)
        addresses = np.frombuffer((ctypes.c_uint64 * count).from_address(params), np.uint64)
        self.kernels[function](*(int(np.frombuffer((ctypes.c_uint64 * 1).from_address(int(a)), np.uint64)[0])
                                 for a in addresses))

    def cuMemcpyDtoD(self, destination, source, size):
        self.memory[destination][:size] = self.memory[source][:size]
        return (0,)

    cuStreamSynchronize = staticmethod(lambda stream: (0,))

    def cuMemAlloc(self, size):
        self.allocations += 1  # never an address still in use, as len(memory) would give after a free
        pointer = 4096 * self.allocations
        self.memory[pointer] = bytearray(size)
        return 0, pointer

    def cuMemcpyHtoD(self, pointer, host, size):
        self.uploads += 1
        self.memory[pointer][:size] = (ctypes.c_char * size).from_address(host).raw
        return (0,)

    def cuMemcpyDtoH(self, host, pointer, size):
        self.downloads += 1
        ctypes.memmove(host, bytes(self.memory[pointer][:size]), size)
        return (0,)

    def cuMemFree(self, pointer):
        del self.memory[pointer]
        return (0,)


def test_a_device_array_is_a_gpu_array_to_a_call_and_comes_back_as_numpy(monkeypatch):
    driver = FakeMemoryDriver()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_runtime, "_KEPT_CONTEXTS", {})
    a, b = host_inputs()
    arrays = [cuda_runtime.DeviceArray(x) for x in (a, b, np.zeros(N, np.float32))]
    binding = bind_arrays("vector_add", ADD_ARGS, arrays)
    assert binding.on_device and binding.pointers == {i: x.pointer for i, x in enumerate(arrays)}
    np.testing.assert_array_equal(arrays[1].numpy(), b)
    halves = cuda_runtime.DeviceArray.view(arrays[0], (2, N // 4), "float64")  # the same bytes, another type
    np.testing.assert_array_equal(halves.numpy(), a.view("float64").reshape(2, N // 4))
    with pytest.raises(ValueError, match=r"a view of float32\[2, 1000\] reaches past the float32\[1000\] array"):
        cuda_runtime.DeviceArray.view(arrays[0], (2, N))
    assert arrays[0].__dlpack_device__() == (2, 0) and halves.device == 0
    brain = cuda_runtime.DeviceArray(a.astype(NUMPY_DTYPES["bfloat16"]))  # typestr <V2: its dtype tells bfloat16
    assert brain.numpy().dtype == cuda_runtime.DeviceArray.view(brain, (N,)).dtype == NUMPY_DTYPES["bfloat16"]
    assert bind_arrays("scale", (ArgSpec("h", (N,), "bfloat16", False),), [brain]).on_device
    del brain
    assert cuda_runtime.DeviceArray.view(FakeGpuArray((N,), device=1), (N,)).device == 1  # a PyTorch tensor's GPU
    del halves
    del arrays, binding
    gc.collect()
    assert driver.memory == {} and driver.references == 1  # freed; the context kept


def test_a_gpu_that_is_not_there_is_named_with_how_cuda_numbers_them(monkeypatch):
    def cuDeviceGet(ordinal):  # a machine of two GPUs
        return (101, None) if ordinal > 1 else (0, ordinal)

    driver = FakeMemoryDriver()
    driver.cuDeviceGet = cuDeviceGet
    driver.cuGetErrorName = lambda status: (0, b"CUDA_ERROR_INVALID_DEVICE")
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_runtime, "_KEPT_CONTEXTS", {})
    assert cuda_runtime.DeviceArray(np.ones(4, np.float32), 1).numpy().sum() == 4
    with pytest.raises(TilecraftError, match="cuDeviceGet failed: CUDA_ERROR_INVALID_DEVICE .no GPU of that index "
                                             "here: CUDA numbers the GPUs a process sees from 0"):
        cuda_runtime.DeviceArray(np.ones(4, np.float32), 2)


class AddInto:
    """A kernel whose blocks add ``a + b`` into ``c`` (split-K's way), on the fake memory."""

    args = ADD_ARGS

    def __init__(self, driver):
        self.driver = driver

    def __call__(self, a, b, c):
        memory = self.driver.memory
        total = np.frombuffer(memory[c], np.float32) + np.frombuffer(memory[a], np.float32) \
            + np.frombuffer(memory[b], np.float32)
        memory[c][:] = total.tobytes()


def test_an_output_that_blocks_add_into_is_zeroed_before_every_launch_called_planned_or_captured(monkeypatch):
    driver = FakeMemoryDriver()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_runtime, "_KEPT_CONTEXTS", {})
    driver.kernels[b"add into"] = AddInto(driver)
    module = CudaModule(b"add into", ADD, "vector_add", ADD_ARGS, LaunchSpec((4, 1, 1), (256, 1, 1), zeroed=(2,)))
    a, b = host_inputs()
    arrays = [cuda_runtime.DeviceArray(x) for x in (a, b, np.full(N, np.nan, np.float32))]
    for _ in range(2):  # garbage in the output, then the last call's sum: each launch starts from zero
        module(*arrays)
        np.testing.assert_array_equal(arrays[2].numpy(), a + b)
    plan = cuda_runtime.LaunchPlan([(module, [x.pointer for x in arrays])] * 2)
    plan.run()
    np.testing.assert_array_equal(arrays[2].numpy(), a + b)
    graph = cuda_runtime.LaunchGraph(plan)
    arrays[2].copy_from(np.full(N, 7, np.float32))
    graph.run()
    np.testing.assert_array_equal(arrays[2].numpy(), a + b)
    assert driver.launches == 6 and driver.graph_launches == 1


class KernelOnFakeMemory:
    """A kernel of a two-kernel module on the fake memory: ``step`` of the float32 arrays at its
    arguments' addresses (a, b, c, then the workspace s)."""

    args = [*ADD_ARGS, ArgSpec("s", (N,), "float32", True)]

    def __init__(self, driver, step):
        self.driver, self.step = driver, step

    def __call__(self, *pointers):
        self.step(*(np.frombuffer(self.driver.memory[p], np.float32) for p in pointers))


def test_a_module_of_two_kernels_runs_them_in_order_on_a_workspace_it_allocates_and_frees(monkeypatch):
    """Split-K through a workspace: the first kernel writes s, the second reads it; called,
    planned or captured alike, and the workspace freed with the module."""
    driver = FakeMemoryDriver()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_runtime, "_KEPT_CONTEXTS", {})

    def first(a, b, c, s):
        s[:] = a - b

    def second(a, b, c, s):
        c[:] = np.maximum(s, 0)

    for n, step in enumerate((first, second)):
        driver.kernels[(b"two", f"vector_add_kernel{n}")] = KernelOnFakeMemory(driver, step)
    launches = (LaunchSpec((4, 1, 1), (256, 1, 1)), LaunchSpec((8, 1, 1), (128, 1, 1)))
    module = CudaModule(b"two", ADD, "vector_add", ADD_ARGS, launches, KernelOnFakeMemory.args[3:])
    assert module.entries == ("vector_add_kernel0", "vector_add_kernel1")
    a, b = host_inputs()
    arrays = [cuda_runtime.DeviceArray(x) for x in (a, b, np.full(N, np.nan, np.float32))]
    module(*arrays)
    np.testing.assert_array_equal(arrays[2].numpy(), np.maximum(a - b, 0))
    arrays[2].copy_from(np.full(N, np.nan, np.float32))
    graph = cuda_runtime.LaunchGraph(cuda_runtime.LaunchPlan([(module, [x.pointer for x in arrays])]))
    graph.run()
    np.testing.assert_array_equal(arrays[2].numpy(), np.maximum(a - b, 0))
    assert driver.launches == 4 and len(driver.memory) == 5  # the three arrays, the calls' and the plan's workspace
    del module, graph, arrays
    gc.collect()
    assert driver.memory == {}


def test_each_stream_and_each_plan_has_a_workspace_of_its_own(monkeypatch):
    """Two streams run at once: kernels on each that shared one workspace would add into
    each other's partial sums. A plan's workspace goes with the plan; the streams' with the
    module."""
    driver = FakeMemoryDriver()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_runtime, "_KEPT_CONTEXTS", {})
    seen = []  # the workspace address each launch would get
    launches = (LaunchSpec((4, 1, 1), (256, 1, 1)), LaunchSpec((8, 1, 1), (128, 1, 1)))
    module = CudaModule(b"two", ADD, "vector_add", ADD_ARGS, launches, KernelOnFakeMemory.args[3:])
    arrays = [cuda_runtime.DeviceArray(x) for x in (*host_inputs(), np.zeros(N, np.float32))]
    pointers = [x.pointer for x in arrays]
    kernel = module.loaded()
    for stream in (0, 7, 0):
        seen.append(int(kernel.pack(pointers, stream)[0][-1]))
    plans = [cuda_runtime.LaunchPlan([(module, pointers)] * 2) for _ in range(2)]
    seen += [int(packed[0][-1]) for plan in plans for _, packed in plan._launches]
    assert seen[0] == seen[2] and len({seen[0], seen[1], seen[3], seen[5]}) == 4  # stream 0, 7, each plan
    assert seen[3] == seen[4] and seen[5] == seen[6]  # a plan's steps run in order on its stream: one workspace
    assert len(driver.memory) == 3 + 4
    del plans
    gc.collect()
    assert len(driver.memory) == 3 + 2  # the plans' workspaces went with them
    del module, kernel
    gc.collect()
    assert len(driver.memory) == 3


def test_the_measuring_worker_uploads_a_workloads_arguments_once(monkeypatch, tmp_path):
    """One upload an argument serves every candidate of the workload, each starting from
    copies made on the GPU (an output that a candidate leaves unwritten is still poisoned
    after one that wrote it right); only outputs come back."""
    driver = FakeMemoryDriver()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_runtime, "_KEPT_CONTEXTS", {})
    monkeypatch.setattr(device_check, "_cubin", lambda: None)  # outputs checked on the CPU

    class AddOnGpu(CudaModule):  # the kernel's effect, written into the fake memory; b"lazy" writes nothing
        def __call__(self, a, b, c):
            if self.cubin != b"lazy":
                driver.memory[c.pointer][:] = (np.frombuffer(driver.memory[a.pointer], np.float32)
                                               + np.frombuffer(driver.memory[b.pointer], np.float32)).tobytes()

        def time_evaluator(self, number=10, repeat=3, flush_l2=True, warmup=True):
            return lambda *arrays: ProfileResult((1e-5,) * repeat)

    monkeypatch.setattr(cuda_runtime, "CudaModule", AddOnGpu)
    a, b = host_inputs()
    np.savez(tmp_path / "reference.npz", a=a, b=b, c=a + b)
    references = collections.OrderedDict()
    replies = []
    for cubin in (b"cubin", b"lazy", b"cubin"):
        (tmp_path / "kernel.cubin").write_bytes(cubin)
        request = {"args": [[arg.name, list(arg.shape), arg.dtype, arg.is_output] for arg in ADD_ARGS],
                   "launch": launch_json([LaunchSpec((4, 1, 1), (256, 1, 1))]),
                   "lib_path": str(tmp_path / "kernel.cubin"),
                   "entry_name": "vector_add", "reference": str(tmp_path / "reference.npz"), "number": 10,
                   "repeat": 3, "min_repeat_ms": 0}
        replies.append(worker.measure(request, references))
    assert replies[0] == replies[2] == {"error_kind": "none", "costs": [1e-5] * 3}
    assert replies[1]["error_kind"] == "wrong_answer" and "got nan" in replies[1]["error_msg"]
    assert (driver.uploads, driver.downloads) == (3, 3)


@pytest.mark.parametrize("seconds, launches", [(1e-4, ["checked", "timed 1", "timed 10 x 3"]),
                                               (3e-4, ["checked", "timed 1"])], ids=["fast", "slow"])
def test_a_gpu_candidate_is_warmed_up_by_its_checking_call_and_a_slow_one_timed_once(monkeypatch, tmp_path,
                                                                                     seconds, launches):
    """The checking call warms the kernel up for the first timed call, and that one for the
    rest; a candidate twice the fastest (``slow_call_secs``) is timed by that call alone."""
    driver = FakeMemoryDriver()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_runtime, "_KEPT_CONTEXTS", {})
    monkeypatch.setattr(device_check, "_cubin", lambda: None)
    calls = []

    class Timed(CudaModule):
        def __call__(self, a, b, c):
            calls.append("checked")
            driver.memory[c.pointer][:] = (np.frombuffer(driver.memory[a.pointer], np.float32)
                                           + np.frombuffer(driver.memory[b.pointer], np.float32)).tobytes()

        def time_evaluator(self, number=10, repeat=3, flush_l2=True, warmup=True):
            calls.extend(["warm-up"] * warmup + [f"timed {number}" + f" x {repeat}" * (repeat > 1)])
            return lambda *arrays: ProfileResult((seconds,) * repeat)

    monkeypatch.setattr(cuda_runtime, "CudaModule", Timed)
    a, b = host_inputs()
    np.savez(tmp_path / "reference.npz", a=a, b=b, c=a + b)
    (tmp_path / "kernel.cubin").write_bytes(b"cubin")
    request = {"args": [[arg.name, list(arg.shape), arg.dtype, arg.is_output] for arg in ADD_ARGS],
               "launch": launch_json([LaunchSpec((4, 1, 1), (256, 1, 1))]), "lib_path": str(tmp_path / "kernel.cubin"),
               "entry_name": "vector_add", "reference": str(tmp_path / "reference.npz"), "number": 10, "repeat": 3,
               "min_repeat_ms": 0, "slow_call_secs": 2e-4}
    reply = worker.measure(request, collections.OrderedDict())
    assert calls == launches
    assert reply == {"error_kind": "none", "costs": [seconds] * (3 if seconds < 2e-4 else 1)}


class OutsideBound:
    """``device_check.SOURCE``'s count, on the fake memory: got, expected, bound, size, outside."""

    args = range(5)

    def __init__(self, driver):
        self.driver = driver

    def __call__(self, got, expected, bound, size, outside):
        memory = self.driver.memory
        values = [np.frombuffer(memory[pointer], np.float32) for pointer in (got, expected, bound)]
        assert np.frombuffer(memory[size], np.int64)[0] == values[0].size
        with np.errstate(invalid="ignore"):
            count = int(np.sum(~(np.abs(values[0] - values[1]) <= values[2])))
        memory[outside][:4] = np.uint32(np.frombuffer(memory[outside], np.uint32)[0] + count).tobytes()


class CountsNothing(OutsideBound):
    """A counting kernel that is wrong: it never counts."""

    def __call__(self, got, expected, bound, size, outside):
        pass


def test_a_gpu_candidates_outputs_are_checked_on_the_gpu_and_copied_back_only_when_wrong(monkeypatch, tmp_path):
    """The GPU counts the elements outside the bound; a right output never crosses PCIe (only
    the count does), a wrong one comes back for the CPU's verdict and message."""
    driver = FakeMemoryDriver()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_runtime, "_KEPT_CONTEXTS", {})
    monkeypatch.setattr(device_check, "_cubin", lambda: b"outside")
    driver.kernels[b"outside"] = OutsideBound(driver)

    class AddOnGpu(CudaModule):  # b"lazy" writes nothing: its output stays poisoned
        def __call__(self, *arrays):
            if self.entry != "vector_add":  # the check's count runs on the fake driver
                return super().__call__(*arrays)
            a, b, c = arrays
            if self.cubin != b"lazy":
                driver.memory[c.pointer][:] = (np.frombuffer(driver.memory[a.pointer], np.float32)
                                               + np.frombuffer(driver.memory[b.pointer], np.float32)).tobytes()

        def time_evaluator(self, number=10, repeat=3, flush_l2=True, warmup=True):
            return lambda *arrays: ProfileResult((1e-5,) * repeat)

    monkeypatch.setattr(cuda_runtime, "CudaModule", AddOnGpu)
    a, b = host_inputs()
    np.savez(tmp_path / "reference.npz", a=a, b=b, c=a + b)
    references, downloads, replies = collections.OrderedDict(), [], []
    for cubin in (b"cubin", b"lazy", b"cubin"):
        (tmp_path / "kernel.cubin").write_bytes(cubin)
        request = {"args": [[arg.name, list(arg.shape), arg.dtype, arg.is_output] for arg in ADD_ARGS],
                   "launch": launch_json([LaunchSpec((4, 1, 1), (256, 1, 1))]), "entry_name": "vector_add",
                   "lib_path": str(tmp_path / "kernel.cubin"), "reference": str(tmp_path / "reference.npz"),
                   "number": 10, "repeat": 3, "min_repeat_ms": 0}
        before = driver.downloads
        replies.append(worker.measure(request, references))
        downloads.append(driver.downloads - before)
    assert replies[0] == replies[2] == {"error_kind": "none", "costs": [1e-5] * 3}
    assert replies[1]["error_kind"] == "wrong_answer" and "got nan" in replies[1]["error_msg"]
    assert downloads == [2, 2, 1]  # the check tried on the reference and the count; the count and the
    # wrong output; the count


def test_the_gpu_check_is_the_cpus_where_it_cannot_count(monkeypatch):
    """Not float32, no compiler for the counting kernel (a device server may have none), or a
    kernel that miscounts the reference itself: no GPU check, and the CPU's decides."""
    driver = FakeMemoryDriver()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_runtime, "_KEPT_CONTEXTS", {})
    expected = np.ones(8, np.float32)
    expected[3] = np.inf  # outside its bound of -1, for the CPU's isclose to judge
    bound = worker.OutputCheck("c", expected).bound
    assert device_check.device_check(np.ones(8, np.int32), None, cuda_runtime.DeviceArray) is None
    monkeypatch.setattr(device_check, "_cubin", lambda: None)
    assert device_check.device_check(expected, bound, cuda_runtime.DeviceArray) is None
    monkeypatch.setattr(device_check, "_cubin", lambda: b"outside")
    driver.kernels[b"outside"] = OutsideBound(driver)
    assert device_check.device_check(expected, bound, cuda_runtime.DeviceArray) is not None  # counts the inf alone
    driver.kernels[b"outside"] = CountsNothing(driver)
    assert device_check.device_check(expected, bound, cuda_runtime.DeviceArray) is None


@pytest.mark.skipif(shutil.which("nvcc") is None and nvrtc_version() is None, reason="needs nvcc or NVRTC")
def test_the_gpu_checks_kernel_builds_for_sm_90(kernel_cache):
    assert compile_cuda(device_check.SOURCE, "sm_90", cache_dir=kernel_cache)


@needs_gpu
def test_the_gpu_counts_the_elements_outside_the_bound_as_the_cpu_does():
    """On a GPU: a right output counts 0; a wrong element, a NaN, and an element whose
    reference is infinite (bound -1: the CPU's isclose decides) each count once; 2**20 + 3
    elements take every block's stride and a ragged end."""
    rng = np.random.default_rng(0)
    expected = rng.standard_normal(2**20 + 3).astype(np.float32)
    expected[7] = np.inf
    check = worker.OutputCheck("c", expected)
    counting = device_check.device_check(expected, check.bound, cuda_runtime.DeviceArray)
    got = expected * np.float32(1 + 1e-4)
    assert counting.outside(cuda_runtime.DeviceArray(got)) == 1  # the infinite one: the CPU's to judge
    assert check(got) is None
    got[[5, 2**20 + 2]] = [expected[5] + 1, np.nan]
    assert counting.outside(cuda_runtime.DeviceArray(got)) == 3 and check(got) is not None


def device_arch() -> str:
    from cuda.bindings import driver

    attribute = driver.CUdevice_attribute
    driver.cuInit(0)
    _, device = driver.cuDeviceGet(0)
    major = driver.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)[1]
    minor = driver.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)[1]
    return f"sm_{major}{minor}"


@pytest.fixture(scope="module")
def gpu_add(tmp_path_factory):
    cubin = compile_cuda(ADD, arch=device_arch(), cache_dir=tmp_path_factory.mktemp("cubins"))
    return add_module(cubin)


@needs_gpu
def test_numpy_arrays_in_numpy_arrays_out(gpu_add):
    a, b = host_inputs()
    np.testing.assert_array_equal(gpu_add(a, b), a + b)
    c = np.zeros(N, np.float32)
    assert gpu_add(a, b, out=c) is c and np.array_equal(c, a + b)
    c[:] = 0
    assert gpu_add(a[::-1], b, c) is None  # every argument positionally; a copy of the reversed input
    np.testing.assert_array_equal(c, a[::-1] + b)


@needs_gpu
def test_torch_tensors_in_a_torch_tensor_out_without_copies(gpu_add):
    torch = pytest.importorskip("torch")
    a, b = (torch.from_numpy(x).cuda() for x in host_inputs())
    c = gpu_add(a, b)
    assert isinstance(c, torch.Tensor) and c.device == a.device and c.dtype == torch.float32
    torch.testing.assert_close(c, a + b, rtol=0, atol=0)
    given = torch.zeros(N, device="cuda")
    pointer = given.data_ptr()
    assert gpu_add(a, b, out=given) is given and given.data_ptr() == pointer
    torch.testing.assert_close(given, a + b, rtol=0, atol=0)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # launched on the caller's current stream
        on_stream = gpu_add(a, b)
    stream.synchronize()
    torch.testing.assert_close(on_stream, a + b, rtol=0, atol=0)


@needs_gpu
def test_cupy_arrays_in_a_cupy_array_out(gpu_add):
    cupy = pytest.importorskip("cupy")
    a, b = (cupy.asarray(x) for x in host_inputs())
    c = gpu_add(a, b)
    assert isinstance(c, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(c), cupy.asnumpy(a + b))


@needs_gpu
def test_time_evaluator_returns_positive_seconds(gpu_add):
    for flush_l2 in (True, False):
        result = gpu_add.time_evaluator(number=5, repeat=2, flush_l2=flush_l2)(*host_inputs())
        assert isinstance(result, ProfileResult) and len(result.results) == 2
        assert all(0 < cost < 1e-2 for cost in result.results)


@needs_gpu
def test_time_evaluator_times_torch_tensors(gpu_add):
    torch = pytest.importorskip("torch")
    a, b = (torch.from_numpy(x).cuda() for x in host_inputs())
    c = torch.empty(N, device="cuda")
    assert gpu_add.time_evaluator(number=3, repeat=1)(a, b, out=c).min > 0
    torch.testing.assert_close(c, a + b, rtol=0, atol=0)


@needs_gpu
def test_a_block_larger_than_the_kernel_allows_is_refused_before_launch(gpu_add):
    module = CudaModule(gpu_add.cubin, ADD, "vector_add", ADD_ARGS, LaunchSpec((1, 1, 1), (2048, 1, 1)))
    with pytest.raises(TilecraftError, match=r"'vector_add' cannot run blocks of \(2048, 1, 1\).*at most 1024"):
        module(*host_inputs())


@needs_gpu
def test_a_failed_launch_names_the_kernel_its_launch_and_the_driver_error(gpu_add):
    module = CudaModule(gpu_add.cubin, ADD, "vector_add", ADD_ARGS, LaunchSpec((1, 70000, 1), (256, 1, 1)))
    with pytest.raises(TilecraftError, match=r"'vector_add' failed on cuda:0: CUDA_ERROR_INVALID_VALUE "
                                             r"\(grid \(1, 70000, 1\), block \(256, 1, 1\), 0 bytes"):
        module(*host_inputs())  # grid y is at most 65535: refused at launch, and the context stays usable


SHARED = """
extern "C" __global__ void through_shared(const float* __restrict__ a, float* __restrict__ b) {
    extern __shared__ float staged[];  // 25,000 floats: 100,000 bytes, over the 48 KiB default
    for (int i = threadIdx.x; i < 25000; i += blockDim.x) staged[i] = a[i];
    __syncthreads();
    for (int i = threadIdx.x; i < 25000; i += blockDim.x) b[i] = 2.0f * staged[24999 - i];
}
"""
SHARED_ARGS = [ArgSpec("a", (25000,), "float32", False), ArgSpec("b", (25000,), "float32", True)]


@needs_gpu
def test_dynamic_shared_memory_over_48_kib_is_opted_in(tmp_path):
    cubin = compile_cuda(SHARED, arch=device_arch(), cache_dir=tmp_path)
    module = CudaModule(cubin, SHARED, "through_shared", SHARED_ARGS, LaunchSpec((1, 1, 1), (256, 1, 1), 100_000))
    a = np.arange(25000, dtype=np.float32)
    np.testing.assert_array_equal(module(a), 2 * a[::-1])
    too_much = CudaModule(cubin, SHARED, "through_shared", SHARED_ARGS, LaunchSpec((1, 1, 1), (256, 1, 1), 1 << 20))
    with pytest.raises(TilecraftError, match="asks for 1048576 bytes of dynamic shared memory"):
        too_much(a)


@needs_gpu
def test_a_cubin_for_another_architecture_is_refused_with_the_fix(tmp_path):
    other = "sm_90" if device_arch().startswith("sm_8") else "sm_80"  # a cubin runs on its major version only
    module = add_module(compile_cuda(ADD, arch=other, cache_dir=tmp_path))
    with pytest.raises(TilecraftError, match="cuModuleLoadData failed: CUDA_ERROR_NO_BINARY_FOR_GPU.*nvcc_arch"):
        module(*host_inputs())
