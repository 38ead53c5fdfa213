"""A GPU candidate's float32 output checked on the GPU, where it was computed.

The worker's check (``worker.OutputCheck``) compares an output with a bound made once a
workload: ``|got - expected| <= bound``, element by element, ``isclose`` judging the rest.
For a GPU candidate that meant copying the output back and comparing on one CPU core: a
4096² matmul's 64 MB, some 40 ms a candidate, as long as a slow candidate's launches. Here
a kernel counts the elements outside the bound on the GPU, against the expected values and
the bound uploaded once a workload, and only an output with any outside comes back, for
``OutputCheck``'s verdict and message. The comparison is the CPU's (an IEEE subtraction, its
magnitude, ``<=``, NaN outside), and where the reference is not finite the bound is -1, so
that ``isclose`` decides there: a count of zero is the verdict the CPU would give.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..errors import BuildError, TargetError
from ..runtime.module import ArgSpec

SOURCE = r"""
extern "C" __global__ void __launch_bounds__(256) tc_outside_bound(
    const float* __restrict__ got, const float* __restrict__ expected, const float* __restrict__ bound,
    const long long* __restrict__ size, unsigned int* __restrict__ outside) {
  unsigned int count = 0;
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < *size; i += gridDim.x * 256LL) {
    count += !(fabsf(got[i] - expected[i]) <= bound[i]);
  }
  if (count) atomicAdd(outside, count);
}
"""
THREADS = 256  # as SOURCE's launch bounds
MAX_BLOCKS = 1024  # enough to fill an H100's 132 SMs; each thread then strides over the rest


class DeviceCheck:
    """The elements of one float32 output outside its bound, counted on the GPU."""

    def __init__(self, cubin: bytes, expected: np.ndarray, bound: np.ndarray, device_array: type) -> None:
        from ..runtime.cuda import CudaModule, LaunchSpec

        size = self._size = expected.size
        self._device_array = device_array
        self._data = [device_array(array.reshape(-1)) for array in (expected, bound, np.array([size], np.int64))]
        self.expected = self._data[0]  # on the GPU
        self._outside = device_array(np.zeros(1, np.uint32))
        args = [ArgSpec("got", (size,), "float32", False), ArgSpec("expected", (size,), "float32", False),
                ArgSpec("bound", (size,), "float32", False), ArgSpec("size", (1,), "int64", False),
                ArgSpec("outside", (1,), "uint32", True)]
        blocks = max(min(-(-size // THREADS), MAX_BLOCKS), 1)
        launch = LaunchSpec((blocks, 1, 1), (THREADS, 1, 1), zeroed=(4,))
        self._module = CudaModule(cubin, SOURCE, "tc_outside_bound", args, launch)

    def outside(self, got: Any) -> int:
        """How many elements of ``got`` (a GPU array of the output's size) are outside the bound."""
        self._module(self._device_array.view(got, (self._size,)), *self._data, self._outside)
        return int(self._outside.numpy()[0])


def device_check(expected: np.ndarray, bound: np.ndarray | None, device_array: type) -> DeviceCheck | None:
    """The GPU check of an output, or None where the CPU's must do: not float32, no compiler
    here for its kernel (a device server may have none), or a check that does not load or
    does not count the reference itself right (only its elements that are not finite are
    outside: ``OutputCheck`` gives them a bound of -1). Every candidate of the workload would
    otherwise fail its check; the CPU's is always right, only slower. Made before a candidate
    runs, so that none of its errors can be taken for the check's."""
    cubin = _cubin() if expected.dtype == np.float32 and bound is not None and expected.size else None
    if cubin is None:
        return None
    try:
        check = DeviceCheck(cubin, expected, bound, device_array)
        works = check.outside(check.expected) == int(np.count_nonzero(bound < 0))
    except Exception:  # noqa: BLE001 - any failure here leaves the check to the CPU
        return None
    return check if works else None


@functools.cache
def _cubin() -> bytes | None:
    """SOURCE built once a process for GPU 0, or None where it cannot be."""
    from ..runtime.cuda_compiler import compile_cuda
    from ..target.cuda import CudaTarget

    try:
        return compile_cuda(SOURCE, CudaTarget.device().arch)
    except (BuildError, TargetError, OSError):
        return None
