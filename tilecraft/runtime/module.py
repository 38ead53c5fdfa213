"""A compiled kernel as a Python callable over NumPy arrays.

The C entry takes one raw pointer per argument, so nothing on the C side can check what
it is given; ``Module`` checks shapes, dtypes and layout on the Python side and names the
argument at fault. Some arguments (weights) are repacked into a kernel-friendly layout
by generated pack functions; ``bind_weights`` packs them once so that repeated calls and
timings pay only for the kernel, as a deployed model would.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..errors import BuildError
from ..target import Target
from ..te.dtype import DTYPES, supported
from .evict import weight_evictor
from .plan import Call
from .timer import ProfileResult, cache_flusher, time_callable


@dataclass(frozen=True, slots=True)
class ArgSpec:
    """One argument of the C entry, in order."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    is_output: bool

    def __post_init__(self) -> None:
        if not supported(self.dtype):
            raise ValueError(f"argument {self.name!r} has dtype {self.dtype!r}; use one of {', '.join(DTYPES)}")


@dataclass(frozen=True, slots=True)
class PackSpec:
    """``func_name(src, dst)`` repacks input ``arg_index`` into a buffer of ``packed_shape``
    (same dtype); the entry then receives that buffer instead of the user's array."""

    arg_index: int
    func_name: str
    packed_shape: tuple[int, ...]


class Module:
    """A compiled kernel, called with NumPy arrays; ``build`` returns one.

    ``module(*inputs)`` returns new outputs; ``module(*inputs, *outputs)`` (or
    ``out=``) writes into given ones and returns them (None when passed positionally).
    Several outputs are returned as a tuple. Every array must be a C-contiguous
    ``numpy.ndarray`` of the argument's shape and dtype (outputs writeable and not
    overlapping another argument); otherwise the call raises ``TypeError`` or
    ``ValueError`` naming the argument. Inputs with a packed layout
    (``Schedule.transform_layout``) are packed at every call, unless bound once with
    ``bind_weights``.

    Args:
        lib_path: The shared library.
        source: Its C source.
        entry_name: The name of the kernel's C function.
        args: The function's arguments, in order.
        packs: The pack functions of inputs stored in another layout.

    Attributes:
        lib_path: The shared library (``pathlib.Path``).
        source: The kernel's C source, readable.
        entry_name: The name of the kernel's C function.
        args: The arguments (name, shape, dtype, whether an output), in order.

    Raises:
        BuildError: If the library lacks the entry or a pack function.
        ValueError: If argument names repeat or a pack targets an output.
        OSError: If the library cannot be loaded.
    """

    def __init__(self, lib_path: Path, source: str, entry_name: str, args: Sequence[ArgSpec],
                 packs: Sequence[PackSpec] = ()) -> None:
        self.lib_path = Path(lib_path)
        self.source = source
        self.entry_name = entry_name
        self.args = tuple(args)
        self.packs = tuple(packs)
        names = [arg.name for arg in self.args]
        if len(set(names)) != len(names):
            raise ValueError(f"{entry_name}: argument names {names} repeat; give each argument its own name")
        for pack in self.packs:
            if not 0 <= pack.arg_index < len(self.args) or self.args[pack.arg_index].is_output:
                raise ValueError(f"{entry_name}: pack {pack.func_name} targets argument {pack.arg_index}, "
                                 f"which is not an input; only inputs can be packed")
        lib = ctypes.CDLL(str(self.lib_path))
        self._entry = _c_function(lib, entry_name, len(self.args), self.lib_path)
        self._pack_fns = {pack.arg_index: (_c_function(lib, pack.func_name, 2, self.lib_path), pack.packed_shape)
                          for pack in self.packs}
        self._dtypes = tuple(np.dtype(arg.dtype) for arg in self.args)
        self._nbytes = tuple(math.prod(arg.shape) * dtype.itemsize for arg, dtype in zip(self.args, self._dtypes))
        self._bind({})

    def _bind(self, bound: dict[int, np.ndarray]) -> None:
        """Fix the arguments in ``bound`` (arg index -> the buffer the entry receives) and
        work out, once, which arguments a call is given."""
        self._bound = bound
        self._bound_slots = [bound[i].ctypes.data if i in bound else 0 for i in range(len(self.args))]
        self._free = [i for i in range(len(self.args)) if i not in bound]
        self._packed_inputs = [i for i in self._pack_fns if i not in bound]
        self._inputs = [i for i in self._free if not self.args[i].is_output]
        self._output_args = [i for i in self._free if self.args[i].is_output]

    def __repr__(self) -> str:
        return f"Module({self.entry_name!r}, args=({', '.join(arg.name for arg in self.args)}), lib={self.lib_path})"

    def __call__(self, *arrays: np.ndarray, out: np.ndarray | Sequence[np.ndarray] | None = None):
        """Run the kernel: on the inputs (new outputs returned), on the inputs and ``out``
        (returned), or on all the arguments not bound, in order (None returned).

        Raises:
            TypeError: If the number of arrays fits neither form, or one is not an ndarray.
            ValueError: If an array has the wrong shape or dtype, is not C-contiguous, or
                an output is read-only or overlaps another argument.
        """
        addresses, made, result = self._prepare(arrays, out)  # ``made``: packed inputs, alive until it returns
        self._entry(*addresses)
        return result

    def bind_weights(self, **weights: np.ndarray) -> Module:
        """A Module whose named inputs are fixed: packed (or copied) once, here, and left
        out of the arguments of later calls, as a deployed model's weights are.

        Args:
            **weights: Arrays for inputs by name.

        Returns:
            A new Module; this one is unchanged.

        Raises:
            TypeError: If a name is not an input still taken by calls.
            ValueError: If an array has the wrong shape or dtype or is not C-contiguous.
        """
        bound = dict(self._bound)
        for name, array in weights.items():
            index = next((i for i in self._inputs if self.args[i].name == name), None)
            if index is None:
                raise TypeError(f"{self.entry_name}: cannot bind {name!r}; the inputs that can be bound are "
                                f"{[self.args[i].name for i in self._inputs]}")
            self._check(index, array)
            bound[index] = self._packed(index, array) if index in self._pack_fns else array.copy()
        module = copy.copy(self)
        module._bind(bound)
        return module

    def plan_calls(self, arguments: Sequence[int | str]) -> tuple[list[Call], list[np.ndarray]]:
        """The C calls of ``module(*arguments)`` for a ``NativePlan``: ``arguments`` are the
        addresses of the arguments not bound, in order, or names of the plan's slots. The caller
        has checked what they point to. An input packed at every call is packed into a buffer
        made here, returned beside the calls for the plan to keep alive."""
        free = self._free
        if len(arguments) != len(free):
            raise TypeError(f"{self.entry_name}: {len(arguments)} argument(s) for the "
                            f"{len(free)} not bound ({', '.join(self.args[i].name for i in free)})")
        given = dict(zip(free, arguments))
        calls, buffers, entry_args = [], [], []
        for index in range(len(self.args)):
            if index in self._bound:
                entry_args.append(self._bound[index].ctypes.data)
            elif index in self._pack_fns:
                pack_fn, packed_shape = self._pack_fns[index]
                buffers.append(aligned_empty(packed_shape, self._dtypes[index]))
                calls.append((_address(pack_fn), (given[index], buffers[-1].ctypes.data)))
                entry_args.append(buffers[-1].ctypes.data)
            else:
                entry_args.append(given[index])
        calls.append((_address(self._entry), tuple(entry_args)))
        return calls, buffers

    def time_evaluator(self, number: int = 10, repeat: int = 3, min_repeat_ms: float = 0.0,
                       enable_cpu_cache_flush: bool = False, warmup: bool = True,
                       evict_weights: bool = False) -> Callable[..., ProfileResult]:
        """A function that times the kernel with TVM's ``time_evaluator`` protocol.

        ``f(*arrays)`` -> seconds per call of the entry alone (packing happens once,
        before timing). Arrays are passed as to ``module(...)``. The protocol: one
        untimed warm-up call, then ``repeat`` measurements, each the mean of ``number``
        back-to-back calls, ``number`` grown until a measurement lasts at least
        ``min_repeat_ms``. A flush or an eviction runs before every call, untimed.

        Args:
            number: Calls per measurement (at least).
            repeat: Measurements.
            min_repeat_ms: The shortest a measurement may last, in milliseconds.
            enable_cpu_cache_flush: Flush the caches (by writing twice the host's L3)
                before every call, so each call starts cold, as Ansor measures.
            warmup: Make the untimed first call.
            evict_weights: The weights (those bound, and those packed for the timing) are
                evicted from the caches before every call, as a layer inside a model finds
                them (``runtime/evict.py``).

        Returns:
            ``f(*arrays, out=None)`` returning a ``ProfileResult`` of seconds per call,
            one entry per repeat.

        Raises:
            ValueError: If both ``enable_cpu_cache_flush`` and ``evict_weights`` are set;
                ``f`` raises it for ``number`` or ``repeat`` below 1, and as ``module(...)``
                for bad arrays.

        Example:
            ::

                timer = func.time_evaluator(number=10, repeat=3)
                print(timer(a, b, c).median)    # seconds per call
        """
        if enable_cpu_cache_flush and evict_weights:
            raise ValueError("time_evaluator: a cache flush evicts the weights too; ask for one of "
                             "enable_cpu_cache_flush and evict_weights")

        def evaluate(*arrays: np.ndarray, out: np.ndarray | Sequence[np.ndarray] | None = None) -> ProfileResult:
            addresses, made, _ = self._prepare(arrays, out)  # ``made`` keeps packed inputs alive while timed
            call = functools.partial(self._entry, *addresses)
            if evict_weights:
                flush = weight_evictor([*made, *self._bound.values()])
            else:
                flush = cache_flusher(2 * Target.host().l3_bytes) if enable_cpu_cache_flush else None
            return time_callable(call, number, repeat, min_repeat_ms, flush, warmup)

        return evaluate

    def _prepare(self, arrays: Sequence[np.ndarray], out: np.ndarray | Sequence[np.ndarray] | None):
        """The address of every entry argument, in order, once checked; the arrays made here
        (packed inputs, which the caller keeps alive while the entry runs); what the call returns.
        A call from Python costs about 2 us over the kernel with its outputs given, 3 with new
        ones (torch.add: 3): the checks read attributes, as each NumPy call costs a microsecond."""
        inputs, outputs = self._inputs, self._output_args
        addresses = self._bound_slots.copy()
        if out is None and len(arrays) == len(self._free):
            given, result = self._free, None
        elif len(arrays) == len(inputs):
            given = inputs
            if out is None:
                result = []
                for index in outputs:
                    array, addresses[index] = _aligned_empty(self.args[index].shape, self._dtypes[index],
                                                             self._nbytes[index])
                    result.append(array)
            else:
                result = self._outputs(outputs, out)
                given = self._free
                arrays = (*arrays, *result)
            result = result[0] if len(result) == 1 else tuple(result)
        else:
            raise TypeError(f"{self.entry_name} takes its inputs ({', '.join(self.args[i].name for i in inputs)}) "
                            f"or all its arguments ({', '.join(self.args[i].name for i in self._free)}); "
                            f"got {len(arrays)} array(s)" + (" and out=" if out is not None else ""))
        for index, array in zip(given, arrays):
            addresses[index] = self._address(index, array)
        if given is self._free:  # outputs made here overlap nothing
            self._check_overlaps(addresses)
        made = []
        for index in self._packed_inputs:
            made.append(self._packed(index, arrays[given.index(index)]))
            addresses[index] = made[-1].ctypes.data
        return addresses, made, result

    def _check_overlaps(self, addresses: list[int]) -> None:
        nbytes = self._nbytes
        for o in self._output_args:
            start, end = addresses[o], addresses[o] + nbytes[o]
            for index in self._free:
                if index != o and addresses[index] < end and start < addresses[index] + nbytes[index]:
                    raise ValueError(f"{self.entry_name}: output {self.args[o].name!r} overlaps argument "
                                     f"{self.args[index].name!r}; the kernel assumes distinct memory, so pass "
                                     f"a separate output array")

    def _outputs(self, outputs: list[int], out: np.ndarray | Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        out_arrays = (out,) if isinstance(out, np.ndarray) else tuple(out)
        if len(out_arrays) != len(outputs):
            raise TypeError(f"{self.entry_name} has {len(outputs)} output(s) "
                            f"({', '.join(self.args[i].name for i in outputs)}); out= gave {len(out_arrays)}")
        return out_arrays

    def _address(self, index: int, array: np.ndarray) -> int:
        """Where ``array``'s data starts, once it is checked as argument ``index``."""
        if (not isinstance(array, np.ndarray) or array.shape != self.args[index].shape
                or array.dtype != self._dtypes[index] or not array.flags.c_contiguous):
            self._check(index, array)  # says what is wrong
        try:
            return _writable_data(array)
        except (TypeError, ValueError):  # read-only, or empty
            if self.args[index].is_output:
                self._check(index, array)
            return array.__array_interface__["data"][0]

    def _check(self, index: int, array: np.ndarray) -> None:
        spec = self.args[index]
        role = "output" if spec.is_output else "input"
        fix = f"pass np.ascontiguousarray(x, dtype={spec.dtype!r}) of shape {spec.shape}"
        if not isinstance(array, np.ndarray):
            raise TypeError(f"{self.entry_name}: {role} {spec.name!r} must be a numpy.ndarray, "
                            f"not {type(array).__name__}; {fix}")
        if array.dtype != self._dtypes[index]:
            raise ValueError(f"{self.entry_name}: {role} {spec.name!r} has dtype {array.dtype}, "
                             f"expected {spec.dtype}; {fix}")
        if array.shape != spec.shape:
            raise ValueError(f"{self.entry_name}: {role} {spec.name!r} has shape {array.shape}, "
                             f"expected {spec.shape}; pass an array of shape {spec.shape}")
        if not array.flags.c_contiguous:
            raise ValueError(f"{self.entry_name}: {role} {spec.name!r} is not C-contiguous; {fix}")
        if spec.is_output and not array.flags.writeable:
            raise ValueError(f"{self.entry_name}: output {spec.name!r} is read-only; pass a writeable array "
                             f"such as np.empty({spec.shape}, dtype={spec.dtype!r})")

    def _packed(self, index: int, array: np.ndarray) -> np.ndarray:
        pack_fn, packed_shape = self._pack_fns[index]
        packed = aligned_empty(packed_shape, self._dtypes[index])
        pack_fn(array.ctypes.data, packed.ctypes.data)
        return packed


ALIGNMENT = 64
"""Bytes every array the runtime allocates is aligned to (a cache line)."""


def aligned_empty(shape: Sequence[int], dtype) -> np.ndarray:
    """An uninitialised C-contiguous array starting on a cache line. NumPy aligns large
    arrays to 16 bytes only, so a kernel's 32-byte vector loads of a packed weight
    straddled cache lines and ran up to 40% slower, by how malloc happened to land."""
    dtype = np.dtype(dtype)
    shape = tuple(int(extent) for extent in shape)
    return _aligned_empty(shape, dtype, math.prod(shape) * dtype.itemsize)[0]  # np.prod takes 6 us on a tuple


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype, nbytes: int) -> tuple[np.ndarray, int]:
    """``aligned_empty``'s array of ``nbytes`` and where it starts."""
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = _writable_data(raw)
    offset = -start % ALIGNMENT
    return np.ndarray(shape, dtype, raw, offset), start + offset


def _writable_data(array: np.ndarray) -> int:
    """Where a writable, C-contiguous, non-empty ``array``'s data starts (TypeError if it is
    read-only, ValueError if empty): a third of ``array.ctypes.data``'s microsecond."""
    return ctypes.addressof(ctypes.c_char.from_buffer(array))


def _address(function) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value


def _c_function(lib: ctypes.CDLL, name: str, arity: int, lib_path: Path):
    """``name`` from ``lib``, taking ``arity`` raw pointers and returning void."""
    try:
        function = lib[name]
    except AttributeError:
        raise BuildError(f"{lib_path} has no function {name!r}; the C source must define it "
                         f"(and not as static)") from None
    function.argtypes = [ctypes.c_void_p] * arity
    function.restype = None
    return function
