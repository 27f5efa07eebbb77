"""The progress bar knows how many images to expect: the image step receives the count of
inputs (the listing is complete before it starts), so the bar shows a total and time left."""

from __future__ import annotations

import re

from beam_pipelines import images_to_tfrecord
from beam_pipelines.progress import ProgressReporter, ProgressSpec
from tests.fixtures.images import make_image_tree


def test_the_bar_takes_a_total_and_shows_time_left(capsys):
    reporter = ProgressReporter(ProgressSpec("total", "bar", interval_s=0.01))
    reporter.set_total(4)
    reporter.add(prepared=3, rejected=1)
    reporter.close()
    err = capsys.readouterr().err
    assert "4/4" in err and "100%" in err and "<00:00" in err  # done of total, time left
    quiet = ProgressReporter(ProgressSpec("log", "log"))
    quiet.set_total(4)  # log lines are per process: the total changes nothing there
    quiet.add(prepared=1)
    assert quiet.line().startswith("images 1 ")


def test_a_run_with_a_bar_counts_towards_the_number_of_inputs(tmp_path, capsys):
    images = tmp_path / "images"
    make_image_tree(images, {"cat": 4, "dog": 3}, size=(40, 40))
    (images / "cat" / "broken.jpg").write_bytes(b"\xff\xd8 not really")
    argv = ["--input", str(images), "--output", str(tmp_path / "dataset"), "--num_shards", "1"]
    summary = images_to_tfrecord.run([*argv, "--max_bad_fraction", "0.5"], progress="bar")
    assert summary.published and summary.manifest.counts.input == 8
    err = capsys.readouterr().err
    assert re.search(r"images: 100%\|.*\| 8/8 \[", err), err[-2000:]
