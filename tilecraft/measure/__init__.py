"""Measuring candidates safely: ``MeasureInput -> LocalBuilder -> BuildResult ->
LocalRunner -> MeasureResult``, as in Ansor's LocalBuilder and LocalRunner.

  result.py   the values passed along, and ``MeasureErrorKind``, the error taxonomy
  builder.py  ``LocalBuilder``: replay, lower, generate C here; compile with gcc in parallel
  runner.py   ``LocalRunner``: check against NumPy and time, one candidate at a time,
              in a worker process that is restarted when a kernel kills it or hangs
  worker.py   that worker (run as ``python -m tilecraft.measure.worker``)
  overlap.py  a round built, then measured; GPU kernels measured while the rest still build
  rpc_protocol.py  the device server's wire protocol: HMAC-authenticated frames of JSON and bytes
  server.py   ``DeviceServer`` (``tilecraft serve``): measures for tuners elsewhere, in that worker
  rpc_runner.py  ``RPCRunner``: measures on device servers, as LocalRunner does here
  ray_runner.py  ``RayRunner`` and ``RayBuilder``: a measuring actor per device of a Ray cluster,
              builds as Ray tasks (Ray is imported only when one is made)

A bad candidate becomes a result with an error kind and a message; it never raises in
the tuner, and never takes the tuner's process down with it.
"""

from .builder import Builder, LocalBuilder
from .ray_runner import RayBuilder, RayRunner
from .result import BuildResult, MeasureErrorKind, MeasureInput, MeasureResult
from .rpc_protocol import AuthenticationError, RPCError
from .rpc_runner import RPCRunner
from .runner import LocalRunner, Runner
from .server import DeviceServer

__all__ = ["Builder", "LocalBuilder", "BuildResult", "MeasureErrorKind", "MeasureInput", "MeasureResult",
           "LocalRunner", "Runner", "RPCRunner", "RayRunner", "RayBuilder", "DeviceServer", "RPCError",
           "AuthenticationError"]
