#!/usr/bin/env python3
"""transformers' answers for the tiny CLIP and SigLIP of this folder (made by make_clip.py) on scikit-image's photos
(tests/data/photos), for tests/python/test_clip.py.

For each model, photos.json holds:
- `photos`: each photo's embedding (unit length), its pixels made by the model's own image processor from
  preprocessor_config.json (transformers' Pillow processor: CLIPImageProcessor, SiglipImageProcessor), then
  get_image_features in float64;
- `texts`: each text's embedding (unit length), tokenized as the model's processor tokenizes (SigLIP: padded to its
  positions, and no attention mask);
- `zero_shot`: for each template, then each photo, the labels with their probabilities, best first, as transformers'
  zero-shot image classification pipeline scores them (a softmax over the labels; SigLIP, a sigmoid each). They are
  computed as the pipeline computes them, each sentence cut to the model's 16 positions (the tiny tokenizer makes
  the default "This is a photo of {}." 26 tokens long); that computation is checked against the pipeline itself on
  CLIP with the short template "a {}" (the pipeline cuts nothing, and pads SigLIP's texts to 64 tokens, more than
  this SigLIP's positions).

Run (from the repository root, in the venv of tests/data/architectures/requirements-fixtures.txt):

    .cache/fixture-env/bin/python tests/data/clip/make_photos.py
"""

import json
import pathlib

import numpy as np
import torch
import transformers
from PIL import Image
from transformers import AutoModel, AutoTokenizer, CLIPImageProcessor, SiglipImageProcessor, pipeline

HERE = pathlib.Path(__file__).resolve().parent
PHOTOS = HERE.parent / "photos"
SCRIPT = "tests/data/clip/make_photos.py"
# Square, landscape and portrait, a longer side that rounds differently down and to the nearest (rocket: 640 × 427
# → 47.96), grey, and with an alpha channel.
NAMES = ["astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg", "camera.png", "horse.png"]
TEXTS = ["a photo of a cat", "a rocket on its launch pad", "a cup of coffee", "an astronaut"]
LABELS = ["cat", "rocket", "coffee", "astronaut", "horse"]
TEMPLATES = ["This is a photo of {}.", "a {}"]


def unit(rows):
    rows = np.asarray(rows, dtype=np.float64)
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


def features(output):
    return output if isinstance(output, torch.Tensor) else output.pooler_output


def tokens(tokenizer, texts, siglip, positions):
    if siglip:
        # As SigLIP's own tokenizer gives them: padded to its positions, without an attention mask (its
        # model_input_names are input_ids alone), so the last position the text tower pools reads the padding.
        encoded = tokenizer(texts, padding="max_length", max_length=positions, truncation=True, return_tensors="pt")
        return {"input_ids": encoded["input_ids"]}
    return tokenizer(texts, padding=True, truncation=True, return_tensors="pt")


def zero_shot(model, tokenizer, pixels, siglip, positions, template):
    """The pipeline's scores, computed as it computes them."""
    sentences = [template.format(label) for label in LABELS]
    encoded = tokens(tokenizer, sentences, siglip, positions)
    with torch.no_grad():
        logits = model(pixel_values=pixels, **encoded).logits_per_image[0]
    probs = torch.sigmoid(logits) if siglip else logits.softmax(-1)
    ranked = sorted(zip(LABELS, probs.tolist()), key=lambda p: -p[1])
    return [{"label": label, "score": round(score, 8)} for label, score in ranked]


def make(name, processor_class):
    folder = HERE / name
    siglip = name == "siglip"
    model = AutoModel.from_pretrained(folder).double().eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    processor = processor_class.from_pretrained(folder)
    positions = model.config.text_config.max_position_embeddings
    out = {"photos": {}, "texts": {}, "zero_shot": {template: {} for template in TEMPLATES}}
    pictures = {}
    for photo in NAMES:
        image = Image.open(PHOTOS / photo)
        pixels = processor(images=image, return_tensors="pt")["pixel_values"].double()
        pictures[photo] = (image, pixels)
        with torch.no_grad():
            embedding = features(model.get_image_features(pixel_values=pixels))
        out["photos"][photo] = [round(float(v), 8) for v in unit(embedding.numpy())[0]]
        for template in TEMPLATES:
            out["zero_shot"][template][photo] = zero_shot(model, tokenizer, pixels, siglip, positions, template)
    encoded = tokens(tokenizer, TEXTS, siglip, positions)
    with torch.no_grad():
        embeddings = unit(features(model.get_text_features(**encoded)).numpy())
    out["texts"] = {text: [round(float(v), 8) for v in row] for text, row in zip(TEXTS, embeddings)}
    if not siglip:
        # The computation above is the pipeline's own.
        classify = pipeline("zero-shot-image-classification", model=folder, image_processor=processor)
        for photo, (image, _) in pictures.items():
            got = classify(image.convert("RGB"), candidate_labels=LABELS, hypothesis_template=TEMPLATES[1])
            want = out["zero_shot"][TEMPLATES[1]][photo]
            assert [g["label"] for g in got] == [w["label"] for w in want], (photo, got, want)
            assert np.allclose([g["score"] for g in got], [w["score"] for w in want], atol=1e-5), (photo, got, want)
    return out


def main():
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    refs = {
        "made_by": SCRIPT,
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "pillow": Image.__version__},
        "labels": LABELS,
        "templates": TEMPLATES,
        "clip": make("clip", CLIPImageProcessor),
        "siglip": make("siglip", SiglipImageProcessor),
    }
    (HERE / "photos.json").write_text(json.dumps(refs, indent=1) + "\n")


if __name__ == "__main__":
    main()
