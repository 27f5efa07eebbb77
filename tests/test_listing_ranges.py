"""A listing cut into ranges of whole records reads exactly as the whole file does, line numbers
and bad records included, on files made of what breaks naive cutting: quoted newlines, doubled
quotes, a quote inside an unquoted field, an unterminated quote, CRLF and lone CR endings, a
byte-order mark, bytes that are not UTF-8, blank lines and a missing last newline
(``beam_pipelines.inputs.listing_ranges``)."""

from __future__ import annotations

import json
import random

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_pipelines.elements import SourceFile
from beam_pipelines.engines.runners import resolve_runner_aliases
from beam_pipelines.inputs import listing_ranges as ranges_module
from beam_pipelines.inputs.listing_ranges import estimate_records, listing_ranges
from beam_pipelines.inputs.listings import listing_sources
from beam_pipelines.inputs.sources import ListSources

WHOLE = 1 << 40  # a range size no test file reaches: one range, the whole-file read

_CSV_FIELDS = [
    "a.jpg",
    "dir/ö.png",
    "cat",
    "",
    " spaced ",
    '"red, fox"',
    '"two\nlines"',
    '"two\r\nlines"',
    '"say ""hi"""',
    'in"side',  # a quote inside an unquoted field: taken as it is
    '"closed"junk',  # strict: "',' expected after '\"'"
    "tab\there",
    "\udcff",  # written as the byte 0xff: not UTF-8
    "\ufeffb.jpg",  # a byte-order mark inside the file: a character like any other
]
_CSV_ENDS = ["\n", "\r\n", "\r"]


def _csv_text(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(0, 14)):
        kind = rng.random()
        if kind < 0.08:
            lines.append("")
        elif kind < 0.14:
            lines.append("uri,label")
        else:
            lines.append(",".join(rng.choice(_CSV_FIELDS) for _ in range(rng.choice([1, 2, 2, 3]))))
    text = "".join(line + rng.choice(_CSV_ENDS if rng.random() < 0.2 else ["\n"]) for line in lines)
    if rng.random() < 0.2:
        text = text.rstrip("\r\n")  # no last newline
    if rng.random() < 0.1:
        text += 'x.jpg,"never closed\nmore\n'  # swallows the rest of the file
    if rng.random() < 0.2:
        text = "\ufeff" + text
    return text


def _jsonl_text(rng: random.Random) -> str:
    rows = [
        json.dumps({"uri": "a.jpg", "label": "cat"}),
        json.dumps({"uri": "b\nc.jpg", "label": "dög"}),  # an escaped newline
        json.dumps({"uri": "d.jpg"}),
        "{not json",
        "",
        "\udcff",
    ]
    text = "".join(rng.choice(rows) + rng.choice(["\n", "\n", "\r\n"]) for _ in range(12))
    return text if rng.random() < 0.7 else text.rstrip("\n")


def _write(path, text: str) -> str:
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    return str(path)


def _check_cuts(listing: str, size: int, range_bytes: int) -> None:
    parts = listing_ranges(listing, range_bytes)
    assert [p.start for p in parts] == [0, *(p.end for p in parts)][: len(parts)]
    assert (parts[-1].end if parts else 0) == size
    assert all(p.end - p.start >= range_bytes for p in parts[:-1])


@pytest.mark.parametrize("suffix, make", [(".csv", _csv_text), (".jsonl", _jsonl_text)])
def test_ranges_read_as_the_whole_file(tmp_path, monkeypatch, suffix, make):
    # Blocks of a few bytes, so that lines, records and the switch to the csv module's cuts
    # cross block ends.
    monkeypatch.setattr(ranges_module, "_BLOCK", 5)
    rng = random.Random(20261205)
    differing = 0
    for case in range(150):
        listing = _write(tmp_path / f"listing{case}{suffix}", make(rng))
        whole = list(listing_sources(listing, WHOLE))
        for range_bytes in (1, 2, 3, 7, 20, 64):
            assert list(listing_sources(listing, range_bytes)) == whole, (case, range_bytes)
            _check_cuts(listing, (tmp_path / f"listing{case}{suffix}").stat().st_size, range_bytes)
        differing += len(listing_ranges(listing, 1)) > 1
    assert differing > 100  # most files were really cut


def test_a_cut_never_falls_inside_a_quoted_field(tmp_path):
    text = "uri,label\n" + "".join(f'"img,{i}.jpg","line one\nline two"\n' for i in range(50))
    listing = _write(tmp_path / "quoted.csv", text)
    parts = listing_ranges(listing, 1)
    assert len(parts) == 51  # the header, then one record a range
    assert [p.first_line for p in parts] == [1] + list(range(2, 102, 2))
    sources = list(listing_sources(listing, 1))
    assert sources[7] == SourceFile(f"{tmp_path}/img,7.jpg", None, sources[7].problem)
    assert "line 16 of" in sources[7].problem[1]  # the label holds a newline: refused, named


def test_a_quote_after_the_first_block_is_cut_by_the_csv_module(tmp_path, monkeypatch):
    monkeypatch.setattr(ranges_module, "_BLOCK", 64)
    plain = "".join(f"p{i}.jpg,cat\n" for i in range(40))  # about 500 bytes, no quote
    text = plain + '"q.jpg","a\nb"\n' + 'bad"quote.jpg,cat\n' + '"x.jpg",dog\n' + '"open,\n1\n2\n'
    listing = _write(tmp_path / "late.csv", text)
    parts = listing_ranges(listing, 1)
    assert len(parts) == 40 + 4
    assert [p.first_line for p in parts[-4:]] == [41, 43, 44, 45]
    sources = list(listing_sources(listing, 1))
    assert sources[-4:-1] == [
        SourceFile(f"{tmp_path}/q.jpg", None, sources[-4].problem),
        SourceFile(f'{tmp_path}/bad"quote.jpg', "cat"),
        SourceFile(f"{tmp_path}/x.jpg", "dog"),
    ]
    assert sources[-1].problem[1].startswith(f"lines 45-47 of {listing}: not CSV")


def test_a_listing_without_records_has_no_ranges(tmp_path):
    assert listing_ranges(_write(tmp_path / "empty.csv", ""), 1) == []
    assert list(listing_sources(_write(tmp_path / "header.csv", "uri,label\n"), 1)) == []
    with pytest.raises(ValueError, match="range_bytes must be at least 1, got 0"):
        listing_ranges(str(tmp_path / "empty.csv"), 0)


def _ranged_listing(tmp_path) -> tuple[str, list[SourceFile]]:
    """A listing of many 40-byte ranges, with a quoted newline and a bad record in them, and
    what a whole-file read gives."""
    rows = [f'"img {i}.jpg",class{i % 3}' for i in range(30)]
    rows[17] = '"img\n17.jpg",class2'
    listing = _write(tmp_path / "list.csv", "uri,label\n" + "\n".join(rows) + "\n,cat\n")
    assert len(listing_ranges(listing, 40)) > 10
    expected = list(listing_sources(listing, WHOLE))
    assert expected[17].uri == f"{tmp_path}/img\n17.jpg"
    assert expected[-1].problem[1] == f"line 33 of {listing}: an empty uri"
    return listing, expected


def test_the_pipeline_reads_a_listing_in_ranges(tmp_path):
    listing, expected = _ranged_listing(tmp_path)
    with test_pipeline.TestPipeline() as p:
        assert_that((p | ListSources(listing, range_bytes=40))["sources"], equal_to(expected))


@pytest.mark.slow
def test_dask_workers_read_a_listing_in_ranges(tmp_path, dask_cluster):
    listing, expected = _ranged_listing(tmp_path)
    options = PipelineOptions(resolve_runner_aliases(dask_cluster.runner_args()))
    with beam.Pipeline(options=options) as p:
        assert_that((p | ListSources(listing, range_bytes=40))["sources"], equal_to(expected))


def test_a_listings_size_is_estimated_from_its_first_block(tmp_path):
    rng = random.Random(7)
    lines = [
        f"gs://b/{'x' * rng.randint(5, 80)}.jpg,class{rng.randint(0, 999)}" for _ in range(90_000)
    ]
    listing = tmp_path / "big.csv"
    _write(listing, "\n".join(lines) + "\n")
    assert listing.stat().st_size > 4 * ranges_module._BLOCK
    assert abs(estimate_records(str(listing)) - len(lines)) < 0.01 * len(lines)
    small = _write(tmp_path / "small.csv", "a.jpg,cat\nb.jpg,dog")
    assert estimate_records(small) == 2  # read whole: exact, a last line without newline too
    assert estimate_records(_write(tmp_path / "empty.csv", "")) == 0
    # A file the launcher never reads past its first block: sized, not read.
    sparse = tmp_path / "sparse.csv"
    _write(sparse, "".join(f"gs://bucket/train/{i:012d}.jpg,class\n" for i in range(40_000)))
    with open(sparse, "r+b") as handle:
        handle.truncate(40 << 30)
    assert abs(estimate_records(str(sparse)) - (40 << 30) / 41) < 0.001 * (40 << 30) / 41
