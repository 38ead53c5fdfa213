"""2-D convolutions: NCHW, NHWC, depthwise and transposed, in the style of TVM's topi.

Padding is a separate compute ``{name}_pad`` guarding its read with ``te.if_then_else``,
the form Ansor inlines into the convolution; the convolution itself is one sum over
input channels and the kernel window, with the kernel placeholder marked layout-free.
"""

from __future__ import annotations

from .. import te
from ..errors import TeError
from ..te.tensor import Tensor
from .common import (check_tensor, cropped, layout_free, padding4, pair, product_of, rounded_up, same_dtype, window,
                     zero_outside)
from .transform import pad

Pair = int | tuple[int, int]


def _output_size(size: int, kernel: int, stride: int, pad_lo: int, pad_hi: int, dilation: int,
                 op: str, what: str) -> int:
    out = (size + pad_lo + pad_hi - dilation * (kernel - 1) - 1) // stride + 1
    if out <= 0:
        raise TeError(
            f"{op}: the {what} of {size} (padded by {pad_lo}+{pad_hi}) is smaller than the dilated kernel "
            f"{dilation * (kernel - 1) + 1}; use a smaller kernel or dilation, or more padding"
        )
    return out


def _check_groups(channels: int, filters: int, kernel_channels: int, groups: int,
                  data: Tensor, kernel: Tensor, op: str) -> None:
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise TeError(f"{op}: groups must be a positive int, got {groups!r}")
    if channels % groups or filters % groups or kernel_channels * groups != channels:
        raise TeError(
            f"{op}: data {data.name} {data.shape} and kernel {kernel.name} {kernel.shape} do not match with "
            f"groups={groups}: the data's {channels} channels must equal groups * the kernel's {kernel_channels} "
            f"input channels, and both channel counts must divide by groups"
        )


def _operands(data: Tensor, kernel: Tensor, op: str) -> None:
    check_tensor(data, op, 4, "data")
    check_tensor(kernel, op, 4, "kernel")
    same_dtype(data, kernel, op)


def _window(data: Tensor, KH: int, KW: int, stride: Pair, padding, dilation: Pair, op: str, name: str):
    """The padded data (``{name}_pad``, NHWC if ``op`` ends so), strides, dilations and output
    size of a 2-D sliding window."""
    nhwc = op.endswith("nhwc")
    H, W = data.shape[1:3] if nhwc else data.shape[2:]
    (sh, sw), (dh, dw) = pair(stride, op, "stride"), pair(dilation, op, "dilation")
    top, left, bottom, right = padding4(padding, op)
    OH = _output_size(H, KH, sh, top, bottom, dh, op, "height")
    OW = _output_size(W, KW, sw, left, right, dw, op, "width")
    edges = (lambda a, b: (0, a, b, 0)) if nhwc else (lambda a, b: (0, 0, a, b))
    padded = (pad(data, edges(top, left), edges(bottom, right), name=f"{name}_pad")
              if any((top, left, bottom, right)) else data)
    return padded, sh, sw, dh, dw, OH, OW


def conv2d_nchw(data: Tensor, kernel: Tensor, stride: Pair = 1, padding: int | tuple = 0, dilation: Pair = 1,
                groups: int = 1, name: str = "conv2d", out_dtype: str | None = None) -> Tensor:
    """data [N, C, H, W], kernel [F, C/groups, KH, KW] (OIHW) -> [N, F, OH, OW]; summed in
    ``out_dtype`` where given (``product_of``)."""
    _operands(data, kernel, "conv2d_nchw")
    N, C, H, W = data.shape
    F, CG, KH, KW = kernel.shape
    _check_groups(C, F, CG, groups, data, kernel, "conv2d_nchw")
    padded, sh, sw, dh, dw, OH, OW = _window(data, KH, KW, stride, padding, dilation, "conv2d_nchw", name)
    rc, ry, rx = te.reduce_axis((0, CG), "rc"), te.reduce_axis((0, KH), "ry"), te.reduce_axis((0, KW), "rx")
    per_group = F // groups

    def body(n, f, y, x):
        channel = rc.var if groups == 1 else f // per_group * CG + rc.var
        value = padded[n, channel, window(y, sh, ry.var, dh), window(x, sw, rx.var, dw)]
        return te.sum(product_of(value, kernel[f, rc, ry, rx], out_dtype), axis=[rc, ry, rx])

    return te.compute((N, F, OH, OW), body, name=name, attrs=layout_free(kernel))


def conv2d_nhwc(data: Tensor, kernel: Tensor, stride: Pair = 1, padding: int | tuple = 0, dilation: Pair = 1,
                groups: int = 1, name: str = "conv2d", out_dtype: str | None = None) -> Tensor:
    """data [N, H, W, C], kernel [KH, KW, C/groups, F] (HWIO) -> [N, OH, OW, F]; summed in
    ``out_dtype`` where given (``product_of``)."""
    _operands(data, kernel, "conv2d_nhwc")
    N, H, W, C = data.shape
    KH, KW, CG, F = kernel.shape
    _check_groups(C, F, CG, groups, data, kernel, "conv2d_nhwc")
    padded, sh, sw, dh, dw, OH, OW = _window(data, KH, KW, stride, padding, dilation, "conv2d_nhwc", name)
    ry, rx, rc = te.reduce_axis((0, KH), "ry"), te.reduce_axis((0, KW), "rx"), te.reduce_axis((0, CG), "rc")
    per_group = F // groups

    def body(n, y, x, f):
        channel = rc.var if groups == 1 else f // per_group * CG + rc.var
        value = padded[n, window(y, sh, ry.var, dh), window(x, sw, rx.var, dw), channel]
        return te.sum(product_of(value, kernel[ry, rx, rc, f], out_dtype), axis=[ry, rx, rc])

    return te.compute((N, OH, OW, F), body, name=name, attrs=layout_free(kernel))


def conv2d_nhwc_gemm(data: Tensor, kernel: Tensor, stride: Pair = 1, padding: int | tuple = 0, dilation: Pair = 1,
                     multiple: int = 1, name: str = "conv2d", out_dtype: str | None = None) -> Tensor:
    """``conv2d_nhwc`` as one matrix product (implicit GEMM): data [N, H, W, C], kernel
    [KH, KW, C, F] (HWIO) -> [N*OH*OW, F], the NHWC output's memory, rows of pixels. The
    pixels' windows (``{name}_im2col``, [N*OH*OW, KH*KW*C]) and the kernel as a [KH*KW*C, F]
    matrix (``{name}_weights``) are stages that a schedule inlines into the tiles it fetches:
    a GPU's tensor cores take the product as they take a matmul's (``GpuTensorCoreTiling``),
    where the output's rows, channels and the reduction are multiples of 16. Each of the three
    sizes is padded up to a ``multiple`` (windows past the last pixel, weights past the last
    channel or window element are 0); a product padded in rows or columns
    (``{name}_padded``) is cropped into the output: a 14x14 image's 196 pixels, 208 rows.
    Summed in ``out_dtype`` where given (``product_of``)."""
    _operands(data, kernel, "conv2d_nhwc_gemm")
    N, H, W, C = data.shape
    KH, KW, CG, F = kernel.shape
    _check_groups(C, F, CG, 1, data, kernel, "conv2d_nhwc_gemm")
    padded, sh, sw, dh, dw, OH, OW = _window(data, KH, KW, stride, padding, dilation, "conv2d_nhwc", name)
    pixels, depth = N * OH * OW, KH * KW * C
    rows, deep, columns = rounded_up((pixels, depth, F), multiple, "conv2d_nhwc_gemm")

    def window_of(m, k):  # pixel m's window at k = (ky * KW + kx) * C + c
        value = padded[m // (OH * OW), window(m // OW % OH, sh, k // (KW * C), dh),
                       window(m % OW, sw, k // C % KW, dw), k % C]
        return zero_outside(value, (m, pixels, rows), (k, depth, deep))

    def weight(k, f):
        return zero_outside(kernel[k // (KW * C), k // C % KW, k % C, f], (k, depth, deep), (f, F, columns))

    windows = te.compute((rows, deep), window_of, name=f"{name}_im2col")
    weights = te.compute((deep, columns), weight, name=f"{name}_weights")
    r = te.reduce_axis((0, deep), "rk")
    whole = (rows, columns) == (pixels, F)
    product = te.compute((rows, columns), lambda m, f: te.sum(product_of(windows[m, r], weights[r, f], out_dtype),
                                                              axis=r),
                         name=name if whole else f"{name}_padded")
    return cropped(product, (pixels, F), name)


def depthwise_conv2d_nchw(data: Tensor, kernel: Tensor, stride: Pair = 1, padding: int | tuple = 0,
                          dilation: Pair = 1, name: str = "depthwise_conv2d") -> Tensor:
    """data [N, C, H, W], kernel [C, M, KH, KW] (M: channel multiplier) -> [N, C*M, OH, OW].

    Output channel ``c`` convolves input channel ``c // M`` with ``kernel[c // M, c % M]``.
    """
    op = "depthwise_conv2d_nchw"
    _operands(data, kernel, op)
    N, C, H, W = data.shape
    KC, M, KH, KW = kernel.shape
    if KC != C:
        raise TeError(f"{op}: kernel {kernel.name} {kernel.shape} must have the {C} channels of data "
                      f"{data.name} {data.shape} as its first dimension")
    padded, sh, sw, dh, dw, OH, OW = _window(data, KH, KW, stride, padding, dilation, op, name)
    ry, rx = te.reduce_axis((0, KH), "ry"), te.reduce_axis((0, KW), "rx")

    def body(n, c, y, x):
        channel, multiple = (c, 0) if M == 1 else (c // M, c % M)
        value = padded[n, channel, window(y, sh, ry.var, dh), window(x, sw, rx.var, dw)]
        return te.sum(value * kernel[channel, multiple, ry, rx], axis=[ry, rx])

    return te.compute((N, C * M, OH, OW), body, name=name, attrs=layout_free(kernel))


def depthwise_conv2d_nhwc(data: Tensor, kernel: Tensor, stride: Pair = 1, padding: int | tuple = 0,
                          dilation: Pair = 1, name: str = "depthwise_conv2d") -> Tensor:
    """data [N, H, W, C], kernel [KH, KW, C, M] (M: channel multiplier) -> [N, OH, OW, C*M]:
    the NHWC form of ``depthwise_conv2d_nchw``, channels contiguous for vectorization."""
    op = "depthwise_conv2d_nhwc"
    _operands(data, kernel, op)
    N, H, W, C = data.shape
    KH, KW, KC, M = kernel.shape
    if KC != C:
        raise TeError(f"{op}: kernel {kernel.name} {kernel.shape} must have the {C} channels of data "
                      f"{data.name} {data.shape} as its third dimension")
    padded, sh, sw, dh, dw, OH, OW = _window(data, KH, KW, stride, padding, dilation, op, name)
    ry, rx = te.reduce_axis((0, KH), "ry"), te.reduce_axis((0, KW), "rx")

    def body(n, y, x, c):
        channel, multiple = (c, 0) if M == 1 else (c // M, c % M)
        value = padded[n, window(y, sh, ry.var, dh), window(x, sw, rx.var, dw), channel]
        return te.sum(value * kernel[ry, rx, channel, multiple], axis=[ry, rx])

    return te.compute((N, OH, OW, C * M), body, name=name, attrs=layout_free(kernel))


def conv2d_transpose_nchw(data: Tensor, kernel: Tensor, stride: Pair = 1, padding: int | tuple = 0,
                          output_padding: Pair = 0, name: str = "conv2d_transpose") -> Tensor:
    """data [N, Ci, H, W], kernel [Ci, Co, KH, KW] (IOHW) -> [N, Co, OH, OW], OH = (H-1)*s - pads + KH + out_pad.

    As in topi: ``{name}_dilate_pad`` spreads the input ``stride`` apart inside a border of
    ``KH-1-pad``, then a stride-1 convolution with the flipped kernel.
    """
    op = "conv2d_transpose_nchw"
    _operands(data, kernel, op)
    N, CI, H, W = data.shape
    KCI, CO, KH, KW = kernel.shape
    if KCI != CI:
        raise TeError(f"{op}: kernel {kernel.name} {kernel.shape} must have the {CI} input channels of data "
                      f"{data.name} {data.shape} as its first dimension")
    sh, sw = pair(stride, op, "stride")
    oph, opw = pair(output_padding, op, "output_padding", minimum=0)
    if oph >= sh or opw >= sw:
        raise TeError(f"{op}: output_padding {output_padding!r} must be smaller than the stride {stride!r}")
    top, left, bottom, right = padding4(padding, op)
    OH = (H - 1) * sh - top - bottom + KH + oph
    OW = (W - 1) * sw - left - right + KW + opw
    if OH <= 0 or OW <= 0:
        raise TeError(f"{op}: padding {padding!r} leaves an empty output ({OH}x{OW}); use less padding")
    border_h, border_w = KH - 1 - top, KW - 1 - left

    def source(n, c, y, x):
        inside = []
        index = []
        for var, border, s, size, extent in ((y, border_h, sh, H, OH + KH - 1), (x, border_w, sw, W, OW + KW - 1)):
            shifted = var - border if border > 0 else var + (-border) if border < 0 else var
            if border > 0:
                inside.append(shifted >= 0)
            if extent - 1 - border > (size - 1) * s:
                inside.append(shifted <= (size - 1) * s)
            if s > 1:
                inside.append(te.equal(shifted % s, 0))
            index.append(shifted // s if s > 1 else shifted)
        value = data[n, c, index[0], index[1]]
        return te.if_then_else(te.all(*inside), value, 0.0) if inside else value

    dilated = te.compute((N, CI, OH + KH - 1, OW + KW - 1), source, name=f"{name}_dilate_pad")
    rc, ry, rx = te.reduce_axis((0, CI), "rc"), te.reduce_axis((0, KH), "ry"), te.reduce_axis((0, KW), "rx")

    def body(n, f, y, x):
        flipped = kernel[rc, f, KH - 1 - ry.var, KW - 1 - rx.var]
        return te.sum(dilated[n, rc, y + ry.var, x + rx.var] * flipped, axis=[rc, ry, rx])

    return te.compute((N, CO, OH, OW), body, name=name, attrs=layout_free(kernel))
