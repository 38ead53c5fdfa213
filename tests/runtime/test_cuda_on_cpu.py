"""CUDA C run on the CPU (runtime/cuda_on_cpu.py): kernels written by hand compute what a GPU
would, and each rule a GPU punishes (a barrier not every thread reaches, a read before a
barrier or a wait, an access out of bounds or misaligned, a wmma operand in another layout)
ends the run with a message that names it. Each test compiles a program or two (a third of a
second each): the quick subset keeps the barrier, shuffle and racecheck tests."""

import shutil

import numpy as np
import pytest

from tilecraft.errors import TilecraftError
from tilecraft.runtime.cuda import LaunchSpec
from tilecraft.runtime.cuda_on_cpu import CudaOnCpuModule, compile_program, cuda_program
from tilecraft.runtime.module import ArgSpec

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler")


def kernel(body: str, args: list[ArgSpec], block=(32, 1, 1), grid=(1, 1, 1), order=1, cache=None,
           racecheck=False) -> CudaOnCpuModule:
    params = ", ".join(f"{'float' if a.dtype == 'float32' else 'unsigned short'}* {a.name}" for a in args)
    source = cuda_program(f'extern "C" __global__ void k({params}) {{\n{body}\n}}\n', ["k"], args,
                          [LaunchSpec(grid, block)], ())
    return CudaOnCpuModule(compile_program(source, cache, racecheck), source, "k", args, [LaunchSpec(grid, block)],
                           thread_order=order)


IN_OUT = [ArgSpec("x", (32,), "float32", False), ArgSpec("y", (32,), "float32", True)]
X = np.arange(32, dtype=np.float32)


@pytest.mark.slow
def test_threads_exchange_through_shared_memory_after_a_barrier_and_read_nan_without_it(kernel_cache):
    """Each thread writes its element and reads its neighbour's: in any thread order with the
    barrier; without it, the threads run before their neighbours read shared memory unwritten."""
    body = """  __shared__ float t[32];
  t[threadIdx.x] = x[threadIdx.x];
  {barrier}
  y[threadIdx.x] = t[(threadIdx.x + 1) % 32];"""
    for order in (0, 1, 7):
        y = kernel(body.format(barrier="__syncthreads();"), IN_OUT, order=order, cache=kernel_cache)(X)
        np.testing.assert_array_equal(y, np.roll(X, -1))
    assert np.isnan(kernel(body.format(barrier=""), IN_OUT, order=1, cache=kernel_cache)(X)).any()


def test_gpu_arrays_are_refused_with_the_copy_that_makes_them_numpy_arrays():
    """The program runs on the CPU: a GPU array (here one as PyTorch and CuPy present it, at a
    made-up address) is named before anything runs."""
    class GpuArray:
        __cuda_array_interface__ = {"shape": (32,), "typestr": "<f4", "data": (0x7F0000000000, False),
                                    "strides": None, "version": 3}

        def __dlpack_device__(self):
            return (2, 0)

    module = CudaOnCpuModule("never-run", "", "k", IN_OUT, [LaunchSpec((1, 1, 1), (32, 1, 1))])
    with pytest.raises(TypeError, match=r"pass NumPy arrays .*x\.cpu\(\)\.numpy\(\)"):
        module(GpuArray())


@pytest.mark.parametrize("order", [0, pytest.param(1, marks=pytest.mark.slow)])
@pytest.mark.slow
def test_a_racecheck_names_a_missing_barrier_whatever_order_the_threads_run_in(order, kernel_cache):
    """Each thread but the first reads the element its left neighbour writes: in order, every
    neighbour has written first, and the values are right; under ThreadSanitizer the race is
    named all the same, with the statement it is in, and the kernel with its barrier passes."""
    body = """  __shared__ float t[32];
  t[threadIdx.x] = x[threadIdx.x];
  {barrier}
  y[threadIdx.x] = t[threadIdx.x > 0 ? threadIdx.x - 1 : 0];"""
    want = np.concatenate([X[:1], X[:-1]])
    if order == 0:
        np.testing.assert_array_equal(kernel(body.format(barrier=""), IN_OUT, order=0, cache=kernel_cache)(X), want)
    with pytest.raises(TilecraftError, match="ThreadSanitizer: data race") as race:
        kernel(body.format(barrier=""), IN_OUT, order=order, cache=kernel_cache, racecheck=True)(X)
    for named in ("at: t[threadIdx.x] = x[threadIdx.x];", "at: y[threadIdx.x] = t[", "Location is global 'k::t'"):
        assert named in str(race.value)
    np.testing.assert_array_equal(
        kernel(body.format(barrier="__syncthreads();"), IN_OUT, order=order, cache=kernel_cache, racecheck=True)(X),
        want)


@pytest.mark.slow  # two racecheck builds; the quick subset keeps the one within a block
@pytest.mark.parametrize("add", ["y[threadIdx.x] += x[threadIdx.x];", "atomicAdd(&y[threadIdx.x], x[threadIdx.x]);"],
                         ids=["plain", "atomic"])
def test_a_racecheck_names_blocks_that_add_into_one_output_without_atomics(add, kernel_cache):
    """Four blocks add x into one y, as a sum split across blocks (split-K) does. Run one block
    after another, the plain adds sum right too; on a GPU they race, and the racecheck names
    it across blocks as within one. The atomic adds pass."""
    y = np.zeros(32, np.float32)
    kernel(add, IN_OUT, grid=(4, 1, 1), cache=kernel_cache)(X, y)
    np.testing.assert_array_equal(y, 4 * X)
    checked = kernel(add, IN_OUT, grid=(4, 1, 1), cache=kernel_cache, racecheck=True)
    if add.startswith("atomic"):
        y[:] = 0
        checked(X, y)
        np.testing.assert_array_equal(y, 4 * X)
    else:
        with pytest.raises(TilecraftError, match=r"(?s)ThreadSanitizer: data race.*at: y\[threadIdx\.x\] \+="):
            checked(X, y)


def test_a_barrier_that_some_threads_never_reach_is_named(kernel_cache):
    run = kernel("  if (threadIdx.x < 16) __syncthreads();\n  y[threadIdx.x] = x[threadIdx.x];", IN_OUT,
                 cache=kernel_cache)
    with pytest.raises(TilecraftError, match=r"waits at __syncthreads\(\) for threads that never come"):
        run(X)


@pytest.mark.slow
def test_a_butterfly_of_shuffles_sums_a_warp_and_a_lane_outside_the_mask_is_named(kernel_cache):
    body = """  float v = x[threadIdx.x];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset, 32);
  y[threadIdx.x] = v;"""
    np.testing.assert_array_equal(kernel(body, IN_OUT, cache=kernel_cache)(X), np.full(32, X.sum()))
    with pytest.raises(TilecraftError, match="leaves out the calling lane"):
        kernel(body.replace("0xffffffffu", "0xffffu"), IN_OUT, cache=kernel_cache)(X)


@pytest.mark.slow
def test_a_read_past_an_argument_is_caught(kernel_cache):
    with pytest.raises(TilecraftError, match="heap-buffer-overflow"):
        kernel("  y[threadIdx.x] = x[threadIdx.x + 1];", IN_OUT, cache=kernel_cache)(X)


@pytest.mark.slow
def test_a_misaligned_vector_load_is_caught(kernel_cache):
    body = "  if (threadIdx.x == 0) { float4 v = *(const float4*)&x[2]; y[0] = v.x; }"
    with pytest.raises(TilecraftError, match="misaligned address"):
        kernel(body, IN_OUT, cache=kernel_cache)(X)


@pytest.mark.slow
def test_an_async_copy_lands_only_when_a_wait_requires_it(kernel_cache):
    body = """  __shared__ __align__(16) float t[32];
  TC_CP_ASYNC(ca, 4, &t[threadIdx.x], &x[threadIdx.x]);
  TC_CP_ASYNC_WAIT({pending});
  __syncthreads();
  y[threadIdx.x] = t[31 - threadIdx.x];"""
    np.testing.assert_array_equal(kernel(body.format(pending=0), IN_OUT, cache=kernel_cache)(X), X[::-1])
    assert np.isnan(kernel(body.format(pending=1), IN_OUT, cache=kernel_cache)(X)).all()


WMMA_ARGS = [ArgSpec("a", (16, 16), "float16", False), ArgSpec("b", (16, 16), "float16", False),
             ArgSpec("c", (16, 16), "float32", True)]
WMMA = """  unsigned fa[8], fb[8]; float fc[8];
  for (int e = 0; e < 8; ++e) fc[e] = 0.0f;
  tc_wmma_load_a_{a}(fa, a, 16); tc_wmma_load_b_row(fb, b, 16);
  tc_wmma_mma_{mma}_row(fc, fa, fb);
  tc_wmma_store_f32_col(c, fc, 16);"""


@pytest.mark.slow
def test_a_warps_tensor_core_product_is_numpys_and_an_operand_loaded_in_another_layout_is_named(kernel_cache):
    """A loaded column major reads A's transpose; the store column major writes C's."""
    a, b = (np.random.default_rng(n).standard_normal((16, 16)).astype(np.float16) for n in (0, 1))
    c = kernel(WMMA.format(a="col", mma="col"), WMMA_ARGS, cache=kernel_cache)(a, b)
    np.testing.assert_allclose(c, (a.T.astype(np.float32) @ b.astype(np.float32)).T, rtol=1e-5, atol=1e-5)
    with pytest.raises(TilecraftError, match="wmma.mma takes A as row-major f16, but its fragment"):
        kernel(WMMA.format(a="col", mma="row"), WMMA_ARGS, cache=kernel_cache)(a, b)
    with pytest.raises(TilecraftError, match="not 32-byte aligned"):
        kernel(WMMA.format(a="col", mma="col").replace("fa, a, 16", "fa, a + 8, 16"), WMMA_ARGS,
               cache=kernel_cache)(a, b)
