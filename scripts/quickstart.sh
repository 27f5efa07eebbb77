#!/usr/bin/env bash
# The main job on a bundled default: sample images (a few bad ones included) -> Beam pipeline
# -> verified TFRecord shards -> an HTML report on them -> a short training run -> diagnosis of its
# logs -> the model exported as a SavedModel -> three photos classified with it.
# Everything lands in ./quickstart_out (override with OUT=...). Rerunning starts afresh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh runtime
# Bytecode caches written even where the environment says not to: each step would otherwise
# compile Beam and TensorFlow from source again (about 10 CPU-s a step).
unset PYTHONDONTWRITEBYTECODE
OUT="${OUT:-quickstart_out}"
rm -rf "$OUT/model"
set -x
python -m beam_pipelines.samples --output "$OUT/images"
python -m beam_pipelines.images_to_tfrecord --input "$OUT/images" --output "$OUT/dataset" \
  --validation_fraction 0.2 --overwrite
python -m dataset_tools.verify "$OUT/dataset"
# The HTML report: samples per class, class balance, rejects, duplicates and near-duplicates
# (the sample set plants a validation image re-encoded into train: add --fail_on_leakage to
# fail on it, as a CI gate would).
python -m dataset_tools.inspect "$OUT/dataset" --out "$OUT/report"
python -m trainer.train --data "$OUT/dataset" --model_dir "$OUT/model" --model small_cnn \
  --image_size 64 --global_batch_size 32 --steps 300 --base_lr 0.2 --warmup_steps 20 \
  --eval_every 50
python -m trainer.diagnose "$OUT/model"
# The trained model as a SavedModel that takes image files' bytes, then three photos classified
# by it: the EXIF-rotated one, the PNG named .JPEG, and a plain JPEG.
python -m trainer.export "$OUT/model" "$OUT/exported/1" --overwrite
python -m trainer.predict "$OUT/exported/1" "$OUT/images/desert/desert_0000.JPEG" \
  "$OUT/images/desert/desert_0001.JPEG" "$OUT/images/ocean/ocean_0002.JPEG" --top_k 2
{ set +x; } 2>/dev/null
echo "Dataset report: $(cd "$OUT/report" && pwd)/index.html"
cat <<EOF

What to try next:
  source .venv/bin/activate                    # run the commands yourself (tfrecord-* on PATH)
  tensorboard --logdir $OUT/model              # the run's curves: loss, accuracy, input wait
  ls $OUT/dataset                              # shards, dataset.json, rejected.jsonl, duplicates.jsonl
  tfrecord-verify $OUT/dataset --deep          # decode every image as well
  tfrecord-predict $OUT/exported/1 "$OUT/images/red fox"   # a line per image; the bad files get an error line each
  tfrecord-pipeline --input ~/photos --output out/photos --validation_fraction 0.1 --stratify_validation
  tfrecord-inspect out/photos                  # the report, beside the dataset: out/photos-report/
  tfrecord-train --data out/photos --model_dir runs/photos --steps 1000 --global_batch_size 32
  tfrecord-export runs/photos models/photos/1  # then: tfrecord-predict models/photos/1 IMAGE_OR_DIR...
  tfrecord-pipeline --help                     # every flag, grouped; each command has --help
EOF
