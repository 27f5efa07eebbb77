"""The shard cache's local names in pure Python agree with the TensorFlow graph's, byte for byte,
and the cache's Python side runs where TensorFlow cannot be imported."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from tests.fixtures.object_store import BucketEnv, upload_tree
from tests.fixtures.shards import WrittenDataset
from tfrecord_io.cache import local_name, local_names
from tfrecord_io.cache.handoff import local_name_graph
from tfrecord_io.cache.names import siphash24

REPO = Path(__file__).resolve().parents[1]
_BLOCK_TENSORFLOW = 'import sys\nsys.modules["tensorflow"] = None  # as if not installed\n'
# Characters that exercise both regular expressions and the byte cut: separators, URL syntax,
# whitespace and line breaks (RE2's "." stops at "\n" only), a NUL, and multi-byte UTF-8 from
# two to four bytes.
_ALPHABET = "abcXYZ019._-/ %?#&=+~:@!$'()*,;[]{}\\\t\n\r\x00\x85\u2028éß日本語🙂\u200b\ufeff"


def _uris() -> list[str]:
    uris = [
        "",
        "/",
        "s3://bucket/",
        "s3://bucket/dir/",
        "gs://bucket",
        "s3://bucket/train-00000-of-00004.tfrecord",
        "gs://b/a/b/c/validation-00001-of-00002.tfrecord",
        "s3://bucket/" + "x" * 200,
        "s3://bucket/" + "é" * 100,
        "s3://bucket/" + "🙂" * 90,
        "s3://bucket/a\nb/c",
        "a\nb",
        "s3://bucket/name with spaces?.tfrecord",
        "s3://bucket/%41%2F.tfrecord#frag",
    ]
    # Every length of the last SipHash word, and lengths around 256 (the length byte wraps).
    uris += ["s3://b/" + "y" * n for n in range(24)]
    uris += ["s3://b/" + "z" * n for n in range(245, 265)]
    rng = random.Random(20240617)
    uris += ["".join(rng.choices(_ALPHABET, k=rng.randrange(0, 160))) for _ in range(2000)]
    return uris


def test_python_names_match_tensorflow_byte_for_byte() -> None:
    uris = _uris()
    expected = [n.decode() for n in local_name_graph(tf.constant(uris)).numpy()]

    one_by_one = [local_name(uri) for uri in uris]
    batched = local_names(uris)  # the numpy path
    few = local_names(uris[:10])  # the pure-Python path

    assert [(u, n) for u, n, e in zip(uris, one_by_one, expected, strict=True) if n != e] == []
    assert batched == expected
    assert few == expected[:10]


def test_names_look_as_documented() -> None:
    name = local_name("s3://bucket/dir/train 00000 é.tfrecord")
    digest, base = name.split("-", 1)

    assert base == "train_00000__.tfrecord"
    assert 0 <= int(digest) < (1 << 62) - 1
    assert local_name("s3://bucket/dir/").endswith("-")
    assert len(local_name("s3://bucket/" + "x" * 300).split("-", 1)[1]) == 80


def test_siphash24_matches_the_reference_vectors() -> None:
    # The key 00 01 .. 0f and the messages 00 01 .. (n-1) of the SipHash paper and of
    # highwayhash's sip_hash_test.
    key = (int.from_bytes(bytes(range(8)), "little"), int.from_bytes(bytes(range(8, 16)), "little"))
    expected = {0: 0x726FDB47DD0E0E31, 15: 0xA129CA6149BE45E5, 63: 0x958A324CEB064572}

    assert {n: siphash24(key, bytes(range(n))) for n in expected} == expected


@pytest.mark.parametrize(
    "uri, error, message",
    [(b"s3://bucket/x", TypeError, "str"), ("s3://bucket/\udc80", ValueError, "Unicode")],
)
def test_names_reject_what_is_not_a_text_uri(uri: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        local_name(uri)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        local_names(["s3://bucket/ok"] * 40 + [uri])  # type: ignore[list-item]


@pytest.mark.slow
def test_the_cache_python_side_runs_without_tensorflow(
    s3_env: BucketEnv, jpeg_dataset: WrittenDataset, tmp_path: Path
) -> None:
    upload_tree(jpeg_dataset.root, s3_env.root)
    shards = [
        (f"{s3_env.root}/{s.file}", s.num_bytes, s.sha256)
        for s in jpeg_dataset.manifest.split("train").shards
    ]
    code = (
        "import hashlib, json\n"
        "from tfrecord_io.cache import CacheConfig, RemoteShard, open_shared_cache\n"
        f"shards = [RemoteShard(*s) for s in {shards!r}]\n"
        f"config = CacheConfig(cache_dir={str(tmp_path / 'cache')!r}, cache_bytes=1 << 20)\n"
        "cache, client = open_shared_cache(config, shards)\n"
        "with open(cache.fetch(shards[0].uri), 'rb') as f:\n"
        "    digests = [hashlib.sha256(f.read()).hexdigest()]\n"
        "for shard in shards[1:]:\n"
        "    with client.open(shard.uri) as f:\n"
        "        digests.append(hashlib.sha256(f.read()).hexdigest())\n"
        "stats = cache.stats.as_dict()\n"
        "cache.close()\n"
        "loaded = sorted(m for m, v in sys.modules.items() if v and m.split('.')[0] in "
        "('tensorflow', 'keras', 'tensorboard'))\n"
        "print(json.dumps({'digests': digests, 'stats': stats, 'loaded': loaded}))\n"
    )

    # The subprocess inherits the bucket's environment (endpoint and credentials).
    done = subprocess.run(
        [sys.executable, "-c", _BLOCK_TENSORFLOW + code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["loaded"] == []
    assert result["digests"] == [
        hashlib.sha256(p.read_bytes()).hexdigest() for p in jpeg_dataset.shard_paths("train")
    ]
    assert result["stats"]["downloads"] == len(shards)
