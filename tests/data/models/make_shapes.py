#!/usr/bin/env python3
"""Write small ONNX graphs of the shapes real exports have, and one that makes NaN, for the tests:

- detector/model.onnx: `images` FP32 [batch, 3, H, W] with H and W dynamic, as a detector's input is. It pools by 2,
  upsamples by 2 and joins the result to its input, so it runs only at even H and W: at 1x1 (a guessed warm-up) or
  33x33, ONNX Runtime fails ("Non concat axis dimensions must match"). Output `features` FP32 [batch, 2, H, W]: a
  1x1 convolution of the six joined channels with fixed weights.
- fixed-batch/model.onnx: `x` FP32 [1, 4] -> `y` FP32 [1, 2] = x @ W + b, exported with a fixed batch of 1 as
  `torch.onnx.export` without `dynamic_axes` does.
- log/model.onnx: `x` FP32 [batch, 2] -> `y` = log(x): NaN for a negative x, -inf for 0, from finite inputs.

Run: python3 tests/data/models/make_shapes.py   (needs onnx and numpy: benches/python/requirements-models.txt)
"""

import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = pathlib.Path(__file__).resolve().parent


def save(graph, folder):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="inferd-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = HERE / folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    print(path)


conv_w = np.array([[1, 0, 0, 1, 0, 0], [0, 1, -1, 0, 0.5, 0.5]], dtype=np.float32).reshape(2, 6, 1, 1)
save(
    helper.make_graph(
        [
            helper.make_node("MaxPool", ["images"], ["pooled"], kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("Resize", ["pooled", "", "scales"], ["up"], mode="nearest"),
            helper.make_node("Concat", ["images", "up"], ["joined"], axis=1),
            helper.make_node("Conv", ["joined", "conv_w"], ["features"]),
        ],
        "detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 2, "height", "width"])],
        [
            numpy_helper.from_array(np.array([1, 1, 2, 2], dtype=np.float32), "scales"),
            numpy_helper.from_array(conv_w, "conv_w"),
        ],
    ),
    "detector",
)

w = np.array([[1, -1], [2, 0], [0, 3], [-1, 1]], dtype=np.float32)
b = np.array([0.5, -0.5], dtype=np.float32)
save(
    helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "fixed_batch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    ),
    "fixed-batch",
)

save(
    helper.make_graph(
        [helper.make_node("Log", ["x"], ["y"])],
        "log",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
    ),
    "log",
)
