"""The benchmark's networks, written with plain torch.nn (no torchvision download, random
weights): ResNet-50, MobileNetV2, one BERT-base encoder layer, and two branchy CNNs (GoogLeNet's
inception blocks 3a-4b, DenseNet-121's first dense block and transition), exported to ONNX."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


def _conv_bn(cin, cout, kernel, stride=1, groups=1, act=nn.ReLU):
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = 4 * width
        self.body = nn.Sequential(_conv_bn(cin, width, 1), _conv_bn(width, width, 3, stride),
                                  _conv_bn(width, cout, 1, act=None))
        self.shortcut = _conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet50(classes=1000):
    layers, cin = [_conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)], 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for n in range(blocks):
            layers.append(Bottleneck(cin, width, stride if n == 0 else 1))
            cin = 4 * width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        layers = [_conv_bn(cin, hidden, 1, act=nn.ReLU6)] if expand != 1 else []
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
                   _conv_bn(hidden, cout, 1, act=None)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


def mobilenet_v2(classes=1000):
    layers, cin = [_conv_bn(3, 32, 3, 2, act=nn.ReLU6)], 32
    for expand, cout, repeats, stride in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                                          (6, 160, 3, 2), (6, 320, 1, 1)):
        for n in range(repeats):
            layers.append(InvertedResidual(cin, cout, stride if n == 0 else 1, expand))
            cin = cout
    layers += [_conv_bn(cin, 1280, 1, act=nn.ReLU6), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, classes)]
    return nn.Sequential(*layers)


class BertLayer(nn.Module):
    """One BERT-base encoder layer: self-attention (12 heads), add & LayerNorm, GELU FFN."""

    def __init__(self, hidden=768, heads=12, ffn=3072):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.ffn = nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))

    def forward(self, x):
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(x).reshape(batch, seq, 3, self.heads, hidden // self.heads).permute(2, 0, 3, 1, 4)
        scores = torch.softmax(q @ k.transpose(-1, -2) / (hidden // self.heads) ** 0.5, dim=-1)
        attended = (scores @ v).transpose(1, 2).reshape(batch, seq, hidden)
        x = self.norm1(x + self.out(attended))
        return self.norm2(x + self.ffn(x))


class Inception(nn.Module):
    """GoogLeNet's inception block: 1x1; 1x1 then 3x3; 1x1 then 5x5 (3x3 in torchvision's);
    3x3 max pool then 1x1, concatenated along the channels."""

    def __init__(self, cin, c1, c3r, c3, c5r, c5, pool):
        super().__init__()
        self.b1 = _conv_bn(cin, c1, 1)
        self.b3 = nn.Sequential(_conv_bn(cin, c3r, 1), _conv_bn(c3r, c3, 3))
        self.b5 = nn.Sequential(_conv_bn(cin, c5r, 1), _conv_bn(c5r, c5, 3))
        self.pool = nn.Sequential(nn.MaxPool2d(3, 1, 1), _conv_bn(cin, pool, 1))

    def forward(self, x):
        return torch.cat([self.b1(x), self.b3(x), self.b5(x), self.pool(x)], 1)


def inception():
    """GoogLeNet's stem and inception blocks 3a, 3b, (pool) 4a, 4b, then its head."""
    return nn.Sequential(_conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1), _conv_bn(64, 64, 1), _conv_bn(64, 192, 3),
                         nn.MaxPool2d(3, 2, 1), Inception(192, 64, 96, 128, 16, 32, 32),
                         Inception(256, 128, 128, 192, 32, 96, 64), nn.MaxPool2d(3, 2, 1),
                         Inception(480, 192, 96, 208, 16, 48, 64), Inception(512, 160, 112, 224, 24, 64, 64),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000))


class DenseLayer(nn.Module):
    """DenseNet's layer: BN, ReLU, 1x1 to 4k channels, BN, ReLU, 3x3 to k, appended to its input."""

    def __init__(self, cin, growth=32):
        super().__init__()
        self.body = nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, 4 * growth, 1, bias=False),
                                  nn.BatchNorm2d(4 * growth), nn.ReLU(), nn.Conv2d(4 * growth, growth, 3, 1, 1,
                                                                                   bias=False))

    def forward(self, x):
        return torch.cat([x, self.body(x)], 1)


def densenet_block():
    """DenseNet-121's stem, first dense block (6 layers, 64 to 256 channels at 56x56) and
    transition, then a classifier head."""
    return nn.Sequential(_conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1), *[DenseLayer(64 + 32 * n) for n in range(6)],
                         nn.BatchNorm2d(256), nn.ReLU(), nn.Conv2d(256, 128, 1, bias=False), nn.AvgPool2d(2, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 1000))


MODELS = {
    "resnet50": (resnet50, (1, 3, 224, 224)),
    "mobilenet_v2": (mobilenet_v2, (1, 3, 224, 224)),
    "bert_layer": (BertLayer, (1, 128, 768)),
    "vit_layer": (BertLayer, (1, 197, 768)),  # a ViT-B/16 encoder layer's shapes: 196 patches and a class token
    "inception": (inception, (1, 3, 224, 224)),
    "densenet_block": (densenet_block, (1, 3, 224, 224)),
}


def export(name: str, directory: Path, dtype: str = "float32") -> Path:
    """``directory/name.onnx`` (exported once, with seeded random weights), in eval mode; with
    ``dtype="float16"``, ``name_float16.onnx``, its weights and input float16 (``model.half()``)."""
    path = directory / (f"{name}.onnx" if dtype == "float32" else f"{name}_{dtype}.onnx")
    if not path.exists():
        factory, shape = MODELS[name]
        torch.manual_seed(0)
        model = factory().eval().to(getattr(torch, dtype))
        directory.mkdir(parents=True, exist_ok=True)
        torch.onnx.export(model, (torch.randn(*shape).to(getattr(torch, dtype)),), str(path), input_names=["input"],
                          output_names=["output"], opset_version=17, dynamo=False)
        if dtype == "bfloat16":
            _bfloat16_casts(path)
    return path


def _bfloat16_casts(path: Path) -> None:
    """The TorchScript exporter writes a cast to bfloat16 with PyTorch's number for the type (15),
    which is ONNX's complex128: made ONNX's bfloat16 (16) again. These networks cast to no
    complex type."""
    import onnx

    model = onnx.load(str(path))
    for node in model.graph.node:
        for attribute in node.attribute:
            if node.op_type == "Cast" and attribute.name == "to" and attribute.i == onnx.TensorProto.COMPLEX128:
                attribute.i = onnx.TensorProto.BFLOAT16
    onnx.save(model, str(path))
