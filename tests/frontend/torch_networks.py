"""The PyTorch networks that tests/frontend/test_torch.py and benchmarks/torch_backend.py compile, built
here so they need no torchvision: a branchy CNN (inception blocks: four branches concatenated), a
pre-norm transformer block and an MLP."""

import itertools

import torch

nn, F = torch.nn, torch.nn.functional


class Inception(nn.Module):
    """Four branches (1x1; 1x1 then 3x3; 1x1 then 5x5; 3x3 max pool then 1x1), concatenated."""

    def __init__(self, width):
        super().__init__()
        quarter = width // 4
        self.one, self.pool = nn.Conv2d(width, quarter, 1), nn.Conv2d(width, quarter, 1)
        self.three = nn.Sequential(nn.Conv2d(width, quarter, 1), nn.ReLU(), nn.Conv2d(quarter, quarter, 3, padding=1))
        self.five = nn.Sequential(nn.Conv2d(width, quarter, 1), nn.ReLU(), nn.Conv2d(quarter, quarter, 5, padding=2))

    def forward(self, x):
        pooled = self.pool(F.max_pool2d(x, 3, stride=1, padding=1))
        return F.relu(torch.cat([self.one(x), self.three(x), self.five(x), pooled], dim=1))


class BranchyCNN(nn.Module):
    def __init__(self, width=16, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.Sequential(Inception(width), Inception(width))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.blocks(F.max_pool2d(self.stem(x), 2)).mean((2, 3)))


class TransformerBlock(nn.Module):
    """Pre-norm: attention (PyTorch's fused scaled_dot_product_attention), then a GELU MLP."""

    def __init__(self, width=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        batch, tokens, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, tokens, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        mixed = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, tokens, width)
        x = x + self.proj(mixed)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class MLP(nn.Module):
    def __init__(self, sizes=(64, 128, 128, 10)):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = F.relu(layer(x))
        return torch.softmax(self.layers[-1](x), dim=-1)


MODELS = {"cnn": (BranchyCNN, (1, 3, 16, 16)), "transformer": (TransformerBlock, (2, 8, 32)), "mlp": (MLP, (4, 64))}


def network(name):
    """The module (seeded, in inference mode, with non-trivial batch-norm statistics) and an input."""
    module, shape = MODELS[name]
    torch.manual_seed(0)
    net = module().eval()
    for buffer_name, buffer in net.named_buffers():
        if buffer_name.endswith(("running_mean", "running_var")):
            buffer.uniform_(0.5, 1.5)
    return net, torch.randn(shape)
