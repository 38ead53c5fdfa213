"""Task extraction: the distinct fused subgraphs of a model, as tuning tasks weighted by their count.

A model is prepared the same way here and in ``compile_model`` (ONNX imported, convolutions
and pools put in NHWC by ``layout.convert_layout``, 3x3 convolutions rewritten by
``winograd.winograd_convolutions`` on CPUs, the graph partitioned), so the workload
keys of the tasks tuned are the keys that compiling the model looks up in the log.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from ..database.log import best_of
from ..database.record import TuningRecord
from ..target import Target
from ..tune.task import SearchTask
from ..frontend.onnx import from_onnx
from ..graph.fuse import Subgraph, partition, subgraph_dag
from ..graph.views import place
from ..graph.half import CPU_PRODUCTS, gemm_convolutions, half_products, padded_products
from ..graph.ir import Graph
from ..graph.layout import convert_layout
from ..graph.transposed_operands import read_transposed
from ..graph.winograd import stages_of, winograd_convolutions


ALONE = ("search", "final")  # the phases of records that time a kernel alone, as the Winograd choice compares them


def best_alone(records: list[TuningRecord], path: str | Path) -> dict[str, TuningRecord]:
    """Each workload's best of ``records`` (read from the log at ``path``) that time its kernel
    alone: what ``prepare_graph`` compares direct and Winograd kernels by."""
    return {r.workload_key: r for r in best_of([r for r in records if r.phase in ALONE], path)}


def prepare_graph(model_or_graph: Any, input_shapes: Mapping[str, tuple[int, ...]] | None, target: Target,
                  best: Mapping[str, TuningRecord] | None = None) -> Graph:
    """The graph that is compiled: an ONNX model (a ``ModelProto`` or a path) imported, then in
    NHWC, and for a CPU its bfloat16 products computed on bfloat16 operands where it has
    AVX-512 BF16 and its float32 3x3 convolutions by Winograd's algorithm where it pays; for a
    GPU, its 16-bit products computed on 16-bit operands (``half.half_products``), its
    products' transposed operands read transposed (``transposed_operands``: attention's keys),
    and those whose sizes tile badly padded to whole tiles (``half.padded_products``).

    With ``best`` (a log's best record by workload key of the kernels timed alone, phases
    ``ALONE``), a convolution stays direct where the log times it direct and lacks one of
    Winograd's three tasks, or times it direct faster than the three together: a log tuned
    before the rewrite keeps its tuned kernels. Times in a model would not do: a model
    computes each convolution one way, so only that way would have them, and slower.
    """
    if not isinstance(model_or_graph, Graph):
        model_or_graph = from_onnx(model_or_graph, input_shapes)
    elif input_shapes:
        raise TypeError("input_shapes applies to ONNX models; a Graph's input shapes are fixed already")
    if target.kind == "cuda":  # float16 products on float16 operands, convolutions as tensor cores take them
        return padded_products(read_transposed(gemm_convolutions(convert_layout(half_products(model_or_graph)))))
    if target.has_bfloat16_dot:  # bfloat16 products on bfloat16 operands, summed in pairs
        model_or_graph = half_products(model_or_graph, ("bfloat16",), CPU_PRODUCTS)
    graph = convert_layout(model_or_graph)
    rewritten = winograd_convolutions(graph)
    direct = _direct_by_the_log(graph, rewritten, best) if best else set()
    return winograd_convolutions(graph, direct) if direct else rewritten


def _direct_by_the_log(graph: Graph, rewritten: Graph, best: Mapping[str, TuningRecord]) -> set[str]:
    """The convolutions of ``graph`` whose direct kernel the log's records prefer (``prepare_graph``)."""
    def seconds(source: Graph, subgraphs: list[Subgraph], values: set[str]) -> float:
        """The log's seconds for the kernels that compute ``values``; inf if it lacks one."""
        keys = [subgraph_dag(source, part).workload_key for part in subgraphs
                if any(node.output in values for node in part.nodes)]
        return sum(best[key].cost if key in best else math.inf for key in keys)

    direct_parts, winograd_parts = partition(graph), partition(rewritten)
    outputs = {node.name: node.output for node in graph.nodes}
    return {name for name, stages in stages_of(rewritten).items()
            if (alone := seconds(graph, direct_parts, {outputs[name]})) < math.inf
            and alone <= seconds(rewritten, winograd_parts, set(stages))}


def describe(graph: Graph, subgraph: Subgraph) -> str:
    """A readable name for a subgraph's task: its operators and output shape, "conv2d+add+relu 1x64x56x56"."""
    return f"{subgraph.ops} {'x'.join(map(str, graph.values[subgraph.outputs[0]].shape)) or 'scalar'}"


def extract_tasks(model_or_graph: Any, target: Target | str | None = None,
                  input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> tuple[list[SearchTask], list[int]]:
    """One SearchTask per distinct kernel of the model (same workload key: one task) and how many
    times the model runs it, the weights for ``TaskScheduler(tasks, weights)``.

    The model is prepared as ``compile_model`` prepares it (imported, put in NHWC,
    partitioned into fused subgraphs), so the tasks' workload keys are those that
    compiling the model looks up in the tuning log. Reshapes, which are views, are no task,
    nor are concatenations that their producers write in place, nor slices that their
    readers read in place.

    Args:
        model_or_graph: An ONNX model (a ``ModelProto`` or a path) or a ``Graph``.
        target: The target the tasks are tuned for; None for the host.
        input_shapes: Sizes of the ONNX model's dynamic inputs, by input name.

    Returns:
        The tasks, each described by its operators and output shape, as in
        ``"conv2d+add+relu 1x56x56x64"``, and one weight per task.

    Raises:
        OnnxImportError: If the ONNX model cannot be imported (``UnsupportedOperatorError``
            for an operator tilecraft lacks).
        ImportError: If an ONNX model is given and the onnx package is not installed.
        TypeError: If ``input_shapes`` is given with a ``Graph``.
        TargetError: If ``target`` cannot be understood.

    Example:
        Tune a model's tasks into a log, then compile it::

            tasks, weights = tc.extract_tasks("resnet50.onnx")
            tc.TaskScheduler(tasks, weights).tune(tc.TuningOptions(num_measure_trials=2000,
                                                                   measure_callbacks=[tc.RecordToFile(log)]))
            model = tc.compile_model("resnet50.onnx", log=log)
    """
    target = target if isinstance(target, Target) else Target(target)
    graph = prepare_graph(model_or_graph, input_shapes, target)
    tasks: list[SearchTask] = []
    weights: list[int] = []
    index: dict[str, int] = {}
    parts = partition(graph)
    in_place = place(graph, parts).skipped
    for subgraph in parts:
        if subgraph.is_view or subgraph.outputs[0] in in_place:
            continue
        dag = subgraph_dag(graph, subgraph)
        n = index.setdefault(dag.workload_key, len(tasks))
        if n == len(tasks):
            tasks.append(SearchTask(compute_dag=dag, target=target, desc=describe(graph, subgraph)))
            weights.append(0)
        weights[n] += 1
    return tasks, weights


def print_tasks(tasks: list[SearchTask], weights: list[int], console=None) -> None:
    """A table of each task's operators, output shape, FLOPs and weight, with the weighted total, printed
    to standard output or a rich ``console``.

    Args:
        tasks: The tasks, as ``extract_tasks`` returns them (``desc`` read as operators and shape).
        weights: How many times the model runs each task.
        console: A ``rich.console.Console`` to print to; None for standard output.
    """
    from rich.table import Table

    from ..tables import print_table

    table = Table(title="Tasks", title_justify="left")
    for column in ("#", "task", "shape", "MFLOPs", "weight"):
        table.add_column(column, justify="left" if column in ("task", "shape") else "right")
    total = 0.0
    for n, (task, weight) in enumerate(zip(tasks, weights)):
        ops, _, shape = task.desc.partition(" ")
        flop = task.compute_dag.flop_count()
        total += flop * weight
        table.add_row(str(n), ops, shape, f"{flop / 1e6:.3f}", str(weight))
    table.add_section()
    table.add_row("", f"{len(tasks)} tasks, {sum(weights)} kernels", "", f"{total / 1e6:.3f}", "")
    print_table(table, console)
