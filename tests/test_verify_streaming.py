"""verify builds a shard's report only when it checks the shard, and keeps only the failed ones:
its memory does not grow with the shard count by a report a shard (issue 34)."""

from __future__ import annotations

import gc
import json
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dataset_tools.adopt import adopt
from dataset_tools.verify.__main__ import main
from dataset_tools.verify.checks import check_shard
from dataset_tools.verify.report import ShardReport, VerifyReport
from dataset_tools.verify.verification import verify_dataset
from tests.fixtures.shards import write_foreign_shards

NUM_SHARDS = 40


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``NUM_SHARDS`` converter-style shards of two records each."""
    directory = tmp_path_factory.mktemp("many") / "shards"
    write_foreign_shards(directory, num_examples=2 * NUM_SHARDS, num_shards=NUM_SHARDS)
    return directory


def _adopted(shards: Path) -> Path:
    """The shards adopted where they are: ``dataset.json``, index files and a catalog."""
    adopt(str(shards / "train-*"), label_offset=1)
    return shards


@pytest.fixture(scope="module")
def many_shards(foreign: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import shutil

    return _adopted(Path(shutil.copytree(foreign, tmp_path_factory.mktemp("adopted") / "ds")))


# id -> a weak reference that removes itself when its report dies (reports are unhashable).
_LIVE: dict[int, weakref.ref[ShardReport]] = {}


@pytest.fixture(autouse=True)
def _track_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``ShardReport`` made during a test goes into ``_LIVE`` (weakly): counting them is
    then cheap, where scanning ``gc.get_objects()`` in a worker that holds TensorFlow took
    about 0.2 s a count."""
    made = ShardReport.__init__

    def init(self: ShardReport, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        key = id(self)
        _LIVE[key] = weakref.ref(self, lambda _, key=key: _LIVE.pop(key, None))

    monkeypatch.setattr(ShardReport, "__init__", init)


def _live_reports() -> int:
    return len(_LIVE)


def _live_reports_while_reading(root: Path) -> tuple[VerifyReport, list[int]]:
    """Verifies ``root``, counting the live shard reports each time a shard starts being read
    (``check_shard``, called once a shard by verify)."""
    counts: list[int] = []
    target = check_shard.__code__

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is target:
            counts.append(_live_reports())

    baseline = _live_reports()
    sys.setprofile(profile)
    try:
        report = verify_dataset(root)
    finally:
        sys.setprofile(None)
    return report, [c - baseline for c in counts]


@pytest.mark.slow
def test_reports_are_built_as_shards_are_read_and_sound_ones_not_kept(many_shards: Path) -> None:
    gc.collect()
    report, counts = _live_reports_while_reading(many_shards)
    assert report.ok, report.to_dict()
    assert len(counts) == NUM_SHARDS  # every shard read once
    # Built up front, all NUM_SHARDS reports would be alive from the first shard read on.
    assert max(counts) <= 2, counts
    gc.collect()
    assert _live_reports() == 0  # the report rebuilds sound shards' reports when asked
    assert len(report.shards) == NUM_SHARDS and report.num_records == 2 * NUM_SHARDS
    shards = list(report.shards)
    assert [s.file for s in shards] == sorted(s.file for s in shards)
    assert all(s.ok and s.present and s.num_records == 2 for s in shards)
    assert all((s.num_bytes, s.sha256) == (s.expected_bytes, s.expected_sha256) for s in shards)
    assert report.shards[-1].file == shards[-1].file


def test_only_failed_shards_are_kept_in_full(foreign: Path, tmp_path: Path) -> None:
    import shutil

    root = _adopted(Path(shutil.copytree(foreign, tmp_path / "ds")))
    victim = sorted(root.glob("train-*-of-*[0-9]"))[7]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    report = verify_dataset(root)
    gc.collect()
    assert _live_reports() == 1
    assert [s.file for s in report.failed_shards] == [victim.name]
    assert report.shards[7] is report.failed_shards[0]
    assert [s.ok for s in report.shards].count(False) == 1
    assert report.num_records == sum(s.num_records or 0 for s in report.shards) < 2 * NUM_SHARDS


def _chunks_and_dumps(report: VerifyReport) -> Iterator[tuple[str, str]]:
    yield "".join(report.json_chunks()), json.dumps(report.to_dict(), indent=2)
    extra = {"checked": "somewhere/v2"}
    yield "".join(report.json_chunks(**extra)), json.dumps({**report.to_dict(), **extra}, indent=2)


def test_streamed_json_is_what_json_dumps_writes(many_shards: Path) -> None:
    shard = ShardReport("train", "a", "/d/a", 3, 10, "ab", problems=["one", "two"])
    for report in (
        verify_dataset(many_shards),
        VerifyReport("empty", False, [], ["a problem"]),
        VerifyReport("one", True, [shard], [], manifest_found=False),
    ):
        for streamed, dumped in _chunks_and_dumps(report):
            assert streamed == dumped


def test_cli_json_lists_every_shard(many_shards: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(many_shards), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["num_shards"] == len(printed["shards"]) == NUM_SHARDS
    assert printed["checked"] == str(many_shards)
    assert printed == {**verify_dataset(many_shards).to_dict(), "checked": str(many_shards)}
