#!/usr/bin/env python3
"""Write the CLIP benchmark model: the tiny CLIP of tests/data/clip grown to openai/clip-vit-base-patch32's sizes
(vision: hidden 768, 12 layers, 12 heads, MLP 3072, 224 x 224 pictures in patches of 32; text: hidden 512, 12
layers, 8 heads, MLP 2048, 77 positions; a shared space of 512), with fixed-seed random weights under the same tensor
names and the tiny model's folder files (its preprocessor_config.json grown to 224, its tokenizer). Random weights
compute as trained ones do: the benchmark measures speed, never answers. Deterministic: the same bytes on every run.

Run: python3 benches/make_clip.py OUT    (needs numpy and safetensors: benches/python/requirements-models.txt)
Writes OUT/clip/, a model repository of one model.
"""

import json
import pathlib
import re
import shutil
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "data" / "clip" / "clip"
SEED = 224
LAYERS = 12
# Each tower's sizes, tiny and grown: hidden, MLP, heads; and positions (vision: 4 x 4 patches and the class token).
VISION = {"hidden_size": (32, 768), "intermediate_size": (64, 3072), "num_attention_heads": (4, 12),
          "image_size": (32, 224), "patch_size": (8, 32)}
TEXT = {"hidden_size": (32, 512), "intermediate_size": (64, 2048), "num_attention_heads": (4, 8),
        "max_position_embeddings": (16, 77)}
PROJECTION = (16, 512)


def grown_shape(name, shape):
    """A tiny tensor's shape at the benchmark's sizes: each dimension by what it is in its tower."""
    vision = name.startswith("vision_model.") or name.startswith("visual_projection")
    sizes = VISION if vision else TEXT
    table = {size: grown for size, grown in (sizes["hidden_size"], sizes["intermediate_size"])}
    if name.endswith("position_embedding.weight"):
        positions = (224 // 32) ** 2 + 1 if vision else 77
        return (positions, table[shape[1]])
    if name.endswith("patch_embedding.weight"):
        return (768, 3, 32, 32)
    if name in ("visual_projection.weight", "text_projection.weight"):
        return (PROJECTION[1], table[shape[1]])
    if name.endswith("token_embedding.weight"):
        return (shape[0], table[shape[1]])
    return tuple(table.get(d, d) for d in shape)


def main():
    out = pathlib.Path(sys.argv[1]) / "clip"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    rng = np.random.default_rng(SEED)
    tiny = load_file(TINY / "model.safetensors")
    weights = {}
    for name in sorted(tiny):
        match = re.match(r"(.*\.layers\.)(\d+)(\..*)", name)
        copies = [f"{match.group(1)}{i}{match.group(3)}" for i in range(LAYERS)] if match else [name]
        for copy in copies:
            shape = grown_shape(name, tiny[name].shape)
            if name.endswith(("layer_norm1.weight", "layer_norm2.weight", "layrnorm.weight", "layernorm.weight",
                              "final_layer_norm.weight")):
                value = np.ones(shape, dtype=np.float32)
            elif name == "logit_scale":
                value = np.array(np.log(100.0), dtype=np.float32)
            else:
                value = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
            weights[copy] = value
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((TINY / "config.json").read_text())
    for key, (_, grown) in VISION.items():
        config["vision_config"][key] = grown
    for key, (_, grown) in TEXT.items():
        config["text_config"][key] = grown
    for tower in ("vision_config", "text_config"):
        config[tower]["num_hidden_layers"] = LAYERS
        config[tower]["projection_dim"] = PROJECTION[1]
    config["projection_dim"] = PROJECTION[1]
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    processor = json.loads((TINY / "preprocessor_config.json").read_text())
    processor["size"] = {"shortest_edge": 224}
    processor["crop_size"] = {"height": 224, "width": 224}
    (out / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "model.toml"):
        shutil.copy(TINY / name, out / name)
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = 77
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    print(f"make_clip: {out} ({sum(v.size for v in weights.values()) / 1e6:.0f} M parameters)")


if __name__ == "__main__":
    main()
