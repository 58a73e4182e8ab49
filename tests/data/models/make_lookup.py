#!/usr/bin/env python3
"""Write tests/data/models/lookup/model.onnx: a Gather from a fixed table of 8 rows of 2 FP32 values, so that an
id out of the table's range makes ONNX Runtime fail at run time with INVALID_ARGUMENT: the client's fault, which
inferd must answer 400. `ids` INT64 [-1, 1] -> `vectors` FP32 [-1, 1, 2]; row i of the table is [i, -i].

Run: python3 tests/data/models/make_lookup.py   (needs onnx and numpy: benches/python/requirements-models.txt)
"""

import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = pathlib.Path(__file__).resolve().parent / "lookup" / "model.onnx"

table = np.stack([np.arange(8), -np.arange(8)], axis=1).astype(np.float32)
graph = helper.make_graph(
    [helper.make_node("Gather", ["table", "ids"], ["vectors"], axis=0)],
    "lookup",
    [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 1])],
    [helper.make_tensor_value_info("vectors", TensorProto.FLOAT, ["batch", 1, 2])],
    [numpy_helper.from_array(table, "table")],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="inferd-tests")
model.ir_version = 8
onnx.checker.check_model(model)
OUT.write_bytes(model.SerializeToString())
print(OUT)
