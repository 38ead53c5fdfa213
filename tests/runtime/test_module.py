import ctypes

import numpy as np
import pytest

from tilecraft.errors import BuildError
from tilecraft.runtime import ArgSpec, Module, PackSpec, ProfileResult, aligned_empty, compile_c
from tilecraft.runtime.plan import NativePlan, compile_plan_runner
from tilecraft.target import Target

N = 1000
SOURCE = """
#include <stdbool.h>
#include <stdint.h>

int pack_calls = 0;

void add(const float* restrict a, const float* restrict b, float* restrict c) {
    for (int i = 0; i < 1000; ++i) c[i] = a[i] + b[i];
}

void divmod7(const int32_t* restrict a, int32_t* restrict q, int32_t* restrict r) {
    for (int i = 0; i < 10; ++i) { q[i] = a[i] / 7; r[i] = a[i] % 7; }
}

/* y[j] = sum_i x[i] * w[i][j], with w (4, 3) packed transposed into wt (3, 4). */
void pack_w(const float* restrict w, float* restrict wt) {
    ++pack_calls;
    for (int i = 0; i < 4; ++i) for (int j = 0; j < 3; ++j) wt[j * 4 + i] = w[i * 3 + j];
}

void matvec(const float* restrict x, const float* restrict wt, float* restrict y) {
    for (int j = 0; j < 3; ++j) {
        float acc = 0.0f;
        for (int i = 0; i < 4; ++i) acc += x[i] * wt[j * 4 + i];
        y[j] = acc;
    }
}
"""
COPY_TYPES = {"bool": "bool", "int8": "int8_t", "uint8": "uint8_t", "int32": "int32_t", "int64": "int64_t",
              "float16": "_Float16", "float32": "float", "float64": "double"}
COPY_SOURCE = "#include <stdbool.h>\n#include <stdint.h>\n" + "".join(
    f"void copy_{name}(const {c}* restrict a, {c}* restrict b) {{ for (int i = 0; i < 5; ++i) b[i] = a[i]; }}\n"
    for name, c in COPY_TYPES.items())


@pytest.fixture(scope="module")
def lib_path(tmp_path_factory):
    return compile_c(SOURCE, Target.host(), cache_dir=tmp_path_factory.mktemp("kernels"))


@pytest.fixture
def add(lib_path):
    args = (ArgSpec("a", (N,), "float32", False), ArgSpec("b", (N,), "float32", False),
            ArgSpec("c", (N,), "float32", True))
    return Module(lib_path, SOURCE, "add", args)


@pytest.fixture
def matvec(lib_path):
    args = (ArgSpec("x", (4,), "float32", False), ArgSpec("w", (4, 3), "float32", False),
            ArgSpec("y", (3,), "float32", True))
    module = Module(lib_path, SOURCE, "matvec", args, packs=(PackSpec(1, "pack_w", (3, 4)),))
    ctypes.c_int.in_dll(ctypes.CDLL(str(lib_path)), "pack_calls").value = 0
    return module


def pack_calls(module):
    return ctypes.c_int.in_dll(ctypes.CDLL(str(module.lib_path)), "pack_calls").value


def inputs():
    rng = np.random.default_rng(0)
    return rng.standard_normal(N, dtype=np.float32), rng.standard_normal(N, dtype=np.float32)


def test_module_exposes_its_source_entry_args_and_library(add, lib_path):
    assert (add.source, add.entry_name, add.lib_path) == (SOURCE, "add", lib_path)
    assert [arg.name for arg in add.args] == ["a", "b", "c"]


def test_all_arguments_given_runs_in_place_and_returns_none(add):
    a, b = inputs()
    c = np.zeros(N, dtype=np.float32)
    assert add(a, b, c) is None
    np.testing.assert_array_equal(c, a + b)


def test_outputs_are_allocated_when_only_inputs_given(add):
    a, b = inputs()
    c = add(a, b)
    assert isinstance(c, np.ndarray) and c.dtype == np.float32
    np.testing.assert_array_equal(c, a + b)


def test_out_keyword_receives_the_output(add):
    a, b = inputs()
    c = np.zeros(N, dtype=np.float32)
    assert add(a, b, out=c) is c
    np.testing.assert_array_equal(c, a + b)


def test_two_outputs_are_returned_as_a_tuple(lib_path):
    args = (ArgSpec("a", (10,), "int32", False), ArgSpec("q", (10,), "int32", True),
            ArgSpec("r", (10,), "int32", True))
    module = Module(lib_path, SOURCE, "divmod7", args)
    a = np.arange(10, 20, dtype=np.int32)
    q, r = module(a)
    np.testing.assert_array_equal(q, a // 7)
    np.testing.assert_array_equal(r, a % 7)


@pytest.mark.parametrize("dtype", list(COPY_TYPES))
def test_every_dtype_passes_through(tmp_path, dtype):
    lib = compile_c(COPY_SOURCE, Target.host(), cache_dir=tmp_path.parent / "copies")
    module = Module(lib, COPY_SOURCE, f"copy_{dtype}", (ArgSpec("a", (5,), dtype, False),
                                                         ArgSpec("b", (5,), dtype, True)))
    a = np.array([0, 1, 0, 1, 1]).astype(dtype)
    np.testing.assert_array_equal(module(a), a)


def test_wrong_argument_count_names_the_expected_arguments(add):
    with pytest.raises(TypeError, match=r"inputs \(a, b\).*all its arguments \(a, b, c\).*got 1"):
        add(np.zeros(N, dtype=np.float32))


def test_wrong_dtype_names_the_argument_and_expected_dtype(add):
    a, _ = inputs()
    with pytest.raises(ValueError, match=r"'b' has dtype float64, expected float32.*np.ascontiguousarray"):
        add(a, np.zeros(N))


def test_wrong_shape_names_the_argument_and_expected_shape(add):
    a, b = inputs()
    with pytest.raises(ValueError, match=r"output 'c' has shape \(999,\), expected \(1000,\)"):
        add(a, b, np.zeros(N - 1, dtype=np.float32))


def test_non_contiguous_input_is_rejected_with_the_fix(add):
    a, _ = inputs()
    strided = np.zeros(2 * N, dtype=np.float32)[::2]
    with pytest.raises(ValueError, match=r"'b' is not C-contiguous.*np.ascontiguousarray"):
        add(a, strided)


def test_read_only_output_is_rejected(add):
    a, b = inputs()
    c = np.zeros(N, dtype=np.float32)
    c.flags.writeable = False
    with pytest.raises(ValueError, match="output 'c' is read-only"):
        add(a, b, c)


def test_read_only_and_memory_mapped_inputs_are_read(add, tmp_path):
    a, b = inputs()
    a.flags.writeable = False
    mapped = np.lib.format.open_memmap(tmp_path / "b.npy", mode="w+", dtype=np.float32, shape=(N,))
    mapped[:] = b
    np.testing.assert_array_equal(add(a, mapped), a + b)
    np.testing.assert_array_equal(add(np.frombuffer(a.tobytes(), np.float32), b), a + b)


def test_empty_arguments_pass_the_checks(tmp_path):
    source = "void nothing(const float* a, float* b) { (void)a; (void)b; }"
    lib = compile_c(source, Target.host(), cache_dir=tmp_path)
    module = Module(lib, source, "nothing", (ArgSpec("a", (0, 3), "float32", False),
                                             ArgSpec("b", (3, 0), "float32", True)))
    assert module(np.empty((0, 3), np.float32)).shape == (3, 0)
    out = np.empty((3, 0), np.float32)
    assert module(np.empty((0, 3), np.float32), out=out) is out


def test_python_list_gives_a_clear_type_error(add):
    a, _ = inputs()
    with pytest.raises(TypeError, match=r"input 'b' must be a numpy.ndarray, not list"):
        add(a, [0.0] * N)


def test_output_overlapping_an_input_is_rejected(add):
    a, b = inputs()
    with pytest.raises(ValueError, match="output 'c' overlaps argument 'a'"):
        add(a, b, a)
    both = np.zeros(2 * N, dtype=np.float32)
    with pytest.raises(ValueError, match="output 'c' overlaps argument 'b'"):
        add(a, both[N // 2:3 * N // 2], out=both[:N])
    add(a, both[N:], out=both[:N])  # side by side, apart
    np.testing.assert_array_equal(both[:N], a)


def test_packed_argument_is_packed_before_the_kernel(matvec):
    x = np.arange(4, dtype=np.float32)
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_allclose(matvec(x, w), x @ w)
    assert pack_calls(matvec) == 1


def test_packed_weights_are_packed_once_when_bound(matvec):
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    bound = matvec.bind_weights(w=w)
    for k in range(3):
        x = np.full(4, k, dtype=np.float32)
        np.testing.assert_allclose(bound(x), x @ w)
    y = np.empty(3, dtype=np.float32)
    bound(np.ones(4, dtype=np.float32), y)
    np.testing.assert_allclose(y, np.ones(4) @ w)
    assert pack_calls(matvec) == 1


def test_plan_calls_use_weights_bound_once_and_pack_an_unbound_input_at_every_run(matvec, tmp_path):
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    x, y = np.zeros(4, dtype=np.float32), np.empty(3, dtype=np.float32)
    runner = compile_plan_runner(3, Target.host(), tmp_path)
    bound = matvec.bind_weights(w=w)
    packs = pack_calls(matvec)
    calls, buffers = bound.plan_calls([x.ctypes.data, "y"])
    plan = NativePlan(calls, runner, keep=[bound])
    assert len(plan) == 1 and buffers == [] and plan.slots == ("y",)
    for k in range(2):
        x[:] = k
        plan.run({"y": y})
        np.testing.assert_allclose(y, x @ w)
    assert pack_calls(matvec) == packs  # packed once, by bind_weights
    calls, buffers = matvec.plan_calls(["x", w.ctypes.data, y.ctypes.data])
    assert len(calls) == 2 and [b.shape for b in buffers] == [(3, 4)]  # the pack, then the entry
    NativePlan(calls, runner, keep=buffers).run({"x": np.ones(4, dtype=np.float32)})
    np.testing.assert_allclose(y, np.ones(4) @ w)
    assert pack_calls(matvec) == packs + 1
    with pytest.raises(TypeError, match=r"2 argument\(s\) for the 3 not bound \(x, w, y\)"):
        matvec.plan_calls(["x", "y"])


@pytest.mark.parametrize("shape, dtype", [((3,), "float16"), ((1000, 7), "float32"), ((1 << 20,), "float64"),
                                          ((5,), "int8")])
def test_aligned_empty_starts_on_a_cache_line(shape, dtype):
    array = aligned_empty(shape, dtype)
    assert array.shape == shape and array.dtype == np.dtype(dtype) and array.flags.c_contiguous
    assert array.ctypes.data % 64 == 0


def test_allocated_outputs_and_packed_weights_start_on_a_cache_line(matvec):
    bound = matvec.bind_weights(w=np.ones((4, 3), dtype=np.float32))
    assert all(packed.ctypes.data % 64 == 0 for packed in bound._bound.values())
    assert bound(np.ones(4, dtype=np.float32)).ctypes.data % 64 == 0


def test_bound_weights_are_a_snapshot(matvec):
    w = np.ones((4, 3), dtype=np.float32)
    bound = matvec.bind_weights(w=w)
    w[:] = 5
    np.testing.assert_allclose(bound(np.ones(4, dtype=np.float32)), [4, 4, 4])


def test_binding_an_unknown_name_lists_the_bindable_inputs(matvec):
    with pytest.raises(TypeError, match=r"cannot bind 'y'.*\['x', 'w'\]"):
        matvec.bind_weights(y=np.zeros(3, dtype=np.float32))


def test_binding_checks_the_weights(matvec):
    with pytest.raises(ValueError, match="'w' has shape"):
        matvec.bind_weights(w=np.zeros((3, 4), dtype=np.float32))


def test_time_evaluator_returns_positive_times(add):
    a, b = inputs()
    result = add.time_evaluator(number=5, repeat=3)(a, b)
    assert isinstance(result, ProfileResult)
    assert len(result.results) == 3 and all(t > 0 for t in result.results)


def test_time_evaluator_honours_min_repeat_ms(add):
    a, b = inputs()
    result = add.time_evaluator(number=1, repeat=1, min_repeat_ms=20)(a, b)
    assert 0 < result.mean < 1e-3  # per call, over the many calls that filled 20 ms


def test_time_evaluator_packs_once_and_times_only_the_kernel(matvec):
    x, w = np.ones(4, dtype=np.float32), np.ones((4, 3), dtype=np.float32)
    result = matvec.time_evaluator(number=4, repeat=2)(x, w)
    assert len(result.results) == 2 and pack_calls(matvec) == 1
    matvec.bind_weights(w=w).time_evaluator(number=4, repeat=2)(x)
    assert pack_calls(matvec) == 2


@pytest.mark.slow
def test_time_evaluator_with_cache_flush(add):
    a, b = inputs()
    result = add.time_evaluator(number=2, repeat=2, enable_cpu_cache_flush=True)(a, b)
    # A flush writes twice the L3 (tens of ms at least); a call of this kernel takes microseconds, so
    # 10 ms leaves room for a busy machine and still fails if a flush were counted.
    assert all(0 < t < 1e-2 for t in result.results)


def test_missing_entry_raises_build_error(lib_path):
    with pytest.raises(BuildError, match="no function 'nope'"):
        Module(lib_path, SOURCE, "nope", (ArgSpec("a", (1,), "float32", True),))


def test_unknown_dtype_is_rejected():
    with pytest.raises(ValueError, match="complex64"):
        ArgSpec("a", (1,), "complex64", False)


def test_time_evaluator_evicts_the_weights_alone_before_every_timed_call(matvec, monkeypatch):
    evictions = []
    monkeypatch.setattr("tilecraft.runtime.module.weight_evictor",
                        lambda buffers: lambda: evictions.append(sorted(b.shape for b in buffers)))
    x, w = np.ones(4, dtype=np.float32), np.ones((4, 3), dtype=np.float32)
    matvec.time_evaluator(number=4, repeat=2, evict_weights=True)(x, w)
    assert evictions == [[(3, 4)]] * 8  # the weights packed for the timing, never x; not before the warm-up
    evictions.clear()
    matvec.bind_weights(w=w).time_evaluator(number=3, repeat=1, evict_weights=True)(x)
    assert evictions == [[(3, 4)]] * 3  # the bound, packed weights
    with pytest.raises(ValueError, match="one of enable_cpu_cache_flush and evict_weights"):
        matvec.time_evaluator(enable_cpu_cache_flush=True, evict_weights=True)
