#!/usr/bin/env python3
"""Train and export the bundled `digits` models, deterministically.

The network is an MLP 64 -> 128 (ReLU) -> 10 trained on scikit-learn's bundled 8x8 digits. It takes raw pixel
values 0..16: the 1/16 input scaling used in training is folded into the first layer's weights, so clients send
the pixels as they are.

Writes, next to this script:
  digits/model.onnx                 ONNX (opset 17): input `input` FP32 [-1, 64] -> output `logits` FP32 [-1, 10]
  digits-candle/model.safetensors   the same weights for inferd's candle `mlp` architecture (fc1, fc2; torch layout)
  digits-fp16/model.onnx            the same network in FP16: FP16 weights, input and output
  digits-fp16-candle/model.safetensors  FP16 weights for the candle `mlp`
  ../tests/data/digits_heldout.json the held-out split (raw pixels and labels) the end-to-end tests classify, and
                                    reference logits for its first rows, computed here in float64 with numpy
and prints the held-out accuracy, checked through ONNX Runtime.

Requirements (a throwaway venv is enough): scikit-learn numpy onnx safetensors onnxruntime.
Run: python3 models/make_models.py
"""

import json
import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import save_file
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

HERE = pathlib.Path(__file__).resolve().parent
SEED = 0


def train():
    digits = load_digits()
    x = digits.data.astype(np.float32)  # raw pixels, 0..16
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=SEED, stratify=y)
    clf = MLPClassifier(hidden_layer_sizes=(128,), activation="relu", max_iter=500, random_state=SEED)
    clf.fit(x_train / 16.0, y_train)
    # torch layout: weight [out, in]; fold the 1/16 scaling into fc1. Row-major copies: safetensors writes an
    # array's memory as it lies, and a transposed view lies column-major.
    fc1_w = np.ascontiguousarray(clf.coefs_[0].T / 16.0, dtype=np.float32)
    fc1_b = np.ascontiguousarray(clf.intercepts_[0], dtype=np.float32)
    fc2_w = np.ascontiguousarray(clf.coefs_[1].T, dtype=np.float32)
    fc2_b = np.ascontiguousarray(clf.intercepts_[1], dtype=np.float32)
    return (fc1_w, fc1_b, fc2_w, fc2_b), (x_test, y_test)


def export_onnx(weights, path, dtype=np.float32):
    fc1_w, fc1_b, fc2_w, fc2_b = (w.astype(dtype) for w in weights)
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    inits = [
        numpy_helper.from_array(fc1_w, "fc1.weight"),
        numpy_helper.from_array(fc1_b, "fc1.bias"),
        numpy_helper.from_array(fc2_w, "fc2.weight"),
        numpy_helper.from_array(fc2_b, "fc2.bias"),
    ]
    nodes = [
        helper.make_node("Gemm", ["input", "fc1.weight", "fc1.bias"], ["hidden"], transB=1, name="fc1"),
        helper.make_node("Relu", ["hidden"], ["hidden_relu"], name="relu1"),
        helper.make_node("Gemm", ["hidden_relu", "fc2.weight", "fc2.bias"], ["logits"], transB=1, name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "digits",
        [helper.make_tensor_value_info("input", elem, ["batch", 64])],
        [helper.make_tensor_value_info("logits", elem, ["batch", 10])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="inferd")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def export_safetensors(weights, path, dtype=np.float32):
    fc1_w, fc1_b, fc2_w, fc2_b = (np.ascontiguousarray(w, dtype=dtype) for w in weights)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"fc1.weight": fc1_w, "fc1.bias": fc1_b, "fc2.weight": fc2_w, "fc2.bias": fc2_b}, str(path))


def reference_logits(weights, x):
    fc1_w, fc1_b, fc2_w, fc2_b = (w.astype(np.float64) for w in weights)
    hidden = np.maximum(x.astype(np.float64) @ fc1_w.T + fc1_b, 0.0)
    return hidden @ fc2_w.T + fc2_b


def accuracy_with_onnxruntime(path, x, y):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], {"input": x})
    return float((logits.argmax(axis=1) == y).mean())


def main():
    weights, (x_test, y_test) = train()
    onnx_path = HERE / "digits" / "model.onnx"
    export_onnx(weights, onnx_path)
    export_safetensors(weights, HERE / "digits-candle" / "model.safetensors")
    export_onnx(weights, HERE / "digits-fp16" / "model.onnx", np.float16)
    export_safetensors(weights, HERE / "digits-fp16-candle" / "model.safetensors", np.float16)
    data = HERE.parent / "tests" / "data" / "digits_heldout.json"
    data.parent.mkdir(parents=True, exist_ok=True)
    reference = reference_logits(weights, x_test[:16])
    data.write_text(
        json.dumps(
            {
                "pixels": x_test.astype(int).tolist(),
                "labels": y_test.tolist(),
                "reference_logits": [[round(v, 6) for v in row] for row in reference.tolist()],
            }
        )
    )
    acc = accuracy_with_onnxruntime(onnx_path, x_test, y_test)
    print(f"held-out accuracy (ONNX Runtime, {len(y_test)} images): {acc:.4f}")
    acc16 = accuracy_with_onnxruntime(HERE / "digits-fp16" / "model.onnx", x_test.astype(np.float16), y_test)
    print(f"held-out accuracy, FP16 graph (ONNX Runtime, {len(y_test)} images): {acc16:.4f}")


if __name__ == "__main__":
    main()
