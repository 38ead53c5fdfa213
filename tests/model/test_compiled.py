"""compile_model: whole models against onnxruntime, tuning records used where the log has them, a warning
listing the rest, checked inputs, and save / load_model without the model, the log or the kernel cache."""

import dataclasses
import json
import shutil
import warnings

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.graph import run_reference
from tilecraft.graph.builder import GraphBuilder
from tilecraft.graph.ir import Value
from tilecraft.model.compiled import (CompiledModel, DefaultScheduleWarning, ModelInputError, ModelLoadError,
                                      example_inputs)
from tilecraft.runtime import Module
from tilecraft.search.default import default_schedule
from tilecraft.te.dtype import NUMPY_DTYPES

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx_models import tiny_cnn, tiny_transformer  # noqa: E402

TARGET = tc.Target.host()


def compile_quietly(model, target=TARGET, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        return tc.compile_model(model, target, **kw)


def two_output_graph():
    """x -> relu -> (y1, reshape of y1 = y2): two outputs, one of them a view."""
    g = GraphBuilder()
    y1 = g.emit("relu", [g.add_input("x", (2, 8), "float32")], {}, "relu", output="y1")
    y2 = g.emit("reshape", [y1], {"newshape": (16,)}, "flat", output="y2")
    return g.finish([y1, y2])


def test_several_outputs_come_as_a_tuple_or_a_dict_and_are_new_arrays(kernel_cache):
    model = compile_quietly(two_output_graph(), cache_dir=kernel_cache)
    x = np.random.default_rng(0).standard_normal((2, 8)).astype("float32")
    y1, y2 = model(x=x)
    np.testing.assert_array_equal(y1, np.maximum(x, 0))
    np.testing.assert_array_equal(y2, np.maximum(x, 0).reshape(16))
    assert not np.may_share_memory(y1, y2)
    again = model.run({"x": -x})
    assert set(again) == {"y1", "y2"} and np.array_equal(y1, np.maximum(x, 0))  # the first results are kept


def test_a_subgraph_without_a_default_schedule_gets_naive_loops_and_the_warning_says_so(monkeypatch, kernel_cache):
    import tilecraft.model.compiled

    def no_schedule(dag, target):
        raise tc.ScheduleError("no sketch gave a default schedule")

    monkeypatch.setattr(tilecraft.model.compiled, "default_schedule", no_schedule)
    with pytest.warns(DefaultScheduleWarning, match=r"relu 2x8  [0-9.]+% of the FLOPs  no log given; no default "
                                                    r"schedule either "
                                                    r"\(no sketch gave a default schedule\): naive loops"):
        model = tc.compile_model(two_output_graph(), TARGET, cache_dir=kernel_cache)
    x = np.random.default_rng(0).standard_normal((2, 8)).astype("float32")
    np.testing.assert_array_equal(model(x=x)[0], np.maximum(x, 0))


@pytest.mark.slow
def test_profile_times_each_kernel_over_all_its_calls_most_expensive_first(kernel_cache):
    g = GraphBuilder()
    x = g.add_input("x", (64, 64), "float32")
    for n in range(2):  # one kernel, called twice
        x = g.emit("matmul", [x, g.add_constant(f"w{n}", np.ones((64, 64), "float32"))], {}, f"mm{n}")
    out = g.emit("softmax", [x], {"axis": -1}, "softmax")
    model = compile_quietly(g.finish([out]), cache_dir=kernel_cache)
    times = model.profile({"x": np.ones((64, 64), "float32")}, rounds=3)
    assert sorted((t.desc.split()[0], t.calls) for t in times) == [("matmul", 2), ("softmax", 1)]
    assert all(t.seconds > 0 for t in times) and times[0].seconds >= times[1].seconds
    assert {t.workload_key for t in times} == {k.workload_key for k in model.kernels}
    with pytest.raises(ValueError, match="rounds=0"):
        model.profile({"x": np.ones((64, 64), "float32")}, rounds=0)


def test_inputs_are_checked_by_name_shape_and_dtype(kernel_cache):
    model = compile_quietly(two_output_graph(), cache_dir=kernel_cache)
    with pytest.raises(ModelInputError, match=r"missing input\(s\) \['x'\] and unknown input\(s\) \['z'\]; "
                                              r"the model takes x: float32\[2, 8\]"):
        model(z=np.zeros((2, 8), "float32"))
    with pytest.raises(ModelInputError, match=r"input x must be a numpy array float32\[2, 8\] but got float64\[2, 8\]"):
        model(x=np.zeros((2, 8)))
    with pytest.raises(ModelInputError, match=r"but got float32\[8, 2\]; pass np.asarray"):
        model(x=np.zeros((8, 2), "float32"))
    np.testing.assert_array_equal(model(x=np.ones((8, 2), "float32").T)[0], np.ones((2, 8)))  # any strides


MODELS = {"cnn": tiny_cnn, "transformer": tiny_transformer}


def onnxruntime_output(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})[0]


def model_input(model):
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(1).standard_normal(shape).astype("float32")


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n == "cnn" else pytest.mark.slow)
                                  for n in sorted(MODELS)])
def test_default_schedules_match_onnxruntime_and_every_kernel_is_listed_as_untuned(name, kernel_cache):
    model = MODELS[name]()
    x = model_input(model)
    with pytest.warns(DefaultScheduleWarning) as caught:
        compiled = tc.compile_model(model, TARGET, cache_dir=kernel_cache)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"{len(compiled.kernels)} of {len(compiled.kernels)} kernels, 100% of the model's FLOPs, have the " \
           "default schedule" in message and "no log given" in message
    untuned = compiled.untuned  # every kernel, the largest share of the work first, the shares adding up
    assert sorted(u.desc for u in untuned) == sorted(k.desc for k in compiled.kernels)
    assert [u.flop_share for u in untuned] == sorted((u.flop_share for u in untuned), reverse=True)
    assert sum(u.flop_share for u in untuned) == pytest.approx(1.0)
    assert all(f"{u.desc}  " in message for u in untuned[:5]) and all(f"{u.desc}  " not in message
                                                                       for u in untuned[5:])
    assert ("model.untuned lists them all" in message) == (len(untuned) > 5)
    copies = [k.desc for k in compiled.kernels if k.desc.startswith(("transpose", "strided"))]
    if name == "transformer":  # of attention's copies the keys' transpose alone is left: the rest are strided views
        assert copies == ["transpose 1x2x8x4"]
    expected = onnxruntime_output(model, x)
    first = compiled(input=x)
    np.testing.assert_allclose(first, expected, rtol=1e-3, atol=1e-4)
    np.testing.assert_array_equal(compiled(input=x), first)  # the shared buffers are reused, the result is the same
    np.testing.assert_allclose(first, run_reference(tc.frontend.from_onnx(model), {"input": x})["output"],
                               rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def tuned_log(tmp_path_factory, kernel_cache):
    """A log with 4 measured schedules of the CNN's last task (dense + bias)."""
    log = tmp_path_factory.mktemp("tuned") / "cnn.json"
    tasks, weights = tc.extract_tasks(tiny_cnn(), TARGET)
    task = next(t for t in tasks if t.desc.startswith("dense+add"))
    with tc.LocalRunner(number=2, repeat=1, min_repeat_ms=0) as runner:
        task.tune(tc.TuningOptions(num_measure_trials=4, num_measures_per_round=4, verbose=0, runner=runner,
                                   builder=tc.LocalBuilder(cache_dir=kernel_cache),
                                   measure_callbacks=[tc.RecordToFile(log)]))
    return log, task


@pytest.mark.slow  # its tuned_log tunes a task for seconds
def test_a_record_of_the_log_is_used_and_only_the_other_kernels_are_listed(tuned_log, kernel_cache):
    log, task = tuned_log
    best = tc.load_best_record(log, task.workload_key, TARGET)
    model = tiny_cnn()
    with pytest.warns(DefaultScheduleWarning) as caught:
        compiled = tc.compile_model(model, TARGET, log=log, cache_dir=kernel_cache)
    (tuned,) = [k for k in compiled.kernels if k.tuned]
    assert tuned.workload_key == task.workload_key
    assert tc.Trace.from_json(tuned.trace) == tc.Trace.from_json(best.trace)
    message = str(caught[0].message)
    assert f"{len(compiled.kernels) - 1} of {len(compiled.kernels)} kernels, " in message
    assert task.desc not in [u.desc for u in compiled.untuned]
    assert task.desc not in message and f"no record in {log}" in message
    x = model_input(model)
    np.testing.assert_allclose(compiled(input=x), onnxruntime_output(model, x), rtol=1e-3, atol=1e-4)


@pytest.mark.slow
def test_of_several_logs_the_first_with_a_record_for_a_kernel_gives_its_schedule(tuned_log, tmp_path,
                                                                                 kernel_cache):
    log, task = tuned_log
    best = tc.load_best_record(log, task.workload_key)
    records = [r for r in tc.load_records(log, task.workload_key) if r.is_valid and r.trace_json != best.trace_json]
    slowest = max(records, key=lambda r: r.mean_cost)
    flushed = tmp_path / "flushed.json"  # say, measured with another protocol: its costs are not compared
    flushed.write_text(slowest.to_json_line() + "\n")
    for logs, expected in (([flushed, log], slowest), ([log, flushed], tc.load_best_record(log, task.workload_key))):
        with pytest.warns(DefaultScheduleWarning) as caught:
            compiled = tc.compile_model(tiny_cnn(), TARGET, log=logs, cache_dir=kernel_cache)
        (tuned,) = [k for k in compiled.kernels if k.tuned]
        assert tc.Trace.from_json(tuned.trace) == tc.Trace.from_json(expected.trace)
        assert f"no record in {logs[0]}, {logs[1]}" in str(caught[0].message)
    with pytest.raises(FileNotFoundError, match="the tuning log nowhere.json does not exist"):
        tc.compile_model(tiny_cnn(), TARGET, log=[log, "nowhere.json"])


@pytest.mark.slow
def test_a_record_that_does_not_replay_falls_back_with_the_reason(tuned_log, tmp_path, kernel_cache):
    log, task = tuned_log
    best = tc.load_best_record(log, task.workload_key, TARGET)
    other = next(t for t in tc.extract_tasks(tiny_cnn(), TARGET)[0] if t.workload_key != task.workload_key)
    wrong = dataclasses.replace(best, trace_json=default_schedule(other.compute_dag, TARGET).trace.dumps(),
                                costs=(best.cost / 10,))  # the best by the rule: a re-measured one's median
    broken = tmp_path / "broken.json"
    broken.write_text(log.read_text() + wrong.to_json_line() + "\n")
    with pytest.warns(DefaultScheduleWarning,
                      match=r"dense\+add 1x10 +[0-9.]+% of the FLOPs +the record failed to replay: "):
        compiled = tc.compile_model(tiny_cnn(), TARGET, log=broken, cache_dir=kernel_cache)
    assert not any(k.tuned for k in compiled.kernels)


def test_a_log_that_does_not_exist_is_an_error():
    with pytest.raises(FileNotFoundError, match="the tuning log nowhere.json does not exist"):
        tc.compile_model(tiny_cnn(), TARGET, log="nowhere.json")


@pytest.mark.slow
def test_save_and_load_give_the_same_outputs_without_the_kernel_cache(tmp_path):
    model = tiny_cnn()
    cache = tmp_path / "cache"
    compiled = compile_quietly(model, cache_dir=cache)
    compiled.save(tmp_path / "saved")
    shutil.rmtree(cache)
    loaded = tc.load_model(tmp_path / "saved")
    x = model_input(model)
    np.testing.assert_array_equal(loaded(input=x), compiled(input=x))
    assert [(k.desc, k.tuned, k.trace) for k in loaded.kernels] == [(k.desc, k.tuned, k.trace)
                                                                   for k in compiled.kernels]
    assert repr(loaded) == repr(compiled)


@pytest.mark.slow
def test_a_bfloat16_model_saved_and_loaded_computes_the_same_bits(tmp_path):
    """Its bfloat16 weights go to .npy as raw pairs of bytes and come back as bfloat16."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.add_input("x", (4, 32), "bfloat16")
    bias = b.add_constant("bias", rng.standard_normal(32).astype(NUMPY_DTYPES["bfloat16"]))
    w = b.add_constant("w", rng.standard_normal((8, 32)).astype(NUMPY_DTYPES["bfloat16"]))
    graph = b.finish([b.emit("dense", [b.emit("add", [x, bias], {}, "biased"), w], {}, "fc")])
    compiled = compile_quietly(graph, cache_dir=tmp_path / "cache")
    compiled.save(tmp_path / "saved")
    assert "bfloat16" in {str(weight.dtype) for weight in compiled.constants.values()}
    loaded = tc.load_model(tmp_path / "saved")
    feeds = {"x": rng.standard_normal((4, 32)).astype(NUMPY_DTYPES["bfloat16"])}
    (name,) = graph.outputs
    got, want = loaded.run(feeds)[name], compiled.run(feeds)[name]
    assert got.dtype == want.dtype == NUMPY_DTYPES["bfloat16"] and got.tobytes() == want.tobytes()


@pytest.fixture
def saved(tmp_path, kernel_cache):
    compile_quietly(tiny_cnn(), cache_dir=kernel_cache).save(tmp_path / "saved")
    return tmp_path / "saved"


def test_a_missing_or_corrupt_file_is_named(saved):
    plan = json.loads((saved / "model.json").read_text())
    (saved / plan["weights"]["w2_nhwc"]).unlink()
    with pytest.raises(ModelLoadError, match=r"cannot read the weight w2_nhwc from .*weights/\d+.npy"):
        tc.load_model(saved)
    (saved / "kernel_0.so").write_bytes(b"not a library")
    plan["weights"].pop("w2_nhwc")
    (saved / "model.json").write_text(json.dumps(plan))
    with pytest.raises(ModelLoadError, match=r"cannot load the kernel transpose 1x8x8x3 from .*kernel_0.so"):
        tc.load_model(saved)
    (saved / "model.json").write_text("{")
    with pytest.raises(ModelLoadError, match=r"model.json is corrupt \(JSONDecodeError"):
        tc.load_model(saved)
    with pytest.raises(ModelLoadError, match=r"model.json does not exist: .* is not a saved model"):
        tc.load_model(saved / "weights")


def test_a_plan_whose_values_do_not_fit_its_kernels_is_refused_naming_both(saved):
    plan = json.loads((saved / "model.json").read_text())
    name, kernel = plan["steps"][0][2][0], plan["kernels"][plan["steps"][0][0]]
    plan["values"][name][0] = [n + 1 for n in plan["values"][name][0]]
    (saved / "model.json").write_text(json.dumps(plan))
    with pytest.raises(ModelLoadError, match=rf"corrupt \(ValueError: kernel {kernel['desc']} takes .* but is given "
                                             rf"{name}: float32"):
        tc.load_model(saved)


def test_a_corrupt_runner_is_named(saved):
    (saved / "runner.so").write_bytes(b"not a library")
    with pytest.raises(ModelLoadError, match=r"cannot load the runner of the kernels from .*runner.so"):
        tc.load_model(saved)


def test_buffers_are_shared_once_every_reader_has_run_and_a_view_keeps_its_source_alive():
    from tilecraft.model.compiled import Step, plan_buffers
    from tilecraft.graph.ir import Value

    values = {name: Value(name, (8,), "float32") for name in "xabcd"} | {"v": Value("v", (2, 4), "float32")}
    chain = [Step(0, ("x",), ("a",)), Step(None, ("a",), ("v",)), Step(0, ("v",), ("b",)), Step(0, ("b",), ("c",)),
             Step(0, ("c",), ("d",))]
    buffers = plan_buffers(chain, values, per_call={"d"})
    assert set(buffers) == {"a", "b", "c"} and all(b.ctypes.data % 64 == 0 for b in buffers.values())
    assert np.shares_memory(buffers["c"], buffers["a"]) and not np.shares_memory(buffers["b"], buffers["a"])
    chain[3] = Step(0, ("b", "v"), ("c",))  # the view is read later: its source stays alive
    buffers = plan_buffers(chain, values, per_call={"d"})
    assert not any(np.shares_memory(buffers["c"], buffers[name]) for name in "ab")
    chain[3] = Step(0, ("b",), ("c",))  # the view is an output, read when the call returns: never reused
    buffers = plan_buffers(chain, values, per_call={"d", "v"})
    assert not any(np.shares_memory(buffers["a"], buffers[name]) for name in "bc")


def test_an_output_that_is_a_view_is_not_overwritten_by_a_later_kernel(kernel_cache):
    g = GraphBuilder()
    y = g.emit("reshape", [g.emit("relu", [g.add_input("x", (2, 8), "float32")], {}, "relu")], {"newshape": (16,)},
               "flat", output="y")
    w = g.emit("reshape", [g.emit("sigmoid", [g.add_input("z", (16,), "float32")], {}, "sigmoid")],
               {"newshape": (4, 4)}, "square", output="w")
    model = compile_quietly(g.finish([y, w]), cache_dir=kernel_cache)
    x, z = np.arange(-8, 8, dtype="float32").reshape(2, 8), np.zeros(16, "float32")
    y, w = model(x=x, z=z)
    np.testing.assert_array_equal(y, np.maximum(x, 0).reshape(16))
    np.testing.assert_array_equal(w, np.full((4, 4), 0.5))


def branches_into_concat(axis=1, also_read=False, concat_is_output=False):
    """x -> three dense+relu branches -> concat -> dense: the branches can write the
    concatenation in place (its kernel then goes); ``also_read``: the first branch is read
    by the head as well, so it cannot."""
    rng = np.random.default_rng(0)
    g = GraphBuilder()
    x = g.add_input("x", (6, 8), "float32")
    branches = [g.emit("relu", [g.emit("dense", [x, g.add_constant(f"w{k}", rng.standard_normal((n, 8))
                                                                    .astype("float32"))], {}, f"dense{k}")], {},
                       f"relu{k}") for k, n in enumerate((8, 16, 4))]
    if axis == 0:
        branches = [g.emit("transpose", [b], {"axes": (1, 0)}, f"t{k}") for k, b in enumerate(branches)]
    cat = g.emit("concat", branches, {"axis": axis}, "cat", output="cat" if concat_is_output else None)
    flat = g.emit("reshape", [cat], {"newshape": (1, 168)}, "flat")
    head = g.emit("dense", [flat, g.add_constant("wy", rng.standard_normal((5, 168)).astype("float32"))], {}, "head")
    if also_read:
        head = g.emit("concat", [head, g.emit("reshape", [branches[0]], {"newshape": (1, 48)}, "again")],
                      {"axis": 1}, "both")
    return g.finish([head, cat] if concat_is_output else [head])


@pytest.mark.parametrize("kw", [{}, pytest.param({"axis": 0}, marks=pytest.mark.slow), {"concat_is_output": True},
                                pytest.param({"also_read": True}, marks=pytest.mark.slow)],
                         ids=["columns", "rows", "output", "read-elsewhere"])
def test_a_concatenation_is_written_in_place_by_its_producers_where_nothing_else_reads_them(kw, tmp_path,
                                                                                             kernel_cache):
    graph = branches_into_concat(**kw)
    model = compile_quietly(graph, cache_dir=kernel_cache)
    copies = [k.desc for k in model.kernels if k.desc.startswith("concat")]
    assert len(copies) == (2 if kw.get("also_read") else 0), copies  # read elsewhere: both copies stay
    tasks, _ = tc.extract_tasks(graph, TARGET)  # the tasks to tune are the kernels the model runs
    assert sorted(t.desc for t in tasks) == sorted({k.desc for k in model.kernels})
    runs_like_the_reference(model, graph, tmp_path)


def attention_heads(step=1, slice_is_output=False, keys_transposed=False):
    """x -> one projection to queries, keys and values (6 x 3 x 8) -> transposed to 3 x 6 x 8 ->
    split along its first axis (three strided slices, each reshaped to 6 x 8, or 3 x 8 with
    ``step`` 2 on the sixes) -> softmax(q kᵀ) v: the kernels after the split can read q, k and
    v where they lie in the projection (the transpose's and the slices' kernels then go);
    ``slice_is_output``: the model returns k, which then is an array of its own;
    ``keys_transposed``: q kᵀ is a matmul of q and a transpose of k, not a dense layer."""
    rng = np.random.default_rng(0)
    g = GraphBuilder()
    x = g.add_input("x", (6, 8), "float32")
    qkv = g.emit("dense", [x, g.add_constant("w", rng.standard_normal((24, 8)).astype("float32"))], {}, "qkv")
    heads = g.emit("transpose", [g.emit("reshape", [qkv], {"newshape": (6, 3, 8)}, "split_heads")],
                   {"axes": (1, 0, 2)}, "heads")
    q, k, v = (g.emit("reshape", [g.emit("strided_slice", [heads], {"begin": (n, 0), "end": (n + 1, 6), "strides": (
        1, step), "axes": (0, 1)}, name, output=name if slice_is_output and name == "k" else None)],
        {"newshape": (6 // step, 8)}, f"{name}_rows") for n, name in enumerate("qkv"))
    scores = g.emit("matmul", [q, g.emit("transpose", [k], {"axes": (1, 0)}, "keys")], {}, "scores") \
        if keys_transposed else g.emit("dense", [q, k], {}, "scores")
    scores = g.emit("softmax", [scores], {"axis": -1}, "weights")
    out = g.emit("matmul", [scores, v], {}, "attended")
    return g.finish([out, "k"] if slice_is_output else [out])


@pytest.mark.parametrize("kw", [{}, pytest.param({"step": 2}, marks=pytest.mark.slow),
                                pytest.param({"slice_is_output": True}, marks=pytest.mark.slow),
                                pytest.param({"keys_transposed": True}, marks=pytest.mark.slow)],
                         ids=["split", "strided", "output", "keys"])
def test_slices_and_transposes_are_read_where_they_lie_by_the_kernels_that_read_them(kw, tmp_path, kernel_cache):
    """The model's output is an array of its own; so are the keys transposed for their product
    (a CPU's product reads B's rows as vectors; a GPU's reads them transposed, test_gpu_model)."""
    graph = attention_heads(**kw)
    model = compile_quietly(graph, cache_dir=kernel_cache)
    copies = [k.desc for k in model.kernels if k.desc.startswith(("strided_slice", "transpose"))]
    assert copies == (["strided_slice 1x6x8"] if kw.get("slice_is_output") else ["transpose 8x6"]
                      if kw.get("keys_transposed") else []), copies
    tasks, _ = tc.extract_tasks(graph, TARGET)  # the tasks to tune are the kernels the model runs
    assert {t.workload_key for t in tasks} == {k.workload_key for k in model.kernels}
    runs_like_the_reference(model, graph, tmp_path)


def runs_like_the_reference(model, graph, directory):
    """``model`` of ``graph`` (x: 6 x 8) computes what the reference does, twice (the shared buffers
    hold the same again), and so does its copy saved to ``directory`` and loaded."""
    x = np.random.default_rng(1).standard_normal((6, 8)).astype("float32")
    expected = run_reference(graph, {"x": x})
    for run in (model.run, load_model_saved(model, directory).run):
        for _ in range(2):
            got = run({"x": x})
            assert got.keys() == expected.keys()
            for name in expected:
                np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-5)


def load_model_saved(model, directory):
    model.save(directory / "saved")
    return tc.load_model(directory / "saved")


def test_a_copy_that_reuses_a_model_shares_its_buffers_and_the_weights_of_its_same_kernels(kernel_cache):
    """Copies that differ in one task's kernels differ in nothing else, not even where their
    memory lies (choose_in_place times such copies)."""
    model = tiny_cnn()
    base = compile_quietly(model, cache_dir=kernel_cache)
    changed = max(range(len(base.kernels)), key=lambda n: len(base.kernels[n].module.packs))  # packs its weights
    old = base.kernels[changed].module
    kernels = list(base.kernels)
    kernels[changed] = dataclasses.replace(kernels[changed], module=Module(old.lib_path, old.source, old.entry_name,
                                                                           old.args, old.packs))
    copy = CompiledModel(base.inputs, base.outputs, base.values, kernels, base.steps, base.constants, base.target,
                         base._plan.library, reuse=base)
    assert copy._fixed is base._fixed
    for n, step in enumerate(base.steps):
        if step.kernel is not None:
            assert (copy._bound[n] is base._bound[n]) == (step.kernel != changed), base.kernels[step.kernel].desc
    x = model_input(model)
    np.testing.assert_allclose(copy(input=x), base(input=x), rtol=0, atol=0)
    np.testing.assert_allclose(copy(input=x), onnxruntime_output(model, x), rtol=1e-4, atol=1e-5)


def test_example_inputs_are_normal_floats_and_zero_indices_the_same_for_every_caller():
    inputs = example_inputs([Value("x", (2, 3), "float32"), Value("ids", (4,), "int64"), Value("mask", (2,), "bool")])
    assert inputs["x"].dtype == np.float32 and inputs["x"].std() > 0
    assert inputs["ids"].dtype == np.int64 and not inputs["ids"].any() and not inputs["mask"].any()
    np.testing.assert_array_equal(example_inputs([Value("x", (2, 3), "float32")])["x"], inputs["x"])
