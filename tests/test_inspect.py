"""The dataset report: what it reads, what it shows, on local disks and buckets."""

from __future__ import annotations

import json
import shutil

import pytest
from PIL import Image

from dataset_tools.inspect import __main__ as inspect_cli
from dataset_tools.inspect.inspection import gather, histogram, imbalance
from tests.fixtures.object_store import upload_tree
from tfrecord_io import random_access

PER_CLASS = 4


@pytest.fixture
def built(sample_datasets):
    """The sample set's images and its dataset (``--leakage report``)."""
    return sample_datasets.images, sample_datasets.report.path


@pytest.mark.slow
def test_report_shows_the_dataset_and_reads_only_the_records_it_shows(built, tmp_path, monkeypatch):
    images, dataset = built
    manifest = json.loads((dataset / "dataset.json").read_text(encoding="utf-8"))
    reads = []
    real = random_access.read_range

    def counting(path, start, end):
        reads.append((path, start, end))
        return real(path, start, end)

    monkeypatch.setattr("dataset_tools.inspect.inspection.read_range", counting)
    assert inspect_cli.main([str(dataset), "--out", str(tmp_path / "r"), "--per_class", "4"]) == 0

    stats = json.loads((tmp_path / "r" / "stats.json").read_text(encoding="utf-8"))
    assert stats["counts"] == manifest["counts"]
    assert {n: s["examples"] for n, s in stats["splits"].items()} == {
        n: s["num_examples"] for n, s in manifest["splits"].items()
    }
    for name, split in manifest["splits"].items():
        assert stats["splits"][name]["class_counts"] == split["class_counts"]
    # Only the samples and the near-duplicate pairs' members were read, each by its range.
    shown = {s["key"] for rows in stats["samples"].values() for s in rows}
    assert all(len(rows) == PER_CLASS for rows in stats["samples"].values())
    assert stats["records_read"] == len(reads) <= len(shown) + 2 * stats["near_duplicates"]["pairs"]
    assert len(reads) < manifest["counts"]["written"]
    assert all(end - start < 200_000 for _, start, end in reads)
    assert stats["near_duplicates"]["leakage"] == 1
    assert stats["near_duplicates"]["cross_class"] == 1
    assert stats["rejected"]["by_reason"] == {"empty_file": 1, "not_an_image": 1, "truncated": 1}
    assert stats["duplicates"] == {"count": 1, "label_conflicts": 0}
    assert stats["distributions"]["source_format"] == {"JPEG": 38, "PNG": 4}

    html = (tmp_path / "r" / "index.html").read_text(encoding="utf-8")
    assert "http://" not in html and "https://" not in html  # nothing to fetch
    assert html.count('class="sample"') == PER_CLASS * len(manifest["label_names"])
    assert html.count('class="pair leakage"') == 1
    assert "partial: the file ends early" in html  # the truncated JPEG, as far as it goes
    sheet = Image.open(tmp_path / "r" / "contact_sheet.png")
    assert sheet.width > PER_CLASS * 160 and sheet.height > len(manifest["label_names"]) * 160


@pytest.mark.slow
def test_same_seed_same_samples_other_seed_others(built, tmp_path):
    _, dataset = built
    one = gather(str(dataset), per_class=3, seed=5).stats["samples"]
    two = gather(str(dataset), per_class=3, seed=5).stats["samples"]
    other = gather(str(dataset), per_class=3, seed=6).stats["samples"]
    assert one == two
    assert one != other


@pytest.mark.slow
def test_fail_on_leakage_fails_on_the_planted_pair_and_passes_once_moved(
    built, sample_datasets, tmp_path, capsys
):
    _, dataset = built
    argv = [str(dataset), "--out", str(tmp_path / "r"), "--fail_on_leakage"]
    assert inspect_cli.main(argv) == 1
    out, err = capsys.readouterr()
    assert err.startswith(
        "FAILED: 1 train-validation leakage pair (a validation example with a near-duplicate "
        "in train, within 8 bits); see the report's near-duplicates section; to fix, rebuild "
        "with --leakage move_to_train: it moves the validation member of each leaking pair into "
        f"train, before the shards are written; with --base {dataset} and a new --output"
    ), err
    assert out.splitlines()[-1].startswith("report: ")  # the fix is said once, on stderr
    # The report's banner says it too.
    html = (tmp_path / "r" / "index.html").read_text(encoding="utf-8")
    banner = html.split('id="leakage-verdict"')[1].split("</div>")[0]
    assert "1 train–validation leakage pair</b>" in banner
    assert "To fix: rebuild with --leakage move_to_train: it moves the validation member" in banner
    assert inspect_cli.main([str(dataset), "--out", str(tmp_path / "r1")]) == 0
    assert "\nleakage: rebuild with --leakage move_to_train" in capsys.readouterr().out
    moved = sample_datasets.moved.path
    assert inspect_cli.main([str(moved), "--out", str(tmp_path / "r2"), "--fail_on_leakage"]) == 0
    assert "move_to_train" not in capsys.readouterr().out
    html = (tmp_path / "r2" / "index.html").read_text(encoding="utf-8")
    assert 'id="leakage-remedy"' not in html and "rebuild with" not in html


def test_without_out_the_report_goes_beside_the_dataset(pipeline_dataset, tmp_path, capsys):
    dataset = tmp_path / "out" / "photos"
    shutil.copytree(pipeline_dataset, dataset)  # the shared dataset is read-only
    before = sorted(p.name for p in dataset.iterdir())
    assert inspect_cli.main([str(dataset), "--per_class", "1"]) == 0
    report = tmp_path / "out" / "photos-report"
    assert (report / "index.html").is_file() and (report / "stats.json").is_file()
    assert sorted(p.name for p in dataset.iterdir()) == before  # nothing added inside
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == f"report: {report / 'index.html'}"


def test_default_out_is_a_sibling_and_a_bucket_needs_out(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for given in ("out/photos", "out/photos/", "out/photos/dataset.json", "file://out/photos"):
        assert inspect_cli.default_out(given) == str(tmp_path / "out" / "photos-report"), given
    for uri in ("s3://bucket/photos", "gs://bucket/photos"):
        with pytest.raises(SystemExit) as exit_info:
            inspect_cli.main([uri])
        assert exit_info.value.code == 2
        assert f"--out is required for a dataset at {uri}: the report is written to a local " \
            "directory" in capsys.readouterr().err  # fmt: skip


@pytest.mark.slow
def test_pairs_are_computed_from_the_catalogs_without_the_report(built, tmp_path):
    _, dataset = built
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    (copy / "near_duplicates.jsonl").unlink()
    near = gather(str(copy), per_class=1).stats["near_duplicates"]
    assert near["source"].startswith("computed")
    assert (near["pairs"], near["leakage"], near["cross_class"]) == (2, 1, 1)


@pytest.mark.slow
def test_a_damaged_catalog_is_named_and_exits_2(built, tmp_path, capsys):
    _, dataset = built
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    catalog = copy / "catalog-train.parquet"
    catalog.write_bytes(catalog.read_bytes()[:-10] + b"0123456789")
    assert inspect_cli.main([str(copy), "--out", str(tmp_path / "r")]) == 2
    assert "catalog-train.parquet is damaged" in capsys.readouterr().err


def test_missing_dataset_exits_2(tmp_path, capsys):
    assert inspect_cli.main([str(tmp_path / "nothing"), "--out", str(tmp_path / "r")]) == 2
    assert "has no dataset.json" in capsys.readouterr().err


def test_bad_flags_exit_2(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        inspect_cli.main([str(tmp_path), "--out", str(tmp_path / "r"), "--per_class", "0"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        inspect_cli.main([str(tmp_path), "--out", str(tmp_path / "r"), "--per-clas", "3"])


@pytest.mark.slow
@pytest.mark.parametrize("env_name", ["s3_env", "gcs_env"])
def test_report_on_a_bucket_equals_the_local_one(built, tmp_path, request, env_name):
    _, dataset = built
    bucket = request.getfixturevalue(env_name)
    upload_tree(dataset, bucket.uri("ds"))
    local = gather(str(dataset), per_class=2, seed=3).stats
    remote = gather(bucket.uri("ds"), per_class=2, seed=3).stats
    # The fix for leakage names the dataset where it is: --base on the bucket.
    assert f"--base {bucket.uri('ds')} " in remote["near_duplicates"].pop("remedy")
    assert local["near_duplicates"].pop("remedy")
    for name in ("counts", "splits", "samples", "near_duplicates", "rejected", "distributions"):
        assert remote[name] == local[name], name


def test_histogram_and_imbalance():
    h = histogram([1, 5, 5, 50, float("nan")], [0, 4, 10])
    assert h["counts"] == [1, 2, 1] and h["median"] == 5
    assert imbalance({"a": 10, "b": 10})["flagged"] is False
    assert imbalance({"a": 16, "b": 10}) == {
        "smallest": "b",
        "largest": "a",
        "max_over_min": 1.6,
        "missing": [],
        "flagged": True,
    }
    assert imbalance({"a": 3, "b": 0})["missing"] == ["b"]
