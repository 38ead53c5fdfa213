"""A library of common operators built only from ``te``, named and defined as in TVM topi / ONNX.

Each function returns the output Tensor; intermediate stages (padding, reductions) are
their own computes, named after the operator (``conv2d_pad``, ``softmax_max``...). Every
operator takes ``name=`` so that a network can give each instance a unique name, which
ComputeDAG requires.

    x = te.placeholder((1, 64, 56, 56), name="x")
    w = te.placeholder((64, 64, 3, 3), name="w")
    y = ops.relu(ops.conv2d_nchw(x, w, stride=1, padding=1))
"""

from .algebra import einsum
from .conv import (conv2d_nchw, conv2d_nhwc, conv2d_nhwc_gemm, conv2d_transpose_nchw, depthwise_conv2d_nchw,
                   depthwise_conv2d_nhwc)
from .deform import col2im, deform_conv2d
from .elementwise import (
    BINARY_FUNCTIONS, UNARY_FUNCTIONS, abs, add, binary, cast, clip, divide, erf, exp, gelu, log, multiply, negative,
    power, relu, sigmoid, silu, sqrt, subtract, tanh, truncate_divide, unary, where,
)
from .linalg import axis_matmul, batch_matmul, dense, matmul
from .nn import avg_pool2d, batch_norm_inference, global_avg_pool2d, layer_norm, log_softmax, max_pool2d, softmax
from .reduction import argmax, argmin, cumsum, max, mean, min, sum
from .sampling import grid_sample, max_roi_pool, roi_align
from .scatter import scatter_elements
from .transform import broadcast_to, concat, gather_elements, pad, reshape, strided_slice, take, transpose, trilu

__all__ = [
    "conv2d_nchw", "conv2d_nhwc", "conv2d_nhwc_gemm", "conv2d_transpose_nchw", "depthwise_conv2d_nchw",
    "depthwise_conv2d_nhwc",
    "col2im", "deform_conv2d",
    "abs", "add", "cast", "clip", "divide", "erf", "exp", "gelu", "log", "multiply", "negative", "power", "relu",
    "sigmoid", "silu", "sqrt", "subtract", "tanh", "truncate_divide", "BINARY_FUNCTIONS", "UNARY_FUNCTIONS", "binary",
    "unary", "where",
    "axis_matmul", "batch_matmul", "dense", "matmul",
    "einsum",
    "avg_pool2d", "batch_norm_inference", "global_avg_pool2d", "layer_norm", "log_softmax", "max_pool2d", "softmax",
    "argmax", "argmin", "cumsum", "max", "mean", "min", "sum",
    "grid_sample", "max_roi_pool", "roi_align",
    "scatter_elements",
    "broadcast_to", "concat", "gather_elements", "pad", "reshape", "strided_slice", "take", "transpose", "trilu",
]
