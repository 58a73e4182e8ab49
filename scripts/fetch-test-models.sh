#!/usr/bin/env bash
# Unpacks third-party ONNX models, exported by others and shipped inside PyPI wheels, beside their committed
# model.toml files in tests/data/third-party/ (the .onnx files are never committed): the file-type classifier of
# magika, and RapidOCR's PP-OCR text detector (dynamic height and width), text-direction classifier and text
# recogniser; NudeNet's YOLOv8 detector (AGPL-3.0: a test model only, never shipped). And real photos from
# scikit-image's wheel into tests/data/photos. The Python tests serve the models and compare inferd's answers with
# ONNX Runtime's own. Run by scripts/test.sh; the wheels stay in .cache/wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
export INFERD_CACHE_DIR=${INFERD_CACHE_DIR:-$PWD/.cache}
to=tests/data/third-party
./scripts/unpack-wheel.sh magika==1.0.3 magika/models/standard_v3_3/model.onnx "$to/magika"
ocr=rapidocr_onnxruntime/models
./scripts/unpack-wheel.sh rapidocr-onnxruntime==1.4.4 "$ocr/ch_PP-OCRv4_det_infer.onnx" "$to/ppocr-det"
./scripts/unpack-wheel.sh rapidocr-onnxruntime==1.4.4 "$ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx" "$to/ppocr-cls"
./scripts/unpack-wheel.sh rapidocr-onnxruntime==1.4.4 "$ocr/ch_PP-OCRv4_rec_infer.onnx" "$to/ppocr-rec"
./scripts/unpack-wheel.sh nudenet==3.4.2 nudenet/320n.onnx "$to/nudenet"
./scripts/unpack-wheel.sh scikit-image==0.26.0 skimage/data/ tests/data/photos
echo "fetch-test-models: third-party models in $to" >&2
