"""``tfrecord-export`` and ``tfrecord-predict`` on a model the trainer trained.

The module's run: 36 images in 3 classes (JPEGs, PNGs with alpha, and large JPEGs that the
pipeline decodes at 1/8 scale) through the real pipeline at 32 px with half of them in
validation, 6 steps of ``small_cnn`` (``trainer.train.main`` in this process), then
``trainer.export.main``. Checked on it:

* the SavedModel serves JPEG and PNG bytes in a process with TensorFlow alone, where none of
  the project's packages can be imported;
* its ``preprocess`` signature, fed a source file, gives exactly the image the reader gave the
  model for that file's example, for every example of both splits;
* ``tfrecord-predict`` on the validation split's source files (from its catalog) is exactly as
  accurate as the trainer's own evaluation of that checkpoint, and gives each file the scores
  the checkpoint gives the reader's image of it;
* predict's output lines, ``--top_k``, ``--json``, ``--batch_size`` and bad files in a
  directory, and export's refusals.

Without training: a subclassed model of the user's own (no ``model.keras``: Keras cannot load
it back), the RAW/centre-crop preprocessing against the reader, and EXIF orientation applied on
the host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageOps

from tests.fixtures.images import (
    CLASS_COLOURS,
    encode,
    exif_rotated_jpeg,
    make_bad_files,
    make_image_tree,
    textured_rgb,
)
from tests.fixtures.pipeline_datasets import build_pipeline_dataset
from tests.fixtures.processes import REPO

CLASSES = {"cat": 8, "dog": 8, "red fox": 8}
STEPS = 6
# The packages of the project, which the SavedModel must not need.
OURS = ("schemas", "objstore", "cliflags", "catalog", "beam_pipelines", "tfrecord_io")
OURS += ("dataset_tools", "trainer", "tests")


@dataclasses.dataclass(frozen=True)
class Trained:
    images: Path
    dataset: Path
    run: Path
    exported: Path
    export_log: str


def _add_other_formats(images: Path) -> None:
    """Per class: two PNGs with a gradient of transparency and two 640x480 JPEGs."""
    for c, name in enumerate(sorted(CLASSES)):
        colour = CLASS_COLOURS[c]
        for i in range(2):
            rgba = np.dstack(
                [
                    textured_rgb((50, 40), seed=500 + 10 * c + i, colour=colour),
                    np.tile(np.linspace(120, 255, 50).astype(np.uint8), (40, 1)),
                ]
            )
            (images / name / f"alpha_{i}.png").write_bytes(encode(Image.fromarray(rgba), "PNG"))
            photo = Image.fromarray(textured_rgb((640, 480), seed=700 + 10 * c + i, colour=colour))
            (images / name / f"large_{i}.jpg").write_bytes(encode(photo, "JPEG", quality=90))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    import keras
    import tensorflow as tf

    from beam_pipelines import images_to_tfrecord
    from trainer.export import main as export
    from trainer.train import main as train

    root = tmp_path_factory.mktemp("export_predict")
    images, dataset, run = root / "images", root / "dataset", root / "run"
    make_image_tree(images, CLASSES, size=(48, 36))
    _add_other_formats(images)
    summary = images_to_tfrecord.run(
        [
            "--input", str(images), "--output", str(dataset), "--num_shards", "2",
            "--validation_fraction", "0.5", "--image_size", "32", "--progress", "off",
        ]
    )  # fmt: skip
    assert summary.published, summary.describe()
    try:
        status = train(
            [
                f"--data={dataset}", f"--model_dir={run}", f"--steps={STEPS}",
                "--global_batch_size=8", "--base_lr=0.8", "--warmup_steps=2",
                "--eval_every=1000", "--checkpoint_every=1000", "--seed=3",
            ]
        )  # fmt: skip
    finally:
        tf.random.set_seed(None)
        keras.config.set_dtype_policy("float32")
    assert status == 0
    exported = root / "exported" / "1"
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        assert export([str(run), str(exported)]) == 0
    return Trained(images, dataset, run, exported, output.getvalue())


def _catalog(dataset: Path, split: str) -> list[dict]:
    return pq.read_table(
        dataset / f"catalog-{split}.parquet", columns=["key", "uri", "label"]
    ).to_pylist()


@pytest.mark.slow
def test_export_writes_the_saved_model_its_assets_and_a_keras_file(trained: Trained) -> None:
    out = trained.exported
    assert (out / "saved_model.pb").is_file() and (out / "variables").is_dir()
    assert (out / "assets" / "labels.txt").read_text() == "cat\ndog\nred fox\n"
    info = json.loads((out / "assets" / "export.json").read_text())
    assert info["step"] == STEPS and info["class_names"] == ["cat", "dog", "red fox"]
    assert info["preprocessing"]["stored"]["encoding"] == "jpeg"
    assert (out / "model.keras").is_file()
    assert f"exported step {STEPS} " in trained.export_log
    assert "image_bytes string [None] -> scores float32 [None, 3]" in trained.export_log
    assert (trained.run / "run.json").is_file()  # what export read


def _tensorflow_alone(
    code: str, cwd: Path, *, cut: bool = True
) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh interpreter that cannot import the project: isolated mode (no
    PYTHONPATH, no current directory on the path) and the checkout's path entry (the editable
    install's) removed, which ``cut=False`` leaves, to show the guard fails then."""
    guard = (
        "import importlib.util, os, sys\n"
        + (
            f"sys.path = [p for p in sys.path if os.path.realpath(p or '.') != {str(REPO)!r}]\n"
            if cut
            else ""
        )
        # A file of the checkout, not of the environment inside it (.venv's own "tests").
        + "def in_checkout(path):\n"
        "    path = os.path.realpath(path or '/')\n"
        f"    return path.startswith({str(REPO) + os.sep!r}) and not path.startswith("
        "os.path.realpath(sys.prefix) + os.sep)\n"
        "def ours(name):\n"
        "    spec = importlib.util.find_spec(name)\n"
        "    places = [spec.origin] if spec and spec.origin else list(spec and "
        "spec.submodule_search_locations or [])\n"
        "    return any(in_checkout(p) for p in places)\n"
        f"importable = [n for n in {OURS!r} if ours(n)]\n"
        "assert not importable, f'the project is importable: {importable}'\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return subprocess.run(
        [sys.executable, "-I", "-c", guard + code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_the_saved_model_serves_jpeg_and_png_with_tensorflow_alone(
    trained: Trained, tmp_path: Path
) -> None:
    jpeg = trained.images / "dog" / "dog_0001.jpg"
    png = trained.images / "red fox" / "alpha_1.png"
    code = (
        "import json, sys\n"
        "import tensorflow as tf\n"
        f"model = tf.saved_model.load({str(trained.exported)!r})\n"
        "serve = model.signatures['serving_default']\n"
        f"data = [open(p, 'rb').read() for p in ({str(jpeg)!r}, {str(png)!r})]\n"
        "out = serve(image_bytes=tf.constant(data))\n"
        "loaded = sorted(n for n, m in sys.modules.items() if "
        "in_checkout(getattr(m, '__file__', None)))\n"
        "print(json.dumps({'scores': out['scores'].numpy().tolist(), 'dtype': "
        "out['scores'].dtype.name, 'classes': [[c.decode() for c in row] for row in "
        "out['classes'].numpy()], 'ours': loaded}))\n"
    )
    unguarded = _tensorflow_alone("", tmp_path, cut=False)
    assert "the project is importable: " in unguarded.stderr, unguarded.stderr
    done = _tensorflow_alone(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    # No error line from TensorFlow's C++ side (oneDNN's about integer transposes, say).
    assert not re.search(r"^E\d{4} ", done.stderr, re.M), done.stderr[-3000:]
    served = json.loads(done.stdout.strip().splitlines()[-1])
    assert served["ours"] == []
    assert served["dtype"] == "float32"
    assert served["classes"] == [["cat", "dog", "red fox"]] * 2
    scores = np.array(served["scores"])
    assert scores.shape == (2, 3)
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, rtol=1e-5)

    # The same scores as the same signature in this process, where the project is importable.
    import tensorflow as tf

    here = tf.saved_model.load(str(trained.exported)).signatures["serving_default"]
    expected = here(image_bytes=tf.constant([jpeg.read_bytes(), png.read_bytes()]))["scores"]
    np.testing.assert_allclose(scores, expected.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_preprocess_gives_the_images_the_reader_gave_the_model(trained: Trained) -> None:
    import tensorflow as tf

    import tfrecord_io
    from trainer.prediction import serving_bytes

    preprocess = tf.saved_model.load(str(trained.exported)).signatures["preprocess"]
    for split in ("train", "validation"):
        rows = _catalog(trained.dataset, split)
        read = tfrecord_io.make_dataset(
            trained.dataset,
            split,
            global_batch_size=64,
            training=False,
            read_config=tfrecord_io.ReadConfig(with_keys=True),
        )
        reader = {
            k.decode(): im for b in read for im, k in zip(b[0].numpy(), b[2].numpy(), strict=True)
        }
        data = [serving_bytes(Path(row["uri"]).read_bytes()) for row in rows]
        served = preprocess(image_bytes=tf.constant(data))["images"].numpy()
        assert served.dtype == np.uint8 and served.shape == (len(rows), 32, 32, 3)
        for row, image in zip(rows, served, strict=True):
            difference = np.abs(image.astype(int) - reader[row["key"]].astype(int))
            assert difference.max() == 0, (row["uri"], difference.max(), difference.mean())
    names = {Path(row["uri"]).name for row in _catalog(trained.dataset, "validation")}
    assert any(n.startswith("alpha") for n in names) and any(n.startswith("large") for n in names)


@pytest.mark.slow
def test_predict_is_as_accurate_as_the_trainers_evaluation(trained: Trained, capsys) -> None:
    import tensorflow as tf

    import tfrecord_io
    from trainer.diagnosis import read_scalars
    from trainer.predict import main as predict
    from trainer.run_record import read_run_record
    from trainer.saved_model import find_checkpoint, restore_model

    rows = _catalog(trained.dataset, "validation")
    names = json.loads((trained.dataset / "dataset.json").read_text())["label_names"]
    assert (
        predict([str(trained.exported), *(row["uri"] for row in rows), "--json", "--top_k", "3"])
        == 0
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["path"] for line in lines] == [row["uri"] for row in rows]
    correct = sum(
        line["classes"][0] == names[row["label"]] for line, row in zip(lines, rows, strict=True)
    )
    validation = dict(read_scalars(str(trained.run))["validation"]["accuracy"])
    assert len(rows) >= 12
    assert correct / len(rows) == pytest.approx(validation[STEPS], abs=1e-6)

    # Each file's scores are the checkpoint's on the reader's image of it (scores well inside
    # (0, 1) after a few steps, so a preprocessing that differs would show).
    record = read_run_record(str(trained.run))
    assert record is not None
    model, step = restore_model(record, find_checkpoint(str(trained.run)))
    assert step == STEPS
    read = tfrecord_io.make_dataset(
        trained.dataset,
        "validation",
        global_batch_size=64,
        training=False,
        read_config=tfrecord_io.ReadConfig(with_keys=True),
    )
    evaluated = {}
    for images, _, keys in read:
        scores = tf.nn.softmax(model(images, training=False)).numpy()
        evaluated.update({k.decode(): s for k, s in zip(keys.numpy(), scores, strict=True)})
    for line, row in zip(lines, rows, strict=True):
        served = dict(zip(line["classes"], line["scores"], strict=True))
        expected = evaluated[row["key"]]
        assert 0.2 < max(line["scores"]) < 0.9, line  # not saturated
        np.testing.assert_allclose([served[n] for n in names], expected, atol=1e-5)


@pytest.mark.slow
def test_predict_lines_top_k_json_and_bad_files(trained: Trained, tmp_path: Path, capsys) -> None:
    from trainer.predict import main as predict

    folder = tmp_path / "photos"
    (folder / "a").mkdir(parents=True)
    (folder / "b").mkdir()
    shutil.copy(trained.images / "cat" / "cat_0002.jpg", folder / "a" / "x.jpg")
    shutil.copy(trained.images / "dog" / "alpha_0.png", folder / "b" / "y.png")
    bad = make_bad_files((48, 36))
    (folder / "b" / "half.png").write_bytes(bad["truncated_png"])  # Pillow opens, TF fails
    (folder / "notes.jpg").write_bytes(bad["not_an_image_text"])  # Pillow cannot open it
    (folder / "readme.txt").write_text("not an image extension: never read")
    (folder / ".hidden.jpg").write_bytes(b"skipped as the pipeline skips it")
    model = str(trained.exported)

    assert predict([model, str(folder)]) == 1
    captured = capsys.readouterr()
    lines = [line.split("\t") for line in captured.out.splitlines()]
    assert [line[0] for line in lines] == [str(folder / "a" / "x.jpg"), str(folder / "b" / "y.png")]
    assert all(len(line) == 3 and line[1] in ("cat", "dog", "red fox") for line in lines)
    assert all(0 < float(line[2]) <= 1 for line in lines)
    errors = captured.err.splitlines()
    assert len(errors) == 3, captured.err
    assert f"{folder / 'b' / 'half.png'}: TensorFlow cannot decode it: " in errors[0]
    assert "node" not in errors[0] and "Graph execution" not in errors[0]  # the decoder's words
    assert (
        f"{folder / 'notes.jpg'}: not an image: no format Pillow reads starts b'just" in errors[1]
    )
    assert errors[2].endswith("2 of 4 files not classified")

    assert predict([model, str(folder / "a"), str(folder / "b" / "y.png"), "--top_k", "3"]) == 0
    top = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [len(line) for line in top] == [7, 7]
    for line, single in zip(top, lines, strict=True):
        assert sorted(line[1::2]) == ["cat", "dog", "red fox"] and line[1:3] == single[1:3]
        scores = [float(s) for s in line[2::2]]
        assert scores == sorted(scores, reverse=True) and sum(scores) == pytest.approx(1, abs=2e-4)

    assert (
        predict(
            [model, str(folder / "a"), str(folder / "b" / "y.png"), "--json", "--batch_size", "1"]
        )
        == 0
    )
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["path"] for r in records] == [line[0] for line in lines]
    assert [r["classes"] for r in records] == [[line[1]] for line in lines]
    assert [round(r["scores"][0], 4) for r in records] == [float(line[2]) for line in lines]


@pytest.mark.slow
def test_export_refuses_a_missing_checkpoint_a_used_directory_and_a_run_without_a_record_then_overwrites(
    trained: Trained, tmp_path: Path, capsys
) -> None:
    from trainer.export import main as export

    assert export([str(trained.run), str(tmp_path / "a"), "--checkpoint", "7"]) == 2
    assert f"keeps no checkpoint of step 7; it keeps steps {STEPS}" in capsys.readouterr().err
    assert export([str(trained.run), str(trained.exported)]) == 2
    assert "already holds files; pass --overwrite" in capsys.readouterr().err
    (tmp_path / "old_run").mkdir()
    assert export([str(tmp_path / "old_run"), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "has no run.json" in err and "pass --model" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()

    # --overwrite replaces what the directory held; --checkpoint N picks the step.
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "stale.txt").write_text("from an earlier export")
    assert (
        export([str(trained.run), str(tmp_path / "c"), "--checkpoint", str(STEPS), "--overwrite"])
        == 0
    )
    assert f"exported step {STEPS} " in capsys.readouterr().out
    assert (tmp_path / "c" / "saved_model.pb").is_file()
    assert not (tmp_path / "c" / "stale.txt").exists()


def test_a_misspelled_flag_fails_before_any_work(tmp_path: Path, capsys) -> None:
    from trainer.export import main as export
    from trainer.predict import main as predict

    with pytest.raises(SystemExit) as exported:
        export([str(tmp_path / "run"), str(tmp_path / "out"), "--chekpoint", "3"])
    assert exported.value.code == 2 and "--checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit) as predicted:
        predict([str(tmp_path / "model"), str(tmp_path), "--topk", "2"])
    assert predicted.value.code == 2 and "--top_k" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        predict([str(tmp_path / "model"), str(tmp_path), "--top_k", "0"])
    assert "expected an int >= 1, got 0" in capsys.readouterr().err
    assert predict([str(tmp_path / "model"), str(tmp_path)]) == 2
    assert "holds no SavedModel" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_exif_orientation_and_other_formats_are_prepared_on_the_host() -> None:
    from trainer.prediction import UnreadableImage, serving_bytes

    plain = encode(Image.fromarray(textured_rgb((40, 30), seed=1)), "JPEG", quality=90)
    assert serving_bytes(plain) is plain  # TensorFlow decodes it as Pillow does: sent as is
    rotated = exif_rotated_jpeg((64, 32), orientation=6)
    sent = Image.open(io.BytesIO(serving_bytes(rotated)))
    assert sent.format == "PNG" and sent.size == (32, 64)  # displayed upright, as the pipeline
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(rotated))).convert("RGB")
    assert np.array_equal(np.asarray(sent), np.asarray(upright))
    cmyk = encode(Image.fromarray(textured_rgb((20, 20), seed=2)).convert("CMYK"), "TIFF")
    assert Image.open(io.BytesIO(serving_bytes(cmyk))).mode == "RGB"
    with pytest.raises(UnreadableImage, match="empty file"):
        serving_bytes(b"")


def test_a_rotated_photo_reaches_the_model_as_the_pipeline_and_reader_gave_it() -> None:
    import tensorflow as tf

    from beam_pipelines.image.options import ImageOptions
    from beam_pipelines.image.prepare import prepare_image
    from schemas import KEY_ENCODED, KEY_LABEL
    from tfrecord_io.decode import DecodeConfig, decode_batch
    from trainer.prediction import serving_bytes
    from trainer.serving import ServingPreprocessing, StoredImages, preprocess

    # 640x480 stored sideways, EXIF orientation 6: the pipeline decodes it at 1/8 (draft),
    # turns it upright, resizes it to 32 px and stores a JPEG; the reader centre-crops that.
    photo = Image.fromarray(textured_rgb((640, 480), seed=9, colour=(40, 160, 60)))
    exif = Image.Exif()
    exif[0x0112] = 6
    data = encode(photo, "JPEG", quality=90, exif=exif.tobytes())
    stored = prepare_image(data, ImageOptions(image_size=32))
    assert (stored.width, stored.height) == (32, 43)  # upright: taller than wide
    reader = decode_batch(
        {KEY_ENCODED: tf.constant([stored.encoded]), KEY_LABEL: tf.constant([0], tf.int64)},
        None,
        DecodeConfig(image_size=24, training=False, encoding="jpeg", stored_size=32),
    )[0]
    spec = ServingPreprocessing(
        image_size=24, stored=StoredImages(encoding="jpeg", image_size=32, crop="none")
    )
    served = preprocess(tf.constant([serving_bytes(data, stored_side=32)]), spec)
    assert np.array_equal(served.numpy(), reader.numpy())


@pytest.mark.slow
def test_a_model_of_ones_own_exports_without_a_keras_file_when_keras_cannot_load_it(
    tmp_path: Path,
) -> None:
    import tensorflow as tf

    from tests.models.subclassed import build
    from trainer.run_record import RunRecord, write_run_record
    from trainer.saved_model import export_saved_model
    from trainer.serving import ServingPreprocessing, StoredImages, preprocess
    from trainer.user_model import build_checked_model

    # A run's checkpoint as the trainer lays it out, without training: the weights as built.
    run = tmp_path / "run"
    model = build_checked_model(
        build,
        name="tests.models.subclassed:build",
        image_size=24,
        num_classes=3,
        input_dtype="uint8",
        model_args={"width": 4},
    )
    checkpoint = tf.train.Checkpoint(model=model, step=tf.Variable(7, dtype=tf.int64))
    tf.train.CheckpointManager(
        checkpoint, str(run / "checkpoints"), 1, checkpoint_name="ckpt"
    ).save(7)
    spec = ServingPreprocessing(
        image_size=24, stored=StoredImages(encoding="png", image_size=28, crop="center")
    )
    record = RunRecord(
        model="tests.models.subclassed:build",
        model_args=("width=4",),
        num_classes=3,
        class_names=("a", "b c", "d"),
        preprocessing=spec,
    )
    write_run_record(str(run), record)

    # The same function with other arguments: its variables do not fit the checkpoint's.
    wider = dataclasses.replace(record, model_args=("width=8",))
    with pytest.raises(ValueError, match=r"does not hold the weights .* pass the --model"):
        export_saved_model(str(run), str(tmp_path / "out"), record=wider)
    assert not (tmp_path / "out").exists()

    result = export_saved_model(str(run), str(tmp_path / "out"))
    assert result.step == 7 and result.class_names == ("a", "b c", "d")
    assert result.keras_file is None and result.keras_note  # TinyNet has no get_config
    assert not (tmp_path / "out" / "model.keras").exists()
    served = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    data = [
        encode(Image.fromarray(textured_rgb((40, 30), seed=3)), "PNG"),
        encode(Image.fromarray(textured_rgb((30, 50), seed=4)), "JPEG", quality=90),
    ]
    out = served(image_bytes=tf.constant(data))
    expected = tf.nn.softmax(model(preprocess(tf.constant(data), spec), training=False))
    np.testing.assert_allclose(out["scores"].numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
    assert out["classes"].numpy().tolist() == [[b"a", b"b c", b"d"]] * 2


@pytest.fixture(scope="module")
def raw_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 16 fixture images at 32 px, RAW and centre-cropped."""
    return build_pipeline_dataset(
        tmp_path_factory.mktemp("raw"), "--encoding", "raw", "--crop", "center", "--progress", "off"
    )


@pytest.mark.parametrize("image_size", [32, 24, 40])
def test_raw_centre_crop_preprocessing_is_the_readers(raw_dataset: Path, image_size: int) -> None:
    import tensorflow as tf

    import tfrecord_io
    from trainer.serving import ServingPreprocessing, StoredImages, preprocess

    root = raw_dataset
    manifest = tfrecord_io.load_manifest(root)
    stored = StoredImages.from_manifest(manifest)
    assert stored is not None and stored.encoding == "raw" and stored.crop == "center"
    rows = _catalog(root, "train")
    read = tfrecord_io.make_dataset(
        root,
        "train",
        global_batch_size=64,
        training=False,
        image_size=image_size,
        read_config=tfrecord_io.ReadConfig(with_keys=True),
    )
    reader = {
        k.decode(): im for b in read for im, k in zip(b[0].numpy(), b[2].numpy(), strict=True)
    }
    data = tf.constant([Path(row["uri"]).read_bytes() for row in rows])
    served = preprocess(data, ServingPreprocessing(image_size=image_size, stored=stored)).numpy()
    for row, image in zip(rows, served, strict=True):
        difference = np.abs(image.astype(int) - reader[row["key"]].astype(int))
        assert difference.max() == 0, (row["uri"], difference.max(), difference.mean())
