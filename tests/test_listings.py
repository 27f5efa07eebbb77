"""Listings read as their formats define them (CSV by RFC 4180, JSON Lines by line); a line that
cannot be used, or a class name that cannot be stored, is rejected on its own with its line
number, and the job publishes (``beam_pipelines.inputs.listings``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from beam_pipelines import images_to_tfrecord
from beam_pipelines.elements import SourceFile
from beam_pipelines.inputs.listings import (
    check_label,
    display_label,
    labelled_source,
    listing_sources,
)
from tests.fixtures.images import make_image_tree
from tfrecord_io.source import load_manifest


def _images(root: Path, n: int) -> list[Path]:
    written = make_image_tree(root, {"src": n}, size=(40, 32))
    paths = written["src"]
    # Names a CSV must quote: a comma, a double quote, a newline.
    names = ["plain.jpg", "with, comma.jpg", 'with "quote".jpg', "with\nnewline.jpg"]
    renamed = []
    for i, path in enumerate(paths):
        target = path.with_name(names[i] if i < len(names) else f"img{i}.jpg")
        path.rename(target)
        renamed.append(target)
    return renamed


def _csv_field(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


LONG = "a long class name " * 17  # 306 characters
QUOTED = 'say "hi"'
TWO_LINES = "two\nlines"


def test_a_csv_listing_by_rfc_4180(tmp_path):
    images = _images(tmp_path / "images", 8)
    rows = [
        "uri,label",  # line 1
        f"{_csv_field(str(images[0]))},cat",  # 2
        f"{_csv_field(str(images[1]))},{_csv_field('red, fox')}",  # 3
        f"{_csv_field(str(images[2]))},{_csv_field(QUOTED)}",  # 4
        f"{_csv_field(str(images[3]))},{_csv_field(TWO_LINES)}",  # 5-7: the
        # file name and the label each hold a newline
        f"{images[4]},tab" + chr(9) + "here",  # 8: a control character in the label
        f"{images[5]},",  # 9: an empty label
        f"{images[6]},cat,extra",  # 10: three fields
        "",  # 11: blank
        f"{images[7]},{LONG}",  # 12: kept whole
        f"{images[0]},\u202egnp.exe",  # 13: a right-to-left override
    ]
    listing = tmp_path / "listing.csv"
    listing.write_text("\n".join(rows) + "\n", encoding="utf-8")
    sources = list(listing_sources(str(listing)))
    assert [s.label for s in sources] == [
        "cat",
        "red, fox",
        QUOTED,
        None,
        None,
        None,
        None,
        LONG.strip(),
        None,
    ]
    problems = [s.problem[0] if s.problem else None for s in sources]
    assert problems == [
        None,
        None,
        None,
        "bad_label",
        "bad_label",
        "bad_label",
        "bad_listing_line",
        None,
        "bad_label",
    ]
    assert "line 5 of" in sources[3].problem[1] and "U+000A" in sources[3].problem[1]
    assert sources[3].uri == str(images[3])  # the quoted newline stays in the file name
    assert "line 8 of" in sources[4].problem[1] and "U+0009" in sources[4].problem[1]
    assert "line 9 of" in sources[5].problem[1] and "empty" in sources[5].problem[1]
    assert sources[6].uri == f"{listing}#line=10" and "3 fields" in sources[6].problem[1]
    assert "U+202E" in sources[8].problem[1]

    output = tmp_path / "dataset"
    argv = ["--input", str(listing), "--output", str(output), "--image_size", "32"]
    assert images_to_tfrecord.main([*argv, "--num_shards", "1", "--max_bad_fraction", "1"]) == 0
    manifest = load_manifest(output)
    rejected = [json.loads(line) for line in (output / "rejected.jsonl").read_text().splitlines()]
    by_line = {r["detail"].split(" of ")[0]: r["reason"] for r in rejected}
    assert by_line == {
        "line 5": "bad_label",
        "line 8": "bad_label",
        "line 9": "bad_label",
        "line 10": "bad_listing_line",
        "line 13": "bad_label",
    }
    assert (manifest.counts.input, manifest.counts.written, manifest.counts.rejected) == (9, 4, 5)
    assert list(manifest.label_names) == sorted(["cat", "red, fox", QUOTED, LONG.strip()])


def test_a_jsonl_listing_by_line(tmp_path):
    images = _images(tmp_path / "images", 3)
    lines = [
        json.dumps({"uri": str(images[0]), "label": "cat"}),  # 1
        "{not json",  # 2
        json.dumps({"uri": str(images[1]), "label": "dog\u0000"}),  # 3
        json.dumps({"uri": str(images[2])}),  # 4: no label
        "",  # 5
        json.dumps({"uri": str(images[1]), "label": "dog"}),  # 6
    ]
    listing = tmp_path / "listing.jsonl"
    listing.write_bytes(("\n".join(lines) + "\n").encode() + b'{"uri": "\xff", "label": "x"}\n')
    output = tmp_path / "dataset"
    argv = ["--input", str(listing), "--output", str(output), "--image_size", "32"]
    assert images_to_tfrecord.main([*argv, "--num_shards", "1", "--max_bad_fraction", "1"]) == 0
    rejected = [json.loads(line) for line in (output / "rejected.jsonl").read_text().splitlines()]
    by_line = {r["detail"].split(" of ")[0]: r["reason"] for r in rejected}
    assert by_line == {
        "line 2": "bad_listing_line",
        "line 3": "bad_label",
        "line 4": "bad_listing_line",
        "line 7": "bad_listing_line",
    }
    manifest = load_manifest(output)
    assert (manifest.counts.input, manifest.counts.written, manifest.counts.rejected) == (6, 2, 4)


@pytest.mark.parametrize(
    "label, ok",
    [("cat", True), ("dög 🐕", True), ("x" * 300, True), ("", False), ("a\tb", False),
     ("a\u2028b", False), ("\u202eabc", False), ("zero\u200dwidth joiner", True)],
)  # fmt: skip
def test_class_names_that_cannot_be_stored_are_refused(label, ok):
    assert (check_label(label) is None) == ok
    source = labelled_source("/x.jpg", label, "here")
    assert (source == SourceFile("/x.jpg", label)) == ok


def test_long_class_names_are_shortened_only_for_display():
    assert display_label("x" * 300) == "x" * 39 + "…"
    assert display_label("short") == "short"
