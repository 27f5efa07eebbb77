#!/usr/bin/env bash
# The main job on a bundled default: sample images (a few bad ones included) -> Beam pipeline
# -> verified TFRecord shards -> a short training run. Everything lands in ./quickstart_out.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh runtime
OUT="${OUT:-quickstart_out}"
set -x
python -m beam_pipelines.samples --output "$OUT/images"
python -m beam_pipelines.images_to_tfrecord --input "$OUT/images" --output "$OUT/dataset" \
  --validation_fraction 0.2 --overwrite
