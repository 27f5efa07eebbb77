"""Index files: the ``"<offset> <length>\\n"`` format DALI's tfrecord2idx writes."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from catalog.index_files import (
    check_contiguous,
    entries_from_payload_sizes,
    format_index,
    index_filename,
    parse_index,
)


def test_names_follow_the_shard_stem():
    assert index_filename("train-00003-of-00016.tfrecord") == "train-00003-of-00016.idx"
    assert index_filename("train-00003-of-01024") == "train-00003-of-01024.idx"
    assert index_filename("x.tfrecords") == "x.idx"
    with pytest.raises(ValueError, match="without directory"):
        index_filename("a/b.tfrecord")


def test_entries_from_payload_sizes():
    entries = entries_from_payload_sizes([10, 0, 5])
    assert entries.tolist() == [[0, 26], [26, 16], [42, 21]]
    assert entries_from_payload_sizes([]).shape == (0, 2)


def test_format_and_parse_round_trip():
    entries = entries_from_payload_sizes([100, 3, 70000])
    data = format_index(entries)
    assert data == b"0 116\n116 19\n135 70016\n"
    assert np.array_equal(parse_index(data), entries)
    assert parse_index(b"").shape == (0, 2)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"0 116\n116", "truncated"),
        (b"0 116\n116 x\n", "line 2"),
        (b"0 116 3\n", "line 1"),
        (b"-4 116\n", "line 1"),
        (b"0 15\n", "shorter than a record frame"),
    ],
)
def test_parse_names_the_bad_line(data, match):
    with pytest.raises(ValueError, match=f"shard.idx: .*{match}"):
        parse_index(data, name="shard.idx")


def test_check_contiguous():
    entries = entries_from_payload_sizes([10, 20])
    check_contiguous(entries, 62)
    with pytest.raises(ValueError, match="end at byte 62, but the shard has 63"):
        check_contiguous(entries, 63)
    with pytest.raises(ValueError, match="record 1 starts at byte 27, expected 26"):
        check_contiguous(np.array([[0, 26], [27, 36]]), 63)


@pytest.mark.slow
def test_same_bytes_as_dali_tfrecord2idx(tmp_path):
    """Our index for a TFRecord file equals what DALI's own tool writes for it."""
    from schemas.framing import write_frame

    payloads = [os.urandom(n) for n in (1, 300, 0, 4096, 17)]
    shard = tmp_path / "s.tfrecord"
    with open(shard, "wb") as f:
        for p in payloads:
            write_frame(f, p)
    theirs = tmp_path / "s.dali.idx"
    tool = os.path.join(os.path.dirname(sys.executable), "tfrecord2idx")
    # No TensorFlow in the tool's process: it then reads with plain open() (no tensorflow_io).
    subprocess.run([sys.executable, tool, str(shard), str(theirs)], check=True)
    ours = format_index(entries_from_payload_sizes(len(p) for p in payloads))
    assert theirs.read_bytes() == ours
    check_contiguous(parse_index(ours), shard.stat().st_size)
