#!/usr/bin/env python3
"""Write identity ONNX graphs, one per element type a picture becomes (FP32, FP16, UINT8): `x` [batch, d1, d2, d3],
every dimension dynamic, -> `y` = x. Served with an [image] table, a model that answers with its input shows the
tensor inferd made of a picture, which tests/python/test_images.py compares with Pillow's.

Run: python3 tests/data/pixels/make_pixels.py   (needs onnx: benches/python/requirements-models.txt)
"""

import pathlib

import onnx
from onnx import TensorProto, helper

HERE = pathlib.Path(__file__).resolve().parent

for name, dtype in (("fp32", TensorProto.FLOAT), ("fp16", TensorProto.FLOAT16), ("uint8", TensorProto.UINT8)):
    dims = ["batch", "d1", "d2", "d3"]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        f"pixels-{name}",
        [helper.make_tensor_value_info("x", dtype, dims)],
        [helper.make_tensor_value_info("y", dtype, dims)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="inferd-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = HERE / f"{name}.onnx"
    path.write_bytes(model.SerializeToString())
    print(path)
