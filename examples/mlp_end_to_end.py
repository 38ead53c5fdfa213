"""The MetaSchedule chapter's end-to-end example: a two-layer MLP for 28x28 images
(784 -> 128 -> 10, ReLU) written in NumPy, whose first layer ``linear0`` (dense + bias) is
tuned with tune_tir and dropped into the model as a plain callable.

Run: python examples/mlp_end_to_end.py [--trials 16] [--strategy replay-trace] [--work-dir DIR]

Weights and the image are random (no download): the point is the flow and the timing.
"""
import argparse
import tempfile
import timeit
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft import te

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--trials", type=int, default=16, help="max_trials_global for linear0")
parser.add_argument("--strategy", default="evolutionary", choices=["evolutionary", "replay-trace"])
parser.add_argument("--work-dir", type=Path, default=None, help="default: a new temporary directory")
args = parser.parse_args()
work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="tune_tmp_"))
target = "llvm --num-cores=2"

rng = np.random.default_rng(0)
params = {"w0": rng.standard_normal((128, 784), dtype=np.float32) / 28,
          "b0": rng.standard_normal(128, dtype=np.float32),
          "w1": rng.standard_normal((10, 128), dtype=np.float32) / 11,
          "b1": rng.standard_normal(10, dtype=np.float32)}
img = rng.random((1, 28, 28), dtype=np.float32)
class_names = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def numpy_linear0(x, w, b, out):
    np.matmul(x, w.T, out=out)
    np.add(out, b, out=out)


def mlp(data, linear0, lv0=np.empty((1, 128), np.float32)):
    """The model: linear0 is any callable ``linear0(x, w, b, out=...)``; the rest is NumPy."""
    linear0(data.reshape(1, 784), params["w0"], params["b0"], out=lv0)
    lv1 = np.maximum(lv0, 0.0)
    return lv1 @ params["w1"].T + params["b1"]


# linear0 as the chapter writes it: Y = X @ W.T, then Z = Y + B.
X = te.placeholder((1, 784), name="X")
W = te.placeholder((128, 784), name="W")
B = te.placeholder((128,), name="B")
k = te.reduce_axis((0, 784), name="k")
Y = te.compute((1, 128), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="Y")
Z = te.compute((1, 128), lambda i, j: Y[i, j] + B[j], name="Z")
mod_linear = tc.ComputeDAG([X, W, B, Z])

database = tc.tune_tir(mod=mod_linear, target=target, max_trials_global=args.trials,
                       num_trials_per_iter=min(args.trials, 64), work_dir=work_dir, task_name="main",
                       strategy=args.strategy)
sch = tc.compile_tir(database, mod_linear, target)
sch.trace.show()
linear0 = tc.build(sch, target)  # a plain callable: linear0(x, w, b) -> z, or linear0(x, w, b, out=z)

res_numpy = mlp(img, numpy_linear0)
res_tuned = mlp(img, linear0)
np.testing.assert_allclose(res_tuned, res_numpy, rtol=1e-5, atol=1e-5)
print(f"\nprediction, NumPy: {class_names[res_numpy.argmax()]}; with the tuned linear0: "
      f"{class_names[res_tuned.argmax()]}; outputs equal to 1e-5")


def median_us(fn, number=200, repeat=15):
    return float(np.median(timeit.repeat(fn, number=number, repeat=repeat))) / number * 1e6


x, z = img.reshape(1, 784), np.empty((1, 128), np.float32)
kernel_us = linear0.time_evaluator(number=200, repeat=15)(x, params["w0"], params["b0"], z).median * 1e6
print(f"linear0 alone: NumPy {median_us(lambda: numpy_linear0(x, params['w0'], params['b0'], z)):.1f} us; tuned: "
      f"the kernel {kernel_us:.1f} us, called from Python (argument checks included) "
      f"{median_us(lambda: linear0(x, params['w0'], params['b0'], out=z)):.1f} us")
print(f"whole model:   NumPy {median_us(lambda: mlp(img, numpy_linear0)):.1f} us, "
      f"with the tuned linear0 {median_us(lambda: mlp(img, linear0)):.1f} us")
print(f"the tuning run, trial by trial: {work_dir / 'tuning.log'}")
