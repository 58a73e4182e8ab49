#!/usr/bin/env python3
"""Make a tiny CLIP and a tiny SigLIP in the hub's layout, and transformers' reference outputs for them.

Each fixture is a model folder as the hub lays out a CLIP-style checkpoint (config.json with text_config and
vision_config, model.safetensors with CLIPModel's / SiglipModel's tensor names, preprocessor_config.json,
tokenizer.json, tokenizer_config.json, special_tokens_map.json), with the model.toml that serves it:

- clip/: CLIPModel, each tower hidden 32, 2 layers, 4 heads, quick GELU; pictures of 32 × 32 in patches of 8; text
  of at most 16 tokens, a byte-level BPE tokenizer whose <|startoftext|> and <|endoftext|> are its last ids (as
  openai/clip-vit-base-patch32's are), padding with <|endoftext|>, and config.json's legacy eos_token_id 2 (the text
  is pooled at its highest id, its end); projections of 16.
- siglip/: SiglipModel, the same sizes with tanh GELU, no class token, the vision tower pooled by its attention head,
  the text pooled at its last position after padding to 16 tokens with <pad> (the model has no attention mask);
  logit_scale and logit_bias.

Weights come from the transformers initialisation under a fixed seed, then every parameter is perturbed with seeded
noise (make_native.py's `perturb`), so that a wrong formula cannot hide behind identity norms or zero biases.

references.json holds, for each model: `ids` (each text's ids as its pipeline makes them: CLIP's alone, SigLIP's
padded to 16), `pixels` (two seeded pictures' pixel values as the model takes them, [3, 32, 32] each, made here
rather than by the processor), and transformers' outputs in float64 from the saved FP32 weights: `text_embeds` and
`image_embeds` (each tower's projection, not normalised) and `logits_per_image` (pictures × texts).

Run (from the repository root, in the venv of tests/data/architectures/requirements-fixtures.txt):

    .cache/fixture-env/bin/python tests/data/clip/make_clip.py
"""

import pathlib
import sys

import numpy as np
import torch
import transformers
from tokenizers import processors
from transformers import CLIPConfig, CLIPModel, SiglipConfig, SiglipModel

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "architectures"))
from make_native import perturb, round_rows, save_model, train_bytelevel_bpe, write_json, write_tokenizer  # noqa: E402

SCRIPT = "tests/data/clip/make_clip.py"
MAX_TOKENS = 16
TEXTS = ["a photo of a cat", "a photo of a dog", "the quick brown fox", "a", "numbers 1 2 3"]
MODEL_TOML = """# Tiny {kind}, random weights; made by tests/data/clip/make_clip.py. Pictures and texts into one space.
backend = "candle"
task = "embed"

[candle]
architecture = "clip"
"""
TOWER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def pictures(seed):
    """Two pictures' pixel values, [2, 3, 32, 32], as a normalised processor would give them (about -2 to 2)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.rand((2, 3, 32, 32), generator=gen, dtype=torch.float32) * 4.0 - 2.0


def features(output):
    """transformers 5 answers get_*_features with an output whose pooler_output is the projection."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


def references(model, ids, mask, pixels):
    model = model.double().eval()
    with torch.no_grad():
        text = features(model.get_text_features(input_ids=ids, attention_mask=mask))
        image = features(model.get_image_features(pixel_values=pixels.double()))
        logits = model(input_ids=ids, attention_mask=mask, pixel_values=pixels.double()).logits_per_image
    return {
        "ids": ids.tolist(),
        "pixels": [round_rows(p.reshape(3, -1)) for p in pixels],
        "text_embeds": round_rows(text),
        "image_embeds": round_rows(image),
        "logits_per_image": round_rows(logits),
    }


def make_clip(refs):
    specials = ["<|startoftext|>", "<|endoftext|>"]
    tok = train_bytelevel_bpe(300, specials)
    bos, eos = (tok.token_to_id(s) for s in specials)
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>", special_tokens=[("<|startoftext|>", bos), ("<|endoftext|>", eos)]
    )
    text = dict(TOWER, vocab_size=tok.get_vocab_size(), max_position_embeddings=MAX_TOKENS, hidden_act="quick_gelu",
                bos_token_id=0, eos_token_id=2, pad_token_id=1, projection_dim=16)
    vision = dict(TOWER, image_size=32, patch_size=8, hidden_act="quick_gelu", projection_dim=16)
    torch.manual_seed(3)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
    perturb(model, 303)
    folder = HERE / "clip"
    save_model(model, folder)
    (folder / "model.toml").write_text(MODEL_TOML.format(kind="CLIPModel"))
    special_map = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                   "unk_token": "<|endoftext|>"}
    write_tokenizer(folder, tok, special_map, {"model_max_length": MAX_TOKENS})
    write_json(folder / "preprocessor_config.json", {
        "image_processor_type": "CLIPImageProcessor", "do_resize": True, "size": {"shortest_edge": 32},
        "resample": 3, "do_center_crop": True, "crop_size": {"height": 32, "width": 32}, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "do_convert_rgb": True,
    })
    encoded = [tok.encode(t).ids for t in TEXTS]
    width = max(len(e) for e in encoded)
    ids = torch.tensor([e + [eos] * (width - len(e)) for e in encoded])
    mask = torch.tensor([[1] * len(e) + [0] * (width - len(e)) for e in encoded])
    refs["clip"] = references(model, ids, mask, pictures(31))
    # Padding changes nothing: each text alone gives the same projection.
    for row, e in enumerate(encoded):
        with torch.no_grad():
            alone = features(model.get_text_features(input_ids=torch.tensor([e])))
        assert np.allclose(alone[0].numpy(), np.array(refs["clip"]["text_embeds"][row]), atol=1e-6), row


def make_siglip(refs):
    specials = ["<pad>", "</s>", "<unk>"]
    tok = train_bytelevel_bpe(300, specials)
    pad, eos = tok.token_to_id("<pad>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", eos)])
    text = dict(TOWER, vocab_size=tok.get_vocab_size(), max_position_embeddings=MAX_TOKENS,
                hidden_act="gelu_pytorch_tanh", pad_token_id=pad, eos_token_id=eos, projection_size=32)
    vision = dict(TOWER, image_size=32, patch_size=8, hidden_act="gelu_pytorch_tanh")
    torch.manual_seed(4)
    model = SiglipModel(SiglipConfig(text_config=text, vision_config=vision))
    perturb(model, 404)
    folder = HERE / "siglip"
    save_model(model, folder)
    (folder / "model.toml").write_text(MODEL_TOML.format(kind="SiglipModel"))
    special_map = {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    write_tokenizer(folder, tok, special_map, {"model_max_length": MAX_TOKENS})
    write_json(folder / "preprocessor_config.json", {
        "image_processor_type": "SiglipImageProcessor", "do_resize": True, "size": {"height": 32, "width": 32},
        "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True,
    })
    # As SigLIP's pipeline tokenizes: padded to the longest the model takes, no attention mask.
    encoded = [tok.encode(t).ids[:MAX_TOKENS] for t in TEXTS]
    ids = torch.tensor([e + [pad] * (MAX_TOKENS - len(e)) for e in encoded])
    refs["siglip"] = references(model, ids, None, pictures(41))


def main():
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    refs = {"made_by": SCRIPT, "texts": TEXTS}
    make_clip(refs)
    make_siglip(refs)
    write_json(HERE / "references.json", refs, indent=None)


if __name__ == "__main__":
    main()
