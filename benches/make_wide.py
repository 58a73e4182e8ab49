#!/usr/bin/env python3
"""Write the `wide` benchmark models, and `identity` (its output is its input: pure transfer). `wide`: an MLP
512 -> 2048 (ReLU) -> 2048 (ReLU) -> 10 with fixed-seed random weights, as ONNX and as safetensors for inferd's
candle `mlp`. About 20 MB each, so they are made at set-up (scripts/setup.sh) rather than committed. Deterministic:
the same bytes on every run.

Writes a model repository:
  OUT/wide/model.onnx + model.toml                 ONNX (opset 17): `input` FP32 [-1, 512] -> `logits` FP32 [-1, 10]
  OUT/wide-candle/model.safetensors + model.toml   the same weights (torch layout, fc1..fc3)
  OUT/identity/model.onnx + model.toml             `input` FP32 [1, -1] -> `output`, the same

Run: python3 benches/make_wide.py OUT        (needs numpy, onnx, safetensors: benches/python/requirements-models.txt)
"""

import pathlib
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import save_file

LAYERS = [512, 2048, 2048, 10]
SEED = 512

BATCHING = """
[batching]
max_batch_size = 64
max_queue_delay_us = 0
max_queue_size = 4096
"""


def weights():
    rng = np.random.default_rng(SEED)
    out = {}
    for i, (n_in, n_out) in enumerate(zip(LAYERS, LAYERS[1:]), start=1):
        # He initialisation, torch layout [out, in]; the values only need to be finite and not all zero.
        out[f"fc{i}.weight"] = (rng.standard_normal((n_out, n_in)) * np.sqrt(2.0 / n_in)).astype(np.float32)
        out[f"fc{i}.bias"] = (rng.standard_normal(n_out) * 0.01).astype(np.float32)
    return out


def write_onnx(w, folder):
    nodes, last = [], "input"
    for i in range(1, len(LAYERS)):
        out = "logits" if i == len(LAYERS) - 1 else f"fc{i}"
        nodes.append(helper.make_node("Gemm", [last, f"fc{i}.weight", f"fc{i}.bias"], [out], transB=1, name=f"fc{i}"))
        if i < len(LAYERS) - 1:
            nodes.append(helper.make_node("Relu", [out], [f"relu{i}"], name=f"relu{i}"))
            last = f"relu{i}"
    graph = helper.make_graph(
        nodes, "wide",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", LAYERS[0]])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", LAYERS[-1]])],
        initializer=[numpy_helper.from_array(v, k) for k, v in w.items()],
    )
    save_onnx(
        graph, folder,
        "# The `wide` benchmark model (benches/make_wide.py): compute-bound, 10.5 MFLOP per row.\n"
        'backend = "onnx"\nfile = "model.onnx"\ndevice = "auto"\ninstances = 1\n' + BATCHING
    )


def save_onnx(graph, folder, toml):
    """Writes `graph` as opset 17 `model.onnx` in `folder`, checked, beside `model.toml` of `toml`."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="inferd")
    model.ir_version = 8
    onnx.checker.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    (folder / "model.toml").write_text(toml)


def write_safetensors(w, folder):
    folder.mkdir(parents=True, exist_ok=True)
    save_file(w, str(folder / "model.safetensors"))
    layers = ", ".join(map(str, LAYERS))
    (folder / "model.toml").write_text(
        "# The `wide` benchmark model for candle (benches/make_wide.py).\n"
        'backend = "candle"\nfile = "model.safetensors"\ndevice = "auto"\ninstances = 1\n\n'
        f'[candle]\narchitecture = "mlp"\nlayers = [{layers}]\nactivations = ["relu", "relu", "none"]\n'
        + BATCHING
        + f'\n[[input]]\nname = "input"\ndatatype = "FP32"\nshape = [-1, {LAYERS[0]}]\n'
        + f'\n[[output]]\nname = "logits"\ndatatype = "FP32"\nshape = [-1, {LAYERS[-1]}]\n'
    )


def write_identity(folder):
    """`identity`: `input` FP32 [1, -1] -> `output`, the same: a request's cost is moving its bytes
    (benches/transfer.py)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["input"], ["output"], name="identity")], "identity",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "width"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, "width"])],
    )
    save_onnx(
        graph, folder,
        "# The `identity` benchmark model (benches/make_wide.py): its output is its input, so a request costs only\n"
        "# the moving of its bytes.\n"
        'backend = "onnx"\nfile = "model.onnx"\ndevice = "auto"\ninstances = 1\n\n'
        "[batching]\nmax_batch_size = 0\nmax_queue_delay_us = 0\nmax_queue_size = 64\n"
    )


def main():
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".cache/models")
    w = weights()
    write_onnx(w, out / "wide")
    write_safetensors(w, out / "wide-candle")
    write_identity(out / "identity")
    print(f"make_wide: wrote {out / 'wide'}, {out / 'wide-candle'} and {out / 'identity'}")


if __name__ == "__main__":
    main()
