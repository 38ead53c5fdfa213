"""Small networks exported from PyTorch (when installed) import and match onnxruntime and PyTorch."""

import io

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # PyTorch alone takes seconds to import: the quick subset never collects it
torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from tilecraft.frontend import from_onnx  # noqa: E402
from tilecraft.graph import run_reference  # noqa: E402


class TinyCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(x.flatten(1))


class TinyTransformerBlock(torch.nn.Module):
    def __init__(self, width=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.up, self.down = torch.nn.Linear(width, 2 * width), torch.nn.Linear(2 * width, width)

    def forward(self, x):
        batch, tokens, width = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attention = torch.softmax(q @ k.transpose(-1, -2) / (width // self.heads) ** 0.5, dim=-1)
        mixed = (attention @ v).transpose(1, 2).reshape(batch, tokens, width)
        x = self.norm1(x + self.proj(mixed))
        return self.norm2(x + self.down(torch.nn.functional.gelu(self.up(x))))


def export(module, example, **options):
    buffer = io.BytesIO()
    torch.onnx.export(module.eval(), (example,), buffer, dynamo=False, opset_version=17, input_names=["x"],
                      output_names=["y"], **options)
    return onnx.load_from_string(buffer.getvalue())


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("module, shape, ops", [
    (TinyCNN, (2, 3, 8, 8), ["conv2d", "add", "relu", "max_pool2d", "reshape", "dense", "add"]),
    (TinyTransformerBlock, (2, 5, 16), None),
])
def test_exported_model_matches_onnxruntime_and_torch(module, shape, ops):
    torch.manual_seed(0)
    net = module()
    if isinstance(net, TinyCNN):  # non-trivial statistics, kept as a BatchNormalization node for the pass to fold
        net.bn.running_mean.uniform_(-1, 1)
        net.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(shape)
    model = export(net, x, do_constant_folding=False)
    graph = from_onnx(model)
    if ops is not None:
        assert [n.op for n in graph.nodes] == ops
    else:
        assert "gelu" in [n.op for n in graph.nodes] and "erf" not in [n.op for n in graph.nodes]
    got = run_reference(graph, {"x": x.numpy()})["y"]
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        ["y"], {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-5)
    with torch.no_grad():
        np.testing.assert_allclose(got, net(x).numpy(), rtol=1e-3, atol=1e-5)
