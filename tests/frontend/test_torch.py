"""PyTorch's way in: torch.compile(backend="tilecraft") and tc.from_torch on a branchy CNN, a transformer
block and an MLP match eager PyTorch; an operator tilecraft cannot compile runs in PyTorch with one
warning; graph breaks, new shapes and changed weights compile again; tuning logs are used; the
command line reads a torch.export file; tilecraft works without torch."""

import subprocess
import sys
import types
import warnings

import pytest

pytestmark = pytest.mark.slow  # PyTorch alone takes seconds to import: the quick subset never collects it
torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

import tilecraft as tc  # noqa: E402
from tilecraft.cli import main  # noqa: E402
from tilecraft.database import TuningRecord, trace_key  # noqa: E402
from tilecraft.frontend import UnsupportedOperatorError  # noqa: E402
from tilecraft.graph.ir import Value  # noqa: E402
from tilecraft.model.compiled import DefaultScheduleWarning, ModelInputError, check_inputs  # noqa: E402
from tilecraft.model import torch as torch_backend  # noqa: E402
from tilecraft.model.torch import TorchFallbackWarning  # noqa: E402
from tilecraft.runtime import cuda as cuda_runtime  # noqa: E402
from tilecraft.search.default import default_schedule  # noqa: E402
from tilecraft.te.dtype import NUMPY_DTYPES  # noqa: E402
from torch_networks import MODELS, network  # noqa: E402

nn = torch.nn


def assert_close(got, expected):
    relative = ((got - expected).norm() / expected.norm()).item()
    assert got.shape == expected.shape and got.dtype == expected.dtype and relative <= 1e-4, relative


@pytest.fixture
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        yield


@pytest.mark.parametrize("name", sorted(MODELS))
def test_torch_compile_and_from_torch_match_eager_pytorch(name, kernel_cache, quiet):
    net, x = network(name)
    with torch.no_grad():
        expected = net(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error", TorchFallbackWarning)
            compiled = torch.compile(net, backend="tilecraft", options={"cache_dir": kernel_cache})
            assert_close(compiled(x), expected)
        model = tc.from_torch(net, x, cache_dir=kernel_cache)
    assert_close(model(x), expected)
    assert all(not kernel.tuned for kernel in model.compiled.kernels)
    again = torch.randn(x.shape)
    with torch.no_grad():
        assert_close(model(again), net(again))
        assert_close(compiled(again), net(again))


def test_a_bfloat16_module_compiles_and_computes_what_eager_pytorch_does(kernel_cache, quiet):
    """bfloat16 tensors in and out (NumPy's bfloat16 is ml_dtypes', which PyTorch neither gives
    nor takes: they cross as their bits); each product sums in float32 and rounds once, as
    PyTorch's does."""
    net, x = network("mlp")
    net, x = net.to(torch.bfloat16).eval(), x.to(torch.bfloat16)
    with torch.no_grad():
        expected = net(x)
        compiled = torch.compile(net, backend="tilecraft", options={"cache_dir": kernel_cache})
        for got in (compiled(x), tc.from_torch(net, x, cache_dir=kernel_cache)(x)):
            assert got.dtype == torch.bfloat16
            assert ((got.float() - expected.float()).norm() / expected.float().norm()).item() <= 1e-2


def test_a_graph_on_a_gpu_compiles_for_that_gpu_and_one_on_several_runs_in_pytorch_saying_why(monkeypatch):
    choose = torch_backend._placement
    assert choose([], None) == (None, None) and choose([], "llvm -mcpu=znver3") == ("llvm -mcpu=znver3", None)
    assert choose(["cuda:0"], None) == ("cuda", 0) and choose(["cuda:0"], "cuda -arch=sm_80") == ("cuda -arch=sm_80", 0)
    a100 = tc.CudaTarget("cuda -arch=sm_80")  # GPU 1 of a machine whose GPU 0 is another kind
    monkeypatch.setattr(torch_backend.CudaTarget, "device", classmethod(lambda cls, index=0: a100 if index == 1 else 0))
    assert choose(["cuda:1"], None) == (a100, 1) and choose(["cuda:1"], "cuda -arch=sm_90") == ("cuda -arch=sm_90", 1)
    with pytest.raises(torch_backend.OnnxImportError, match=r"on cuda:0, cuda:1; tilecraft compiles for the CPU, or "
                                                            r"for one GPU with a CUDA target \(options=\{'target': "):
        choose(["cuda:0", "cuda:1"], "cuda")
    with pytest.raises(torch_backend.OnnxImportError, match=r"on mps:0; "):
        choose(["mps:0"], None)
    with pytest.raises(torch_backend.OnnxImportError, match=r"on cuda:0; .*, not 'llvm'"):
        choose(["cuda:0"], "llvm")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU and PyTorch built for CUDA")
@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_on_a_gpu_torch_compile_and_from_torch_run_the_model_there(name, kernel_cache, quiet):
    net, x = network(name)
    net, x = net.cuda(), x.cuda()
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # fp32 as ours
        expected = net(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error", TorchFallbackWarning)
            compiled = torch.compile(net, backend="tilecraft", options={"cache_dir": kernel_cache})
            got = compiled(x)
        model = tc.from_torch(net, x, cache_dir=kernel_cache)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):  # another stream current: the call waits for it and for its kernels
            again = model(x * 2)
        assert_close(again, net(x * 2))
    assert got.is_cuda and model(x).is_cuda and type(model.compiled).__name__ == "GpuModel"
    assert_close(got, expected)
    assert_close(model(x), expected)
    model.compiled.to(1)  # elsewhere than the tensors: said before anything runs, on a machine of any GPUs
    with pytest.raises(ModelInputError, match=r"the model runs on cuda:1 but was given tensors on cuda:0; move "
                                                 r"them with .to\('cuda:1'\), or the model with model.compiled.to"):
        model(x)


def test_a_bfloat16_gpu_tensor_is_read_through_its_int16_views_array_interface():
    class CudaBFloat16:  # as PyTorch's: no __cuda_array_interface__ of its own, its int16 view's
        __module__, dtype, shape = "torch", torch.bfloat16, (2, 3)

        @property
        def __cuda_array_interface__(self):
            raise TypeError("bfloat16 has no typestr")

        def view(self, dtype):
            assert dtype == torch.int16
            return types.SimpleNamespace(__cuda_array_interface__={
                "shape": self.shape, "typestr": "<i2", "data": (0x7F0000000000, False), "strides": None, "version": 3})

        def __dlpack_device__(self):
            return (2, 0)

    tensor = CudaBFloat16()
    bits = check_inputs([Value("x", (2, 3), "bfloat16")], {"x": tensor}, gpu=True)["x"]
    assert isinstance(bits, cuda_runtime.BFloat16Bits) and bits.tensor is tensor
    with pytest.raises(ModelInputError, match=r"input x must be a GPU or numpy array float32\[2, 3\] but got bfloat16"):
        check_inputs([Value("x", (2, 3), "float32")], {"x": tensor}, gpu=True)
    spec = cuda_runtime.ArgSpec("y", (2, 3), "bfloat16", True)
    assert cuda_runtime.device_pointer("kernel", spec, tensor, 0) == (0, 0x7F0000000000)
    assert cuda_runtime.DeviceArray.view(tensor, (3, 2)).dtype == NUMPY_DTYPES["bfloat16"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU and PyTorch built for CUDA")
def test_on_a_gpu_bfloat16_tensors_cross_as_their_bits(kernel_cache, quiet):
    """PyTorch gives a bfloat16 CUDA tensor no __cuda_array_interface__; its int16 view's serves:
    a model's inputs and outputs, and a kernel's output that PyTorch makes for it."""
    net, x = network("mlp")
    net, x = net.to("cuda", torch.bfloat16).eval(), x.to("cuda", torch.bfloat16)
    with torch.no_grad():
        expected = net(x)
        got = tc.from_torch(net, x, cache_dir=kernel_cache)(x)
    assert got.is_cuda and got.dtype == torch.bfloat16
    assert ((got.float() - expected.float()).norm() / expected.float().norm()).item() <= 1e-2
    dag = tc.SearchTask(func="matmul", args=(32, 64, 48, "bfloat16")).compute_dag  # a kernel's output made by PyTorch
    kernel = tc.build(default_schedule(dag, tc.Target("cuda")), "cuda", cache_dir=kernel_cache)
    a, b = (torch.randn(*shape, device="cuda").to(torch.bfloat16) for shape in ((32, 64), (64, 48)))
    c = kernel(a, b)
    assert c.is_cuda and c.dtype == torch.bfloat16
    torch.testing.assert_close(c.float(), (a.float() @ b.float()).to(torch.bfloat16).float(), rtol=2e-2, atol=2e-2)


class Spectrum(nn.Module):
    """A linear layer, an FFT (which PyTorch cannot export to ONNX), its magnitudes (complex,
    which tilecraft does not compute in), then a linear layer again."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(8, 8), nn.Linear(5, 3)

    def forward(self, x):
        return self.second(torch.fft.rfft(self.first(x)).abs())


def test_operators_tilecraft_cannot_compile_run_in_pytorch_and_the_others_compile(kernel_cache, monkeypatch):
    """The graph is split around them, with one warning that names them and why."""
    torch.manual_seed(0)
    net, x = Spectrum().eval(), torch.randn(4, 8)
    compiles = []
    compile_graph = torch_backend._compiled
    monkeypatch.setattr(torch_backend, "_compiled",
                        lambda module, inputs, gpu, **options: compiles.append(module) or compile_graph(
                            module, inputs, gpu, **options))
    compiled = torch.compile(net, backend="tilecraft", options={"cache_dir": kernel_cache})
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = compiled(x), compiled(2 * x)
    (fallback,) = [w for w in caught if w.category is TorchFallbackWarning]
    assert len(compiles) == 3  # the whole graph (refused), then each linear layer
    message = str(fallback.message)
    assert "tilecraft compiles 2 of the 4 PyTorch operators" in message and "2 run in PyTorch (abs_1, fft_rfft)" \
        in message and "Exporting the operator 'aten::fft_rfft'" in message
    with torch.no_grad():
        assert_close(first, net(x))
        assert_close(second, net(2 * x))
    with pytest.raises(UnsupportedOperatorError, match="aten::fft_rfft"):
        tc.from_torch(net, x)


class Spectrum1d(nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x).abs()


def test_a_graph_with_nothing_tilecraft_can_compile_runs_in_pytorch_with_one_warning(kernel_cache):
    x = torch.randn(4, 8)
    compiled = torch.compile(Spectrum1d(), backend="tilecraft", options={"cache_dir": kernel_cache})
    with torch.no_grad(), pytest.warns(TorchFallbackWarning) as caught:
        got = compiled(x)
    assert len(caught) == 1 and "a graph of 2 PyTorch operators that torch.compile captured; it runs in PyTorch: " \
        "PyTorch cannot export the program to ONNX: Exporting the operator 'aten::fft_rfft'" in str(caught[0].message)
    assert_close(got, torch.fft.rfft(x).abs())


class TwoHalves(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        x = torch.relu(self.first(x))
        torch._dynamo.graph_break()  # what print() or data-dependent Python would do
        return self.second(x)


def test_graph_breaks_new_shapes_and_weights_changed_in_place_compile_again(kernel_cache, quiet):
    torch.manual_seed(0)
    net = TwoHalves().eval()
    compiled = torch.compile(net, backend="tilecraft", options={"cache_dir": kernel_cache})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", TorchFallbackWarning)
        for rows in (2, 3, 5):  # from the third shape on, dynamo gives the graphs symbolic sizes
            x = torch.randn(rows, 8)
            assert_close(compiled(x), net(x))
        net.load_state_dict(TwoHalves().state_dict())  # new weights, copied in place
        assert_close(compiled(x), net(x))
        net.first.weight.mul_(2)
        assert_close(compiled(x), net(x))


class Lookup(nn.Module):
    """Two inputs (token ids, a bias) and two outputs, one of them an int64 scalar."""

    def __init__(self):
        super().__init__()
        self.embedding, self.linear = nn.Embedding(20, 8), nn.Linear(8, 4)

    def forward(self, ids, bias):
        return self.linear(self.embedding(ids)) + bias, ids.sum()


def test_several_inputs_and_outputs_of_other_dtypes_with_dynamic_shapes_from_the_start(kernel_cache, quiet):
    torch.manual_seed(0)
    net, bias = Lookup().eval(), torch.randn(4)
    compiled = torch.compile(net, backend="tilecraft", options={"cache_dir": kernel_cache}, dynamic=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", TorchFallbackWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # dynamo passes a float attribute as a 0-d tensor
        for tokens in (5, 3):
            ids = torch.randint(0, 20, (2, tokens))
            (got, total), (expected, expected_total) = compiled(ids, bias), net(ids, bias)
            assert_close(got, expected)
            assert total.dtype == torch.int64 and total.item() == expected_total.item()
        model = tc.from_torch(net, (ids, bias), cache_dir=kernel_cache)
    assert_close(model(ids, bias)[0], expected)
    with pytest.raises(ModelInputError, match=r"takes 2 input\(s\) \(int64\[2, 3\], float32\[4\]\) but was given 1"):
        model(ids)


def made_up_log(path, onnx_model):
    """A log with one record for every task of the model: its default schedule, as if measured."""
    tasks, _ = tc.extract_tasks(onnx_model)
    with open(path, "w") as file:
        for task in tasks:
            trace = default_schedule(task.compute_dag, task.target).trace
            file.write(TuningRecord(task.workload_key, task.workload, str(task.target), trace_key(trace), (1e-3,),
                                    "none", "", 0.1, 0.0, task.compute_dag.flop_count(), None).to_json_line() + "\n")
    return path


def test_the_log_given_in_options_gives_every_kernel_its_tuned_schedule(tmp_path, kernel_cache):
    net, x = network("mlp")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        untuned = tc.from_torch(net, x, cache_dir=kernel_cache)
    untuned.save_onnx(tmp_path / "mlp.onnx")
    log = made_up_log(tmp_path / "mlp.json", str(tmp_path / "mlp.onnx"))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no kernel left with the default schedule, nothing in PyTorch
        compiled = torch.compile(net, backend="tilecraft", options={"log": str(log), "cache_dir": kernel_cache})
        assert_close(compiled(x), net(x))
        tuned = tc.from_torch(net, x, log=log, cache_dir=kernel_cache)
    assert tuned.compiled.kernels and all(kernel.tuned for kernel in tuned.compiled.kernels)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed,
                       match=r"takes options=\{...\} with the keys log, target, cache_dir, not \['logs'\]"):
        torch.compile(net, backend="tilecraft", options={"logs": str(log)})(x)


def test_the_command_line_reads_a_torch_export_file_as_an_onnx_model(tmp_path, capsys):
    net, x = network("cnn")
    program = tmp_path / "cnn.pt2"
    torch.export.save(torch.export.export(net, (x,)), program)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        tc.from_torch(net, x).save_onnx(tmp_path / "cnn.onnx")
    listings = []
    for path in (program, tmp_path / "cnn.onnx"):
        assert main(["tasks", str(path)]) == 0
        listings.append(capsys.readouterr().out)
    assert listings[0] == listings[1] and "conv2d_nhwc" in listings[0]
    (tmp_path / "not.pt2").write_text("not a program")
    assert main(["tasks", str(tmp_path / "not.pt2")]) == 2
    assert f"MODEL: {tmp_path / 'not.pt2'} is not a program saved by torch.export.save" in capsys.readouterr().err


def test_tune_model_on_a_torch_export_file_tunes_kernels_that_from_torch_then_uses(tmp_path, kernel_cache):
    net, x = network("mlp")
    program, log = tmp_path / "mlp.pt2", tmp_path / "mlp.json"
    torch.export.save(torch.export.export(net, (x,)), program)
    assert main(["tune-model", str(program), "--trials", "4", "--per-round", "2", "--log", str(log),
                 "--no-transfer"]) == 0
    with torch.no_grad(), pytest.warns(DefaultScheduleWarning) as caught:
        model = tc.from_torch(net, x, log=log, cache_dir=kernel_cache)
    assert 0 < sum(kernel.tuned for kernel in model.compiled.kernels) < len(model.compiled.kernels)
    assert f"no record in {log}" in str(caught[0].message)
    assert_close(model(x), net(x))


def test_tilecraft_works_without_torch_and_says_what_to_install():
    script = ("import sys; sys.modules['torch'] = None\n"
              "import tilecraft as tc\n"
              "tc.extract_tasks\n"
              "try:\n    tc.from_torch(None, ())\n"
              "except ImportError as error:\n    print(error)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert "pip install 'tilecraft[torch]'" in result.stdout
