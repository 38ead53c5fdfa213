"""Tensor cores: loop nests of 16x16(x16) that a schedule marks become warp-wide operations.

A loop annotated ``tensor_core`` (``sch.annotate(loop, "tensor_core", 1)``) heads a nest of
16-iteration loops that one warp computes on its tensor cores (PTX ``wmma``, m16n16k16, as
MetaSchedule's ``wmma_*_16x16x16`` intrinsics):

- a reduction's init, two loops storing 0 into the accumulator: ``fill``;
- its update, three loops adding ``A[i, k] * B[k, j]`` (float16, or bfloat16 from sm_80 on,
  read as they are or cast to float32) into a float32 accumulator: ``mma``;
- its copy-out, two loops storing the accumulator (cast or not) into float32, float16 or
  bfloat16 (rounded in registers, from sm_80 on): ``store``;
- a copy of A's or B's 16-bit tile into a local buffer that the update reads: ``load``, so
  that the mma of several tiles of C share one load of each operand tile.

The accumulator (and each operand's local buffer) becomes a ``fragment``: registers spread
over the warp, which only these operations touch. Each operation runs on the 32 lanes of
``threadIdx.x``, so a block is 32 threads wide and its warps lie along ``threadIdx.y``. Tiles
in memory must start where the hardware can load them: on 32 bytes, their rows a multiple
of 16 bytes apart. What does not fit raises ``LoweringError`` naming the nest and the fix.
"""

from __future__ import annotations


from ..errors import LoweringError
from ..target.cuda import TENSOR_CORE_TILE as TILE
from ..te.arith import simplify, to_linear
from ..te.dtype import HALVES, bytes_of
from ..te.expr import Binary, Cast, Const, Expr, TensorRead, Var, binary, const, substitute
from .kernels import accesses
from .nodes import (Allocate, AsyncCopies, Buffer, For, IfThenElse, MatrixTile, Seq, Stmt, Store, WarpMatrix, rebuffer,
                    walk_stmts)

WARP = 32


def tensorize(body: Stmt) -> Stmt:
    """``body`` with every nest headed by a ``tensor_core`` loop made a warp's operation, run
    on its 32 lanes, and the local buffers they share made fragments."""
    found: dict[int, Buffer] = {}
    body = _replace(body, lambda s: _warp_op(s, found) if isinstance(s, For) and s.kind == "tensor_core" else None)
    fragments = {b: b.in_scope("fragment") for b in found.values()}
    for buffer in fragments:
        if buffer.scope != "local" or any(e % TILE for e in buffer.shape[-2:]):
            raise LoweringError(f"the tensor-core fragment {buffer.name} {list(buffer.shape)} must be a local buffer "
                                f"of whole 16x16 tiles: cache the block's writes (cache_write) or its reads "
                                f"(cache_read) in local memory and split their loops by 16")
    outside = accesses(_replace(body, lambda s: Seq(()) if isinstance(s, WarpMatrix) else None))[1]
    stray = next((b for b in fragments if id(b) in outside), None)
    if stray is not None:
        raise LoweringError(f"{stray.name} is a tensor-core fragment, but a loop nest reads or stores it element by "
                            "element: mark the 16x16 nests of its init, update and copy-out (and of the loads of A's "
                            "and B's fragments) tensor_core, and apply epilogues in a block after the copy-out")
    return _rescoped(body, fragments)


def _warp_op(head: For, fragments: dict[int, Buffer]) -> Stmt:
    """The warp's operation for the nest under ``head``, on its lanes."""
    loops, s = [head], head.body
    while isinstance(s, For):
        loops.append(s)
        s = s.body
    where = f"the tensor-core nest at loop {head.var.name}"
    if not isinstance(s, Store) or len(loops) not in (2, 3) or any(l.extent != TILE for l in loops):
        raise LoweringError(f"{where} must be 2 or 3 loops of 16 around one store, unguarded (the tile sizes "
                            f"dividing the extents); it is {[l.extent for l in loops]} around a "
                            f"{type(s).__name__}: split the block's loops by 16 and mark the outermost of them")
    zero, loop_vars, target, value = {l.var: const(0) for l in loops}, [l.var for l in loops], s.buffer, s.value
    rows, cols = _tile_vars(target, s.indices, loop_vars, where)
    operands: list[MatrixTile] = []

    def operand(read: TensorRead, along: tuple[Var, Var]) -> MatrixTile:  # a fragment that a load filled, or an address
        if read.tensor.scope != "local":
            return _tile(read.tensor, read.indices, *along, zero, where)
        fragments[id(read.tensor)] = read.tensor
        return _fragment(read.tensor, read.indices, *along, zero, where)

    if len(loops) == 3:
        a, b = _product(value, target, s.indices, where)
        k = next(v for v in loop_vars if v not in (rows, cols))
        a, b = (b, a) if not _uses(a.indices, k) or _uses(a.indices, cols) else (a, b)
        op, fragment, operands = "mma", TensorRead(target, s.indices), [operand(a, (rows, k)), operand(b, (k, cols))]
    elif isinstance(value, Const) and value.value == 0:
        op, fragment = "fill", TensorRead(target, s.indices)
    elif target.scope == "local" and target.dtype in HALVES and isinstance(value, TensorRead):
        op, fragment = "load", TensorRead(target, s.indices)  # A's or B's tile into registers, for several mma
        operands = [_tile(value.tensor, value.indices, rows, cols, zero, where)]
    else:
        fragment = value.value if isinstance(value, Cast) else value
        if not isinstance(fragment, TensorRead) or target.dtype not in ("float32", *HALVES):
            raise LoweringError(f"{where} stores {value} into {target.dtype}: a tensor-core store copies the "
                                "accumulator as it is into float32, float16 or bfloat16; apply epilogues in a block "
                                "after it")
        op, operands = "store", [_tile(target, s.indices, rows, cols, zero, where)]
    fragments[id(fragment.tensor)] = fragment.tensor
    tile = _fragment(fragment.tensor, fragment.indices, rows, cols, zero, where)
    lane = Var("tc_lane")
    nest = For(head.var, head.extent, "serial", head.body)
    return For(lane, WARP, "threadIdx.x", WarpMatrix(op, (*operands, tile) if op == "store" else (tile, *operands),
                                                     nest, lane))


def _product(value: Expr, target: Buffer, indices, where: str) -> tuple[TensorRead, TensorRead]:
    """A and B of ``target[indices] + A * B``, reads of one 16-bit float type (each cast to
    float32, or the product)."""
    def read(e: Expr):
        e = e.value if isinstance(e, Cast) else e
        return e if isinstance(e, TensorRead) and e.tensor.dtype in HALVES else None

    if isinstance(value, Binary) and value.op == "add" and isinstance(value.a, TensorRead) \
            and value.a.tensor is target and tuple(value.a.indices) == tuple(indices):
        product = value.b.value if isinstance(value.b, Cast) else value.b
        if isinstance(product, Binary) and product.op == "mul" and read(product.a) is not None \
                and read(product.b) is not None and read(product.a).tensor.dtype == read(product.b).tensor.dtype:
            return read(product.a), read(product.b)
    raise LoweringError(f"{where} computes {target.name} = {value}; a tensor-core update adds the product of two "
                        "float16 (or two bfloat16) tiles into a float32 accumulator (C += A * B)")


def _tile_vars(buffer: Buffer, indices, loop_vars: list[Var], where: str) -> tuple[Var, Var]:
    """The loops that run along the tile's rows and along its columns (in the buffer's order)."""
    used = [v for v in loop_vars if _uses(indices, v)]
    if len(used) != 2:
        raise LoweringError(f"{where} writes {buffer.name} along {len(used)} of its loops; a 16x16 tile runs along two")
    dims = [_dim_of(buffer, indices, v, where) for v in used]
    return (used[0], used[1]) if dims[0] < dims[1] else (used[1], used[0])


def _fragment(buffer: Buffer, indices, rows: Var, cols: Var, zero: dict, where: str) -> MatrixTile:
    """A fragment's tile: its rows and columns along its last two dimensions (either way: a
    tile of B that an mma reads as (k, j) may be held as (j, k), loaded column major), its
    corner on whole tiles (a fragment's registers are numbered by tile)."""
    tile = MatrixTile(buffer, _corner(indices, zero), _dim_of(buffer, indices, rows, where),
                      _dim_of(buffer, indices, cols, where))
    corner = [to_linear(i, {}) for i in tile.indices[-2:]] if buffer.ndim >= 2 else []
    if {tile.row_dim, tile.col_dim} != {buffer.ndim - 2, buffer.ndim - 1} or any(
            c.const % TILE or any(k % TILE for k in c.terms.values()) for c in corner):
        raise LoweringError(f"{where}: the fragment {buffer.name} {list(buffer.shape)} is read at {list(indices)}; "
                            "its 16x16 tiles must lie along its last two dimensions, each on whole tiles")
    return tile


def _tile(buffer: Buffer, indices, rows: Var, cols: Var, zero: dict, where: str) -> MatrixTile:
    """A tile of A, B or the destination, which the tensor cores load or store by address."""
    row_dim, col_dim = _dim_of(buffer, indices, rows, where), _dim_of(buffer, indices, cols, where)
    corner = _corner(indices, zero)
    strides = buffer.strides
    if 1 not in (strides[row_dim], strides[col_dim]):
        raise LoweringError(f"{where}: the tile of {buffer.name} runs along neither of its contiguous dimension's "
                            "elements; a tensor-core tile has its rows or its columns contiguous")
    lead = col_dim if strides[row_dim] == 1 else row_dim  # the dimension whose stride is the leading one
    offset = to_linear(sum((binary("mul", i, const(n)) for i, n in zip(corner, strides)), const(0)), {})
    size = bytes_of(buffer.dtype)
    if strides[lead] * size % 16 or offset.const * size % 32 or any(c * size % 32 for c in offset.terms.values()):
        raise LoweringError(f"{where}: the tile of {buffer.name} {list(buffer.shape)} starts at {list(corner)}, rows "
                            f"{strides[lead]} elements apart; a tensor core reads and writes tiles that start on "
                            f"32 bytes with rows a multiple of 16 bytes apart: make the tiles of that buffer "
                            f"multiples of 16 elements")
    return MatrixTile(buffer, corner, row_dim, col_dim)


def _corner(indices, zero: dict) -> tuple[Expr, ...]:
    return tuple(simplify(substitute(i, zero), {}) for i in indices)


def _dim_of(buffer: Buffer, indices, var: Var, where: str) -> int:
    """The one dimension of ``buffer`` that ``var`` indexes, with a stride of 1."""
    dims = [d for d, index in enumerate(indices) if var in to_linear(index, {}).terms]
    if len(dims) != 1 or to_linear(indices[dims[0]], {}).terms[var] != 1:
        raise LoweringError(f"{where}: loop {var.name} indexes {buffer.name} as {list(indices)}; each loop of a "
                            "tensor-core tile must step along one dimension of every buffer, element by element")
    return dims[0]


def _uses(indices, var: Var) -> bool:
    return any(var in to_linear(index, {}).terms for index in indices)


def _replace(s: Stmt, new) -> Stmt:
    """``s`` with each statement that ``new`` replaces (``new(s)`` is None where it keeps it and looks inside)."""
    replaced = new(s)
    if replaced is not None:
        return replaced
    if isinstance(s, For):
        return For(s.var, s.extent, s.kind, _replace(s.body, new), s.unroll_max_step)
    if isinstance(s, Seq):
        return Seq(tuple(_replace(c, new) for c in s.stmts))
    if isinstance(s, IfThenElse):
        return IfThenElse(s.cond, _replace(s.then, new))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _replace(s.body, new))
    if isinstance(s, AsyncCopies):
        return AsyncCopies(_replace(s.body, new))
    return s


def _rescoped(s: Stmt, buffers: dict[Buffer, Buffer]) -> Stmt:
    """``s`` with ``buffers[b]`` for ``b`` wherever it read, wrote or allocated ``b``."""
    images = {id(old): image for old, image in buffers.items()}

    def allocate(node: Stmt):
        if isinstance(node, Allocate) and id(node.buffer) in images:
            return Allocate(images[id(node.buffer)], _replace(node.body, allocate))
        return None

    return _replace(rebuffer(s, buffers), allocate) if buffers else s


def in_one_lane(s: Stmt) -> Stmt:
    """``s`` for the CPU emulation: each warp operation its scalar nest, run by lane 0 of the
    warp (the other lanes' share of it is already in that nest), and the fragments local
    buffers of that lane."""
    fragments = {n.buffer: n.buffer.in_scope("local") for n in walk_stmts(s)
                 if isinstance(n, Allocate) and n.buffer.scope == "fragment"}
    s = _replace(s, lambda node: IfThenElse(node.lane < 1, node.nest) if isinstance(node, WarpMatrix) else None)
    return _rescoped(s, fragments)
