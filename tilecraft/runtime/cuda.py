"""A compiled CUDA kernel as a Python callable, over NumPy arrays or GPU arrays.

The map:

- ``LaunchSpec``: grid, block and dynamic shared memory of a launch; JSON.
- ``CudaModule``: a cubin, its entry, its ``ArgSpec``s and its ``LaunchSpec``; loaded on the
  first call, then called (``module(*arrays)``) or timed (``module.time_evaluator()``).
  A build travels as the cubin's bytes plus ``to_json()`` (``from_artifact`` reads them).
- ``bind_arrays``: the check of a call's arrays, a pure function, so every user mistake is
  caught (and tested) before the driver is touched, on machines without a GPU.
- ``cuda_available``: whether kernels can run here; it never raises, for test skips.
- ``DeviceArray``: a NumPy array's copy in GPU memory, for callers with neither PyTorch
  nor CuPy (the measuring worker uploads a candidate's inputs once, for its check and
  every timing).
- ``LaunchPlan``: kernels launched in order on fixed addresses, arguments packed once.
- ``_Kernel``: the entry loaded on one GPU through the driver API: launch, synchronize, time.

Why the driver API (``cuda-bindings``, an optional extra) and not CuPy or PyTorch: it is a
thin layer that loads a cubin built elsewhere, and it is what those libraries sit on, so
the kernel runs in the GPU's primary context, where their pointers are valid.

Two ways to call. NumPy arrays are copied to the GPU and back, and the call waits for the
kernel: slow, but simple for tests and for checking results. GPU arrays (PyTorch tensors,
CuPy arrays: anything with ``__cuda_array_interface__``) are passed by pointer, new
outputs are made by the same library, and the kernel is launched on that library's current
stream without waiting, as one of its own operations would be; an error inside the kernel
then surfaces at the next synchronization. An illegal address or a trap leaves the GPU's
context unusable for the rest of the process, so a tuner runs candidates in a worker.
"""

from __future__ import annotations

import contextlib
import math
import operator
import re
import sys
import time
import weakref
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import TargetError, TilecraftError
from ..te.dtype import NUMPY_DTYPES
from .module import ArgSpec
from .timer import ProfileResult

L2_FLUSH_BYTES = 256 << 20  # Triton's do_bench; over twice the largest L2 (H100: 50 MiB, H200: 60 MiB)
# Where a GPU array passed to a kernel must start: its float4 loads and stores need 16 bytes, a tensor
# core's tiles in global memory 32 (a misaligned access is an error that poisons the CUDA context);
# PyTorch's and CuPy's allocators give 256 or more, a view at an offset into a tensor may not.
ARGUMENT_ALIGNMENT = 32
_STATIC_SHARED_LIMIT = 48 << 10  # more dynamic shared memory needs the kernel's opt-in attribute
_CUDA, _DEVICE_NAMES = 2, {1: "the CPU", 3: "pinned host memory", 13: "CUDA managed memory"}  # DLPack device types
_HINTS = {"CUDA_ERROR_NO_BINARY_FOR_GPU": " (the cubin was built for another GPU architecture: compile it for "
                                          "this GPU's, CudaTarget.device().nvcc_arch)",
          "CUDA_ERROR_INVALID_DEVICE": " (no GPU of that index here: CUDA numbers the GPUs a process sees from 0, "
                                       "CUDA_VISIBLE_DEVICES deciding which it sees)"}
_INSTALL = "pip install -e '.[cuda]' (or pip install 'cuda-bindings>=13.0'; it needs an NVIDIA driver >= 580)"


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """How a kernel is launched: ``grid`` blocks of ``block`` threads (x, y, z), each block
    with ``shared_bytes`` of dynamic shared memory (``extern __shared__``); the arguments
    at the indices ``zeroed`` are set to zero on the stream before each launch (the kernel's
    blocks add their partials into them: split-K)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0
    zeroed: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("grid", "block"):
            value = _ints(getattr(self, name))
            if value is None or len(value) != 3 or min(value) < 1 or max(value) >= 1 << 31:
                raise ValueError(f"LaunchSpec {name}={getattr(self, name)!r} must be three ints from 1 to 2**31 - 1 "
                                 "(x, y, z)")
            object.__setattr__(self, name, value)
        shared_bytes = _ints([self.shared_bytes])
        if shared_bytes is None or shared_bytes[0] < 0:
            raise ValueError(f"LaunchSpec shared_bytes={self.shared_bytes!r} must be an int >= 0")
        object.__setattr__(self, "shared_bytes", shared_bytes[0])
        zeroed = _ints(self.zeroed)
        if zeroed is None or any(n < 0 for n in zeroed) or len(set(zeroed)) != len(zeroed):
            raise ValueError(f"LaunchSpec zeroed={self.zeroed!r} must be distinct argument indices >= 0")
        object.__setattr__(self, "zeroed", zeroed)

    @property
    def threads(self) -> int:
        """Threads per block."""
        return math.prod(self.block)

    def to_json(self) -> dict[str, Any]:
        return {"grid": list(self.grid), "block": list(self.block), "shared_bytes": self.shared_bytes,
                "zeroed": list(self.zeroed)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchSpec:
        return cls(tuple(data["grid"]), tuple(data["block"]), int(data.get("shared_bytes", 0)),
                   tuple(data.get("zeroed", ())))


def _ints(values: Any) -> tuple[int, ...] | None:
    """``values`` as Python ints (NumPy's count too), or None if one is not an integer."""
    try:
        return tuple(operator.index(v) for v in values)
    except TypeError:
        return None


@dataclass(frozen=True, slots=True)
class Binding:
    """A call's arrays, checked by ``bind_arrays``. ``arrays`` maps the index of each given
    argument to its array (NumPy inputs made C-contiguous); ``pointers`` the address of each
    GPU array (empty for NumPy arrays); ``device`` is the GPU the call runs on;
    ``returns_outputs`` is False when every argument was passed positionally."""

    arrays: dict[int, Any]
    pointers: dict[int, int]
    device: int
    returns_outputs: bool

    @property
    def on_device(self) -> bool:
        return bool(self.pointers)


def bind_arrays(entry: str, args: Sequence[ArgSpec], arrays: Sequence[Any], out: Any = None,
                device: int | None = None) -> Binding:
    """Check a call's arrays against ``args``, touching no driver. ``device`` is the GPU the
    kernel is loaded on; None (not loaded yet) takes the first GPU array's, else GPU 0.

    Raises:
        TypeError: If the number of arrays fits neither form, or one is no array.
        ValueError: If an array has the wrong shape, dtype or layout, is on another device, or (a GPU
            array) starts off ``ARGUMENT_ALIGNMENT``.
        TilecraftError: If NumPy arrays and GPU arrays are mixed.
    """
    inputs = [i for i, spec in enumerate(args) if not spec.is_output]
    outputs = [i for i, spec in enumerate(args) if spec.is_output]
    out_arrays = () if out is None else tuple(out) if isinstance(out, (list, tuple)) else (out,)
    if len(arrays) == len(args) and out is None:
        given, returns_outputs = dict(enumerate(arrays)), False
    elif len(arrays) == len(inputs) and len(out_arrays) in (0, len(outputs)):
        given, returns_outputs = {**dict(zip(inputs, arrays)), **dict(zip(outputs, out_arrays))}, True
    else:
        raise TypeError(f"{entry} takes its inputs ({', '.join(args[i].name for i in inputs)}), with out= for "
                        f"its outputs ({', '.join(args[i].name for i in outputs)}) or not, or all its arguments; "
                        f"got {len(arrays)} array(s)" + (f" and {len(out_arrays)} in out=" if out is not None else ""))
    checked, pointers = {}, {}
    for index, array in given.items():
        if isinstance(array, np.ndarray):
            checked[index] = _host_array(entry, args[index], array)
        else:
            array_device, pointers[index] = device_pointer(entry, args[index], array, device)
            if pointers[index] % ARGUMENT_ALIGNMENT:
                raise ValueError(f"{entry}: {'output' if args[index].is_output else 'input'} {args[index].name!r} "
                                 f"starts {pointers[index] % ARGUMENT_ALIGNMENT} bytes past a multiple of "
                                 f"{ARGUMENT_ALIGNMENT} (a view at an offset into its storage), where the kernels "
                                 f"read and write 16 bytes at once and tensor cores tiles of 32; pass a copy "
                                 f"(x.clone() in PyTorch, x.copy() in CuPy)")
            device = array_device if device is None else device
            checked[index] = array
    if pointers and len(pointers) != len(given):
        host = next(args[i].name for i in given if i not in pointers)
        gpu = next(args[i].name for i in pointers)
        raise TilecraftError(f"{entry}: {host!r} is a NumPy array but {gpu!r} is on the GPU; pass every argument "
                             f"as a NumPy array (copied to the GPU and back) or every one as a GPU array")
    return Binding(checked, pointers, device or 0, returns_outputs)


def _host_array(entry: str, spec: ArgSpec, array: np.ndarray) -> np.ndarray:
    role = "output" if spec.is_output else "input"
    if array.dtype != np.dtype(spec.dtype):
        raise ValueError(f"{entry}: {role} {spec.name!r} has dtype {array.dtype}, expected {spec.dtype}; "
                         f"pass x.astype({spec.dtype!r})")
    if array.shape != spec.shape:
        raise ValueError(f"{entry}: {role} {spec.name!r} has shape {array.shape}, expected {spec.shape}")
    if spec.is_output and not (array.flags.c_contiguous and array.flags.writeable):
        raise ValueError(f"{entry}: output {spec.name!r} must be C-contiguous and writeable; pass "
                         f"np.empty({spec.shape}, dtype={spec.dtype!r})")
    return np.ascontiguousarray(array)


def gpu_array(array: Any) -> Any:
    """``array`` as tilecraft reads GPU arrays: itself, but a PyTorch bfloat16 tensor, which
    PyTorch gives no ``__cuda_array_interface__``, as its bits (``BFloat16Bits``)."""
    from_torch = type(array).__module__.startswith("torch")
    return BFloat16Bits(array) if from_torch and str(getattr(array, "dtype", "")) == "torch.bfloat16" else array


class BFloat16Bits:
    """A PyTorch bfloat16 tensor seen as its bits: the ``__cuda_array_interface__`` of its int16
    view, and ml_dtypes' bfloat16 as its ``dtype`` (which the checks of a call read)."""

    def __init__(self, tensor: Any) -> None:
        self.tensor, self.dtype = tensor, NUMPY_DTYPES["bfloat16"]

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        import torch

        return self.tensor.view(torch.int16).__cuda_array_interface__

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.tensor.__dlpack_device__()


def element_dtype(array: Any) -> np.dtype:
    """The element type of a GPU array: its ``dtype`` where that is NumPy's (a CuPy array, a
    ``DeviceArray``: bfloat16's has no ``__cuda_array_interface__`` typestr of its own, only
    ``<V2``), else its typestr's (a PyTorch tensor's)."""
    dtype = getattr(array, "dtype", None)
    return dtype if isinstance(dtype, np.dtype) else np.dtype(array.__cuda_array_interface__["typestr"])


def device_pointer(entry: str, spec: ArgSpec, array: Any, device: int | None) -> tuple[int, int]:
    """The GPU and the data address of a GPU array, once checked as ``spec``."""
    role, array = "output" if spec.is_output else "input", gpu_array(array)
    face = getattr(array, "__cuda_array_interface__", None)
    where = getattr(array, "__dlpack_device__", None)
    if face is None and where is None:
        raise TypeError(f"{entry}: {role} {spec.name!r} is a {type(array).__name__}; pass a numpy.ndarray or a "
                        f"GPU array (a PyTorch CUDA tensor, a CuPy array)")
    kind, index = (int(v) for v in where()) if where is not None else (_CUDA, device or 0)
    if kind != _CUDA:
        raise ValueError(f"{entry}: {role} {spec.name!r} is in {_DEVICE_NAMES.get(kind, f'DLPack device {kind}')}, not "
                         f"on a GPU; move it with .to('cuda:{device or 0}'), or pass NumPy arrays for every argument")
    if device is not None and index != device:
        raise ValueError(f"{entry}: {role} {spec.name!r} is on cuda:{index} but the kernel runs on cuda:{device}; "
                         f"move it with .to('cuda:{device}')")
    if face is None:
        raise TypeError(f"{entry}: {role} {spec.name!r} ({type(array).__name__}) offers DLPack only, and tilecraft "
                        f"reads GPU addresses from __cuda_array_interface__; wrap it without a copy with "
                        f"torch.from_dlpack(x) or cupy.from_dlpack(x)")
    shape, dtype = tuple(face["shape"]), element_dtype(array)
    if dtype != NUMPY_DTYPES[spec.dtype]:
        raise ValueError(f"{entry}: {role} {spec.name!r} has dtype {dtype.name}, expected {spec.dtype}")
    if shape != spec.shape:
        raise ValueError(f"{entry}: {role} {spec.name!r} has shape {shape}, expected {spec.shape}")
    if not is_c_contiguous(shape, face.get("strides"), dtype.itemsize):
        raise ValueError(f"{entry}: {role} {spec.name!r} is not C-contiguous; pass x.contiguous() (PyTorch) or "
                         f"cupy.ascontiguousarray(x)")
    if spec.is_output and face["data"][1]:
        raise ValueError(f"{entry}: output {spec.name!r} is read-only; pass a writeable array")
    return index, int(face["data"][0])


def is_c_contiguous(shape: tuple[int, ...], strides: Sequence[int] | None, itemsize: int) -> bool:
    """Whether byte ``strides`` (None means C-contiguous) lay ``shape`` out densely in C order;
    an extent-1 axis may have any stride."""
    expected = itemsize
    for extent, stride in reversed(list(zip(shape, strides or ()))):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


def gpu_index(device: Any) -> int:
    """The index of the GPU that ``device`` names: ``1``, ``"cuda:1"``, ``torch.device("cuda", 1)``;
    ``"cuda"`` is GPU 0.

    Raises:
        ValueError: If ``device`` names no GPU.
    """
    if isinstance(device, int) and not isinstance(device, bool):
        index = device
    else:
        named = re.fullmatch(r"cuda(?::(\d+))?", str(device))  # a torch.device prints as its name
        index = int(named.group(1) or 0) if named else -1
    if index < 0:
        raise ValueError(f"device {device!r} names no GPU; name one as 1, 'cuda:1' or torch.device('cuda', 1)")
    return index


def cuda_available() -> bool:
    """Whether ``cuda-bindings`` is installed and the driver sees a GPU; never raises."""
    try:
        from cuda.bindings import driver

        status, count = driver.cuInit(0)[0], driver.cuDeviceGetCount()
        return status == 0 and count[0] == 0 and count[1] > 0
    except Exception:  # ImportError, or RuntimeError when libcuda.so.1 cannot be loaded
        return False


def kernel_entries(entry: str, kernels: int) -> tuple[str, ...]:
    """The names of a function's kernels (``ir/kernels.py``): its own, or ``{entry}_kernel{n}`` of several."""
    return (entry,) if kernels == 1 else tuple(f"{entry}_kernel{n}" for n in range(kernels))


class CudaModule:
    """A compiled CUDA kernel, or kernels run in order, called with NumPy arrays or GPU arrays.

    A kernel takes one pointer per argument, in ``args`` order, then one per ``workspace``
    buffer: global memory that one kernel writes and a later one reads (split-K's partial
    sums), one for each stream that calls it (``_Kernel.pack``). ``module(*inputs)``
    returns new outputs (one, or a tuple); ``module(*inputs, out=outputs)`` writes into
    given ones and returns them; ``module(*all_arguments)`` returns None. Arrays are all
    NumPy (copied to the GPU and back; the call waits) or all GPU arrays (passed by
    pointer; launched on their library's current stream, without waiting; new outputs made
    by that library, PyTorch or CuPy). The cubin is loaded on the first call, on GPU 0 or
    the GPU of the first GPU array, in that GPU's primary context, and stays there.

    Args:
        cubin: The kernel's machine code (``compile_cuda``).
        source: Its CUDA C source, kept for reading.
        entry: The kernel's name (``extern "C" __global__``); of several, ``{entry}_kernel{n}``
            is the n-th (``ir/kernels.py``).
        args: Its arguments, in order.
        launch: Its grid, block and dynamic shared memory; of several kernels, theirs in order.
        workspace: The buffers its kernels pass between them.

    Raises:
        ValueError: If names repeat, a launch zeroes an argument that is not an output, or
            a single kernel has a workspace.

    A call raises ``TypeError`` / ``ValueError`` / ``TilecraftError`` naming the argument at
    fault (``bind_arrays``), ``TargetError`` when cuda-bindings or the driver is missing, and
    ``TilecraftError`` when the block is larger than the kernel allows or the launch fails.
    """

    def __init__(self, cubin: bytes, source: str, entry: str, args: Sequence[ArgSpec],
                 launch: LaunchSpec | Sequence[LaunchSpec], workspace: Sequence[ArgSpec] = ()) -> None:
        self.cubin = bytes(cubin)
        self.source = source
        self.entry = entry
        self.args = tuple(args)
        self.launches = (launch,) if isinstance(launch, LaunchSpec) else tuple(launch)
        self.workspace = tuple(workspace)
        self.entries = kernel_entries(entry, len(self.launches))
        names = [arg.name for arg in self.args + self.workspace]
        if len(set(names)) != len(names):
            raise ValueError(f"{entry}: argument and workspace names {names} repeat; give each its own name")
        if any(_ints(w.shape) is None or min(w.shape, default=0) < 0 for w in self.workspace):
            raise ValueError(f"{entry}: workspace shapes {[w.shape for w in self.workspace]} must be ints >= 0")
        if not self.launches or (self.workspace and len(self.launches) == 1):
            raise ValueError(f"{entry}: {len(self.launches)} launches with {len(self.workspace)} workspace buffers; "
                             "a module has at least one kernel, and a workspace only between several")
        for launch in self.launches:
            if any(n >= len(self.args) or not self.args[n].is_output for n in launch.zeroed):
                raise ValueError(f"{entry}: a launch zeroes arguments {list(launch.zeroed)}, but only outputs among "
                                 f"its {len(self.args)} arguments can be zeroed")
        self._kernel: _Kernel | None = None

    def __repr__(self) -> str:
        launches = ", ".join(f"grid={launch.grid}, block={launch.block}, shared_bytes={launch.shared_bytes}"
                             for launch in self.launches)
        return f"CudaModule({self.entry!r}, args=({', '.join(arg.name for arg in self.args)}), {launches})"

    def unloaded(self) -> CudaModule:
        """The same kernels, loaded on no GPU yet: a module stays on the GPU its first call
        loaded it on, so a model moved to another GPU loads its kernels there afresh."""
        return CudaModule(self.cubin, self.source, self.entry, self.args, self.launches, self.workspace)

    def to_json(self) -> dict[str, Any]:
        """The metadata that travels beside the cubin: entry, arguments, launch and workspace."""
        return {"entry": self.entry, "args": [_arg_json(a) for a in self.args],
                **launch_json(self.launches, self.workspace)}

    @classmethod
    def from_artifact(cls, cubin: bytes, metadata: Mapping[str, Any], source: str = "") -> CudaModule:
        """The module of a cubin and the ``to_json()`` written beside it.

        Raises:
            ValueError: If the metadata lacks a field.
        """
        try:
            args, workspace = ([ArgSpec(a["name"], tuple(a["shape"]), a["dtype"], bool(a["is_output"]))
                                for a in listed] for listed in (metadata["args"], metadata.get("workspace", ())))
            launch = metadata["launch"]
            launches = ([LaunchSpec.from_json(one) for one in launch] if isinstance(launch, list)
                        else LaunchSpec.from_json(launch))
            return cls(cubin, source, metadata["entry"], args, launches, workspace)
        except KeyError as missing:
            raise ValueError(f"CUDA kernel metadata lacks {missing}; write it with CudaModule.to_json()") from None

    @classmethod
    def of_launch(cls, cubin: bytes, entry: str, args: Sequence[ArgSpec], launch: Mapping[str, Any]) -> CudaModule:
        """The module of a cubin built for ``args``, launched as ``launch`` (``launch_json``) says.

        Raises:
            ValueError: If ``launch`` is malformed.
        """
        try:
            return cls.from_artifact(cubin, {**launch, "entry": entry, "args": [_arg_json(a) for a in args]})
        except (TypeError, AttributeError) as error:
            raise ValueError(f"a malformed CUDA launch: {error}") from None

    def __call__(self, *arrays: Any, out: Any = None) -> Any:
        """Run the kernel once; see the class docstring for the forms of a call."""
        args, stream, result = self._prepare(arrays, out)
        with self._staged(args, stream) as pointers:
            self._kernel.launch(pointers, stream)
        return result

    def wait(self) -> None:
        """Wait for this kernel's launches on the legacy default stream (where calls with
        ``DeviceArray`` arguments run); an error inside the kernel is raised here."""
        if self._kernel is not None:
            with self._kernel.current():
                self._kernel.synchronize(0)

    def time_evaluator(self, number: int = 10, repeat: int = 3, flush_l2: bool = True, warmup: bool = True):
        """A function that times the kernel with CUDA events.

        ``f(*arrays, out=None)`` takes arrays as a call does (NumPy arrays are copied to the
        GPU once) and returns a ``ProfileResult`` of seconds per launch, one entry per
        repeat, each the mean of ``number`` launches, after one untimed warm-up launch
        (``warmup=False`` leaves it out, where the caller has just launched the kernel).
        With ``flush_l2``, a 256 MiB buffer is zeroed before each launch, outside the timed
        events, so that every launch starts with a cold L2 as Triton's ``do_bench`` does;
        without it, the ``number`` launches run back to back between one pair of events.

        Raises:
            ValueError: ``f`` raises it for ``number`` or ``repeat`` below 1.
        """

        def evaluate(*arrays: Any, out: Any = None) -> ProfileResult:
            if number < 1 or repeat < 1:
                raise ValueError(f"time_evaluator: number={number} and repeat={repeat} must be >= 1")
            args, stream, _ = self._prepare(arrays, out)
            with self._staged(args, stream) as pointers:
                return self._kernel.time(pointers, stream, number, repeat, flush_l2, warmup)

        return evaluate

    def loaded(self, device: int = 0) -> _Kernel:
        """The kernel loaded on GPU ``device`` (by the first call, or here)."""
        if self._kernel is None:
            self._kernel = _Kernel(self.cubin, tuple(zip(self.entries, self.launches)), device,
                                   tuple(map(_bytes, self.args)), tuple(map(_bytes, self.workspace)))
        if self._kernel.device != device:
            raise ValueError(f"{self.entry} is loaded on cuda:{self._kernel.device}, not cuda:{device}")
        return self._kernel

    def _prepare(self, arrays: Sequence[Any], out: Any) -> tuple[list[Any], int, Any]:
        """Every argument in order (GPU addresses, or NumPy arrays), outputs made where not
        given; the stream to launch on; what the call returns. The first call loads the kernel."""
        binding = bind_arrays(self.entry, self.args, arrays, out, None if self._kernel is None else self._kernel.device)
        self.loaded(binding.device)
        missing = [i for i in range(len(self.args)) if i not in binding.arrays]
        specs = [self.args[i] for i in missing]
        if binding.on_device:
            library = type(binding.arrays[next(iter(binding.pointers))]).__module__.partition(".")[0]
            made, stream = _gpu_arrays_and_stream(library, binding.device, specs)
        else:
            made, stream = [np.empty(spec.shape, spec.dtype) for spec in specs], 0
        every = {**binding.arrays, **dict(zip(missing, made))}
        outputs = tuple(every[i] for i, spec in enumerate(self.args) if spec.is_output)
        result = (outputs[0] if len(outputs) == 1 else outputs) if binding.returns_outputs else None
        if binding.on_device:
            every = {**binding.pointers, **{i: int(gpu_array(array).__cuda_array_interface__["data"][0])
                                            for i, array in zip(missing, made)}}  # bfloat16's as its bits
        return [every[i] for i in range(len(self.args))], stream, result

    @contextlib.contextmanager
    def _staged(self, arrays: list[Any], stream: int):
        """The GPU address of every argument, in order, with the kernel's context current.
        ``arrays`` are GPU addresses (used as they are) or NumPy arrays: those are copied
        to GPU buffers here, and on leaving, the kernel is waited for, outputs are copied
        back and the buffers freed."""
        cu, kernel = _driver(), self._kernel
        with kernel.current():
            if all(isinstance(value, int) for value in arrays):
                yield arrays
                return
            buffers = []
            try:
                for array in arrays:  # outputs too: a kernel that writes part of one leaves the rest as given
                    buffers.append(_call(cu.cuMemAlloc, max(array.nbytes, 1)))
                    _call(cu.cuMemcpyHtoD, buffers[-1], array.ctypes.data, array.nbytes)
                yield [int(buffer) for buffer in buffers]
                kernel.synchronize(stream)
                for spec, array, buffer in zip(self.args, arrays, buffers):
                    if spec.is_output:
                        _call(cu.cuMemcpyDtoH, array.ctypes.data, buffer, array.nbytes)
            finally:
                for buffer in buffers:
                    cu.cuMemFree(buffer)


def _gpu_arrays_and_stream(library: str, device: int, specs: Sequence[ArgSpec]) -> tuple[list, int]:
    """New arrays for ``specs`` made by ``library`` on GPU ``device``, and the library's
    current stream there (0, the legacy default stream, for a library not known)."""
    if library not in ("torch", "cupy"):
        if specs:
            raise TypeError(f"tilecraft makes new GPU outputs with PyTorch or CuPy only, not {library}; pass "
                            f"outputs ({', '.join(spec.name for spec in specs)}) with out=")
        return [], 0
    module = sys.modules[library]  # imported, since the call was given its arrays
    if library == "torch":
        made = [module.empty(s.shape, dtype=getattr(module, s.dtype), device=f"cuda:{device}") for s in specs]
        return made, module.cuda.current_stream(device).cuda_stream
    with module.cuda.Device(device):
        return [module.empty(s.shape, dtype=s.dtype) for s in specs], module.cuda.get_current_stream().ptr


def _driver():
    """``cuda.bindings.driver``, imported where it is used: tilecraft runs without it."""
    try:
        from cuda.bindings import driver
    except ImportError:
        raise TargetError(f"running CUDA kernels needs NVIDIA's cuda-bindings package: {_INSTALL}") from None
    return driver


def _call(function: Any, *args: Any) -> Any:
    """``function(*args)``'s value: a driver call returns ``(CUresult, value...)``; an error
    status raises a TilecraftError that names the call and the error."""
    status, *values = function(*args)
    if status != 0:
        name = _error_name(status)
        raise TilecraftError(f"the CUDA driver call {function.__name__} failed: {name}{_HINTS.get(name, '')}")
    return values[0] if len(values) == 1 else None


def _error_name(status: Any) -> str:
    _, name = _driver().cuGetErrorName(status)
    return name.decode() if name else str(status)


# One reference to each GPU's primary context, held until the process ends as the CUDA
# runtime holds it: were each kernel to retain and release its own, the last release would
# destroy the context, and the next kernel (a tuner's next candidate in the measuring
# worker) would pay for a new one, a large part of a trial on an H100.
_KEPT_CONTEXTS: dict[int, Any] = {}


def _primary_context(device: int) -> Any:
    """GPU ``device``'s primary context (the CUDA runtime's, so PyTorch's and CuPy's pointers
    are valid in it), retained on first use."""
    if device not in _KEPT_CONTEXTS:
        cu = _driver()
        try:
            _call(cu.cuInit, 0)
        except RuntimeError as error:  # cuda-bindings raises this when libcuda.so.1 is missing
            raise TargetError(f"no NVIDIA driver was found ({error}); CUDA kernels run only on a machine with a "
                              f"GPU and its driver") from None
        _KEPT_CONTEXTS[device] = _call(cu.cuDevicePrimaryCtxRetain, _call(cu.cuDeviceGet, device))
    return _KEPT_CONTEXTS[device]


@contextlib.contextmanager
def _current(context: Any):
    """``context`` made current for the calling thread, and the thread's own restored after."""
    cu = _driver()
    _call(cu.cuCtxPushCurrent, context)
    try:
        yield
    finally:
        cu.cuCtxPopCurrent()


class DeviceArray:
    """A copy of a NumPy array in the memory of GPU ``device``, freed with this object.

    A ``CudaModule`` takes it as it takes a PyTorch or CuPy array (by pointer, through
    ``__cuda_array_interface__``), so a caller with neither library can upload inputs once
    and launch or time a kernel on them many times; ``numpy()`` copies the data back.
    """

    def __init__(self, array: np.ndarray, device: int = 0) -> None:
        array = np.ascontiguousarray(array)
        self._allocate(array.shape, array.dtype, device)
        self.copy_from(array)

    @classmethod
    def empty(cls, shape: tuple[int, ...], dtype: str, device: int = 0) -> DeviceArray:
        """GPU memory for an array of ``shape`` and ``dtype``, not initialized."""
        out = cls.__new__(cls)
        out._allocate(tuple(shape), NUMPY_DTYPES[dtype], device)
        return out

    def _allocate(self, shape: tuple[int, ...], dtype: np.dtype, device: int) -> None:
        self.shape, self.dtype, self.device, self.base = shape, dtype, device, None
        cu, context = _driver(), _primary_context(device)
        with _current(context):
            self.pointer = int(_call(cu.cuMemAlloc, max(self.nbytes, 1)))
        weakref.finalize(self, _free, cu, context, self.pointer).atexit = False

    @classmethod
    def view(cls, array: Any, shape: tuple[int, ...], dtype: str | None = None) -> DeviceArray:
        """The first bytes of ``array`` (a GPU array of any library, C-contiguous) seen with
        ``shape`` and ``dtype`` (its own by default), without a copy; it keeps ``array`` alive."""
        array = gpu_array(array)
        face = array.__cuda_array_interface__
        view = cls.__new__(cls)
        view.shape, view.pointer = tuple(shape), int(face["data"][0])
        view.dtype = NUMPY_DTYPES[dtype] if dtype else element_dtype(array)
        where = getattr(array, "__dlpack_device__", None)
        view.device, view.base = int(where()[1]) if where is not None else 0, array
        if view.nbytes > math.prod(face["shape"]) * element_dtype(array).itemsize:
            raise ValueError(f"a view of {view.dtype.name}{list(view.shape)} reaches past the "
                             f"{element_dtype(array).name}{list(face['shape'])} array it views")
        return view

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.pointer, False), "version": 3,
                "strides": None}

    def __dlpack_device__(self) -> tuple[int, int]:
        """Where the data is, as DLPack says it (a CUDA GPU and its index): what the checks of a
        call read, as they read a PyTorch or CuPy array's."""
        return _CUDA, self.device

    def numpy(self) -> np.ndarray:
        """The data, copied back once the work queued on the legacy default stream is done."""
        out = np.empty(self.shape, self.dtype)
        with _current(_primary_context(self.device)):
            _call(_driver().cuMemcpyDtoH, out.ctypes.data, self.pointer, out.nbytes)
        return out

    def copy_from(self, array: Any) -> None:
        """Overwrite the data with ``array``'s, a NumPy array or a GPU array of the same size."""
        cu, face = _driver(), getattr(gpu_array(array), "__cuda_array_interface__", None)
        with _current(_primary_context(self.device)):
            if face is None:
                array = np.ascontiguousarray(array)
                _call(cu.cuMemcpyHtoD, self.pointer, array.ctypes.data, self.nbytes)
            else:
                _call(cu.cuMemcpyDtoD, self.pointer, int(face["data"][0]), self.nbytes)

    def copy(self) -> DeviceArray:
        """A new GPU array holding this one's data."""
        out = DeviceArray.empty(self.shape, self.dtype.name, self.device)
        out.copy_from(self)
        return out


class LaunchPlan:
    """Kernels launched in order on fixed GPU addresses, each one's arguments packed once, so
    that a call costs the driver's launches and little else (a compiled model's steps; the
    same fixed addresses let a ``LaunchGraph`` capture them). A kernel with a workspace gets
    one of the plan's own, freed with the plan, whatever stream the plan runs on.

    Args:
        calls: Each launch: a ``CudaModule`` and the GPU address of each of its arguments.
        device: The GPU they run on.
    """

    def __init__(self, calls: Sequence[tuple[CudaModule, Sequence[int]]], device: int = 0) -> None:
        self.device, self._launches = device, []
        for module, pointers in calls:
            if len(pointers) != len(module.args):
                raise ValueError(f"{module.entry} takes {len(module.args)} arguments, not {len(pointers)}")
            kernel = module.loaded(device)
            self._launches.append((kernel, kernel.pack(pointers, plan=self)))

    def __len__(self) -> int:
        return len(self._launches)

    def run(self, seconds: np.ndarray | None = None, stream: int = 0) -> None:
        """Launch every kernel on ``stream`` without waiting; with ``seconds`` (one float per
        launch), wait for each and write the seconds it took from the end of the one before."""
        with _current(_primary_context(self.device)):
            start = time.perf_counter()
            for n, (kernel, packed) in enumerate(self._launches):
                kernel.launch_packed(packed, stream)
                if seconds is not None:
                    kernel.synchronize(stream)
                    seconds[n], start = time.perf_counter() - start, time.perf_counter()


class LaunchGraph:
    """A ``LaunchPlan``'s launches captured once into a CUDA graph, on a stream of its own: a
    call is one launch of the graph, where the plan's costs the driver one launch a kernel
    (what pays for a model of many short kernels). The stream is a blocking one, so copies
    on the legacy default stream (a model's inputs in, its outputs out) and the graph wait
    for each other as the plan's launches there do.

    Raises:
        TilecraftError: If the driver refuses the capture or the graph.
    """

    def __init__(self, plan: LaunchPlan) -> None:
        cu = _driver()
        self.device, self._plan = plan.device, plan  # the plan's packed arguments outlive the graph
        context = _primary_context(plan.device)
        with _current(context):
            self.stream = _call(cu.cuStreamCreate, 0)
            graph = executable = None
            try:
                _call(cu.cuStreamBeginCapture, self.stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                try:
                    plan.run(stream=self.stream)
                finally:
                    graph = _call(cu.cuStreamEndCapture, self.stream)
                self.executable = executable = _call(cu.cuGraphInstantiate, graph, 0)
            finally:
                weakref.finalize(self, _destroy_graph, cu, context, self.stream, graph, executable)

    def run(self) -> None:
        """Launch the graph on its stream without waiting."""
        with _current(_primary_context(self.device)):
            _call(_driver().cuGraphLaunch, self.executable, self.stream)


def _destroy_graph(cu: Any, context: Any, stream: Any, graph: Any, executable: Any) -> None:
    """Free a ``LaunchGraph``'s executable graph, graph and stream (a weakref finalizer)."""
    if cu.cuCtxPushCurrent(context)[0] == 0:
        if executable is not None:
            cu.cuGraphExecDestroy(executable)
        if graph is not None:
            cu.cuGraphDestroy(graph)
        cu.cuStreamDestroy(stream)
        cu.cuCtxPopCurrent()


def _packed(pointers: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """A launch's arguments as ``cuLaunchKernel`` takes them: ``kernelParams`` is a void**, whose
    entry i holds the address of argument i's value. Both arrays must outlive the launch."""
    values = np.array(pointers, dtype=np.uint64)
    return values, np.array([values.ctypes.data + 8 * i for i in range(len(values))], dtype=np.uint64)


def launch_json(launches: Sequence[LaunchSpec], workspace: Sequence[ArgSpec] = ()) -> dict[str, Any]:
    """How a module's kernels are launched, as JSON: ``launch``, one launch (a kernel) or a list
    of them (kernels run in order), and ``workspace``, the buffers those pass between them."""
    specs = [launch.to_json() for launch in launches]
    return {"launch": specs[0] if len(specs) == 1 else specs, "workspace": [_arg_json(a) for a in workspace]}


def _bytes(spec: ArgSpec) -> int:
    return math.prod(spec.shape) * NUMPY_DTYPES[spec.dtype].itemsize


def _arg_json(spec: ArgSpec) -> dict[str, Any]:
    return {"name": spec.name, "shape": list(spec.shape), "dtype": spec.dtype, "is_output": spec.is_output}


def _free(cu: Any, context: Any, pointer: int) -> None:
    if cu.cuCtxPushCurrent(context)[0] == 0:
        cu.cuMemFree(pointer)
        cu.cuCtxPopCurrent()


def _free_workspaces(cu: Any, context: Any, workspaces: dict, owner: tuple[str, int] | None = None) -> None:
    """Free the workspace of ``owner`` (a finalizer of its plan), or every one left (of the kernel)."""
    owners = list(workspaces) if owner is None else [owner]
    if owners and cu.cuCtxPushCurrent(context)[0] == 0:
        for pointer in (pointer for key in owners for pointer in workspaces.pop(key)):
            cu.cuMemFree(pointer)
        cu.cuCtxPopCurrent()


class _Kernel:
    """A module's kernels, each an entry of one cubin, loaded on one GPU in its primary
    context; the module is unloaded when this is garbage-collected. ``kernels``: each one's
    entry and launch, in order; ``arg_bytes`` and ``workspace_bytes``: the size of each
    argument and workspace buffer.

    Each stream that calls the kernels, and each ``LaunchPlan`` of them, gets a workspace of
    its own, made at its first launch: kernels queued on one stream run one after another,
    so they may share one, but two streams run at once and would add into each other's
    partial sums (as cuBLAS keeps a workspace per stream). A plan's is freed with the plan,
    the streams' with this."""

    def __init__(self, cubin: bytes, kernels: tuple[tuple[str, LaunchSpec], ...], device: int,
                 arg_bytes: tuple[int, ...], workspace_bytes: tuple[int, ...] = ()) -> None:
        self.kernels, self.device, self.arg_bytes, self.workspace_bytes = kernels, device, arg_bytes, workspace_bytes
        cu = _driver()
        self.context = _primary_context(device)
        self._workspaces: dict[tuple[str, int], list[int]] = {}  # ("stream", handle) or ("plan", id) -> addresses
        with self.current():
            module = _call(cu.cuModuleLoadData, cubin)
            weakref.finalize(self, _unload, cu, self.context, module).atexit = False
            weakref.finalize(self, _free_workspaces, cu, self.context, self._workspaces).atexit = False
            self.functions, self.registers = [], []
            for entry, launch in kernels:
                self.functions.append(self._function(cu, module, entry, launch))

    def _function(self, cu: Any, module: Any, entry: str, launch: LaunchSpec) -> Any:
        """The function ``entry`` of ``module``, set up for ``launch`` (its dynamic shared
        memory opted in to) and checked to run its blocks."""
        function = _call(cu.cuModuleGetFunction, module, entry.encode())

        def attribute(name: str) -> int:
            return _call(cu.cuFuncGetAttribute, getattr(cu.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}"), function)

        if launch.shared_bytes > _STATIC_SHARED_LIMIT:
            static, limit = attribute("SHARED_SIZE_BYTES"), _call(
                cu.cuDeviceGetAttribute, cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                _call(cu.cuDeviceGet, self.device))
            if static + launch.shared_bytes > limit:
                raise TilecraftError(f"kernel {entry!r} asks for {launch.shared_bytes} bytes of dynamic shared "
                                     f"memory beside {static} static; cuda:{self.device} allows {limit} per block")
            _call(cu.cuFuncSetAttribute, function,
                  cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, launch.shared_bytes)
        max_threads = attribute("MAX_THREADS_PER_BLOCK")
        self.registers.append(attribute("NUM_REGS"))
        if launch.threads > max_threads:
            raise TilecraftError(f"kernel {entry!r} cannot run blocks of {launch.block} ({launch.threads} threads): "
                                 f"with {self.registers[-1]} registers per thread it allows at most {max_threads} "
                                 f"threads per block; choose a smaller block")
        return function

    def current(self):
        """This GPU's context made current for the calling thread, and the thread's own restored after."""
        return _current(self.context)

    def pack(self, pointers: Sequence[int], stream: Any = 0, plan: LaunchPlan | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
        """The kernels' arguments as ``cuLaunchKernel`` takes them: ``pointers`` (one an
        argument), then the workspace of ``stream``, or of ``plan`` (freed with it)."""
        owner = ("stream", int(stream)) if plan is None else ("plan", id(plan))
        if self.workspace_bytes and owner not in self._workspaces:
            cu = _driver()
            with self.current():
                self._workspaces[owner] = [int(_call(cu.cuMemAlloc, max(size, 1))) for size in self.workspace_bytes]
            if plan is not None:
                weakref.finalize(plan, _free_workspaces, cu, self.context, self._workspaces, owner).atexit = False
        return _packed([*pointers, *self._workspaces.get(owner, ())])

    def launch(self, pointers: Sequence[int], stream: Any, times: int = 1) -> None:
        """Launch the kernels ``times`` times on ``stream``, their arguments packed once."""
        self.launch_packed(self.pack(pointers, stream), stream, times)

    def launch_packed(self, packed: tuple[np.ndarray, np.ndarray], stream: int, times: int = 1) -> None:
        """Launch the kernels in order ``times`` times on ``stream`` with arguments ``pack``-ed
        before, each after zeroing the arguments it adds into."""
        cu = _driver()
        launch_kernel, address = cu.cuLaunchKernel, packed[1].ctypes.data
        for _ in range(times):
            for n, (function, (_, spec)) in enumerate(zip(self.functions, self.kernels)):
                for zeroed in spec.zeroed:
                    _call(cu.cuMemsetD8Async, int(packed[0][zeroed]), 0, self.arg_bytes[zeroed], stream)
                status, = launch_kernel(function, *spec.grid, *spec.block, spec.shared_bytes, stream, address, 0)
                if status != 0:
                    raise self._failure(status, n)

    def synchronize(self, stream: int) -> None:
        """Wait for ``stream``; an error inside the kernel is reported here."""
        status, = _driver().cuStreamSynchronize(stream)
        if status != 0:
            raise self._failure(status)

    def _failure(self, status: Any, n: int | None = None) -> TilecraftError:
        """The error of a failed launch (kernel ``n``) or of one found waiting (``None``: any)."""
        if n is None and len(self.kernels) > 1:
            return TilecraftError(f"kernels {[entry for entry, _ in self.kernels]} failed on cuda:{self.device}: "
                                  f"{_error_name(status)}")
        (entry, spec), registers = self.kernels[n or 0], self.registers[n or 0]
        return TilecraftError(f"kernel {entry!r} failed on cuda:{self.device}: {_error_name(status)} (grid "
                              f"{spec.grid}, block {spec.block}, {spec.shared_bytes} bytes of dynamic shared memory, "
                              f"{registers} registers per thread)")

    def time(self, pointers: Sequence[int], stream: int, number: int, repeat: int, flush_l2: bool,
             warmup: bool = True) -> ProfileResult:
        """Seconds per launch, one entry per repeat (see ``CudaModule.time_evaluator``)."""
        cu = _driver()
        flush, pairs = None, []
        try:
            flush = _call(cu.cuMemAlloc, L2_FLUSH_BYTES) if flush_l2 else None
            # One event pair per launch when flushing (the flush stays outside), else one around all.
            for _ in range(number if flush_l2 else 1):
                pairs.append((_call(cu.cuEventCreate, 0), _call(cu.cuEventCreate, 0)))
            if warmup:
                self.launch(pointers, stream)  # instruction cache, TLB, clocks
            results = []
            for _ in range(repeat):
                for start, end in pairs:
                    if flush is not None:
                        _call(cu.cuMemsetD8Async, flush, 0, L2_FLUSH_BYTES, stream)
                    _call(cu.cuEventRecord, start, stream)
                    self.launch(pointers, stream, number // len(pairs))
                    _call(cu.cuEventRecord, end, stream)
                self.synchronize(stream)
                total_ms = sum(_call(cu.cuEventElapsedTime, start, end) for start, end in pairs)
                results.append(total_ms / 1e3 / number)
        finally:
            for event in (event for pair in pairs for event in pair):
                cu.cuEventDestroy(event)
            if flush is not None:
                cu.cuMemFree(flush)
        return ProfileResult(tuple(results))


def _unload(cu: Any, context: Any, module: Any) -> None:
    """Unload a kernel's module (a weakref finalizer)."""
    if cu.cuCtxPushCurrent(context)[0] == 0:
        cu.cuModuleUnload(module)
        cu.cuCtxPopCurrent()
