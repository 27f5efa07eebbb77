"""The layering, checked on the import graph and by running the pipeline without TensorFlow.

* Each package imports only the packages below it (``LAYERS``): ``schemas/``, ``objstore/``,
  ``cliflags/`` and ``catalog/`` are the bottom floor; the pipeline, the reader, the dataset
  tools and the trainer stand on it; the tools and the trainer also use the reader.
* No module imports, at any depth (inside functions too), a module that imports it back: the
  module graph has no cycle.
* No library function is over 80 lines and no module over 800.
* No module uses another's private names (``from m import _x`` or ``m._x``), benchmarks
  included.
* ``beam_pipelines`` imports neither ``tfrecord_io`` nor ``trainer``, at any depth (also inside
  functions), and so never TensorFlow: Beam workers install the package without it.
* One storage path: only ``objstore`` uses the storage clients (s3fs, boto3,
  google-cloud-storage, and Beam's own S3 and GCS clients); the pipeline, the reader and the
  tools get their stores from ``objstore.storage_for``; nothing outside a named allowlist uses
  ``tf.io.gfile``.
* The pipeline runs where TensorFlow cannot be imported (``sys.modules["tensorflow"] = None``,
  as on a pipeline-only install) against a bucket behind a fault-injecting proxy: transient
  errors are retried, a missing file is rejected with its real reason, and the run publishes.
"""

from __future__ import annotations

import ast
import collections
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.fault_proxy import FaultPlan
from tests.fixtures.images import make_image_tree
from tests.fixtures.object_store import BucketEnv, Server, upload_tree

REPO = Path(__file__).resolve().parents[1]
PACKAGES: list[str] = [
    name.rstrip("*")
    for name in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
]
# Package -> the project packages it may import (besides itself).
BOTTOM_FLOOR = {"schemas": set(), "objstore": set(), "cliflags": set(), "catalog": {"schemas"}}
_FLOOR = set(BOTTOM_FLOOR)
LAYERS = {
    **BOTTOM_FLOOR,
    "beam_pipelines": _FLOOR,
    "tfrecord_io": _FLOOR,
    "dataset_tools": _FLOOR | {"tfrecord_io"},
    "trainer": _FLOOR | {"tfrecord_io"},
}
NEVER_FROM_BEAM = ("tfrecord_io", "trainer", "tensorflow", "tensorboard", "keras")
_BLOCK_TENSORFLOW = 'import sys\nsys.modules["tensorflow"] = None  # as if not installed\n'


def _imports(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports, at any depth of the file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _modules(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def _module_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, at any depth of the file.

    ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``; a
    package's lazy table (``{"name": "a.b"}``) counts as importing what it names.
    """
    files = {_module_name(path): path for package in LAYERS for path in _modules(package)}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    whole = f"{node.module}.{alias.name}"
                    edges.add(whole if whole in files else node.module)
            elif isinstance(node, ast.Dict):
                edges.update(
                    v.value for v in node.values if isinstance(v, ast.Constant) and v.value in files
                )
        graph[name] = {edge for edge in edges if edge in files and edge != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for edge in sorted(graph[node]):
            if edge not in index:
                visit(edge)
                low[node] = min(low[node], low[edge])
            elif edge in stack:
                low[node] = min(low[node], index[edge])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_module_graph_has_no_cycle() -> None:
    assert _cycles(_module_graph()) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_the_module_graph_sees_imports_inside_functions() -> None:
    graph = _module_graph()
    # tfrecord_io.source imports tfrecord_io.cache inside ResolvedSource.shard_cache only.
    assert "tfrecord_io.cache" in graph["tfrecord_io.source"]
    assert "tfrecord_io.cache" in graph["tfrecord_io"]  # the lazy table


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_each_package_imports_only_the_floors_below_it(package: str) -> None:
    allowed = LAYERS[package] | {package}
    offenders = {
        str(path.relative_to(REPO)): sorted((_imports(path) & set(PACKAGES)) - allowed)
        for path in _modules(package)
    }
    assert not {k: v for k, v in offenders.items() if v}, offenders
    assert set(LAYERS) == set(PACKAGES)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_uses(sources: dict[str, str]) -> list[str]:
    """Where a module uses a private name (``_x``) of another project module: ``from m import
    _x``, or ``m._x`` on a module it imported. ``sources``: module name -> its text."""
    found = []
    for name, text in sources.items():
        tree = ast.parse(text)
        modules = {}  # local name -> project module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] not in LAYERS:
                    continue
                for alias in node.names:
                    if _private(alias.name):
                        found.append(f"{name}: from {node.module} import {alias.name}")
                    if f"{node.module}.{alias.name}" in sources:
                        modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                modules.update(
                    (alias.asname or alias.name, alias.name)
                    for alias in node.names
                    if alias.name in sources
                )
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                base = node.value
                if isinstance(base, ast.Name) and modules.get(base.id, name) != name:
                    found.append(f"{name}: {base.id}.{node.attr}")
    return sorted(set(found))


def test_no_private_name_crosses_a_module() -> None:
    paths = [path for package in LAYERS for path in _modules(package)]
    paths += sorted((REPO / "benchmarks").glob("*.py"))
    assert _private_uses({_module_name(p): p.read_text() for p in paths}) == []


def test_the_private_name_check_finds_both_kinds_of_use() -> None:
    sources = {
        "schemas.a": "_hidden = 1\n",
        "schemas.b": "from schemas.a import _hidden\n",
        "schemas.c": "from schemas import a\nx = a._hidden\n",
        "schemas.d": "import schemas.a as m\nx = m._hidden + m.__name__.count('_')\n",
    }
    assert _private_uses(sources) == [
        "schemas.b: from schemas.a import _hidden",
        "schemas.c: a._hidden",
        "schemas.d: m._hidden",
    ]


MAX_FUNCTION_LINES, MAX_MODULE_LINES = 80, 800


def _too_long(path: Path) -> list[str]:
    """The functions of ``path`` over ``MAX_FUNCTION_LINES`` (decorators and docstring
    included), and the module itself if it is over ``MAX_MODULE_LINES``."""
    text = path.read_text()
    found = [
        f"{path.name}:{node.lineno} {node.name}, {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    if len(text.splitlines()) > MAX_MODULE_LINES:
        found.append(f"{path.name}: {len(text.splitlines())} lines")
    return found


def test_no_library_function_or_module_is_too_long() -> None:
    long = [found for package in LAYERS for p in _modules(package) for found in _too_long(p)]
    assert long == []


def test_the_length_check_finds_a_long_function(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f"def short():\n    pass\n\n\ndef long():\n{body}")
    assert _too_long(tmp_path / "m.py") == [f"m.py:5 long, {MAX_FUNCTION_LINES + 1} lines"]


def _run_blocked(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _BLOCK_TENSORFLOW + code],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=env,
    )


def test_beam_pipelines_never_imports_the_reader_trainer_or_tensorflow() -> None:
    offenders = {
        str(path.relative_to(REPO)): sorted(_imports(path) & set(NEVER_FROM_BEAM))
        for path in _modules("beam_pipelines")
    }
    assert not {k: v for k, v in offenders.items() if v}, offenders


# The storage clients: only objstore uses them. Beam's own S3 and GCS clients count too: the
# pipeline reaches s3:// and gs:// through objstore, as the reader and the tools do, and keeps
# Beam's FileSystems (which build those clients inside Beam) for Beam's IO alone.
STORAGE_CLIENTS = (
    "s3fs",
    "gcsfs",
    "boto3",
    "botocore",
    "google.cloud.storage",
    "apache_beam.io.aws",
    "apache_beam.io.gcp.gcsio",
    "apache_beam.io.gcp.gcsfilesystem",
)
# Where a module may still use TensorFlow's file ops, and why. Every open, list, stat and
# ranged read of the dataset goes through ``objstore.storage_for``.
STORAGE_ALLOWLIST = {
    # The dispatcher's journal directory, which TensorFlow's tf.data service itself writes.
    "tfrecord_io/service/server.py": ("tf.io.gfile",),
}
_TRAINER_GFILE = "trainer"  # model directories: checkpoints and SavedModels TensorFlow writes
# Where the pipeline, the reader and the tools get their stores (objstore.storage_for): the
# pipeline's storage helpers, the reader's sources, the command that adopts a dataset.
STORAGE_ENTRY_POINTS = {
    "beam_pipelines": ("beam_pipelines/engines/filesystems.py",),
    "tfrecord_io": ("tfrecord_io/source.py", "tfrecord_io/random_access.py"),
    "dataset_tools": ("dataset_tools/adopt.py",),
}
# objstore's functions that hand out a store, and its store classes (made only by those).
_STORE_FACTORIES = ("storage_for", "get_store")
_STORE_CLASSES = ("S3Store", "GCSStore", "LocalStore", "ObjectStore")


def _storage_uses(path: Path) -> set[str]:
    """The storage clients and TensorFlow file ops ``path`` uses (imports or ``tf.io.gfile``)."""
    text = path.read_text()
    found = set()
    for node in ast.walk(ast.parse(text)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Attribute) and ast.unparse(node) == "tf.io.gfile":
            found.add("tf.io.gfile")
        for name in names:
            found.update(
                client
                for client in STORAGE_CLIENTS
                if name == client or name.startswith(client + ".")
            )
    return found


def _objstore_calls(path: Path) -> set[str]:
    """The names of objstore's store factories and store classes ``path`` calls."""
    called = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in (*_STORE_FACTORIES, *_STORE_CLASSES):
                called.add(name)
    return called


def test_only_objstore_talks_to_storage() -> None:
    offenders = {}
    for package in LAYERS:
        if package in ("objstore", _TRAINER_GFILE):
            continue
        for path in _modules(package):
            relative = str(path.relative_to(REPO))
            used = _storage_uses(path) - set(STORAGE_ALLOWLIST.get(relative, ()))
            if used:
                offenders[relative] = sorted(used)
    assert offenders == {}
    # Each allowance is still used: the list shrinks as modules move to objstore.
    for relative, allowed in STORAGE_ALLOWLIST.items():
        assert set(allowed) <= _storage_uses(REPO / relative), relative
    # The trainer uses TensorFlow's file ops for its model directories only, never a client.
    for path in _modules(_TRAINER_GFILE):
        assert _storage_uses(path) <= {"tf.io.gfile"}, path


def test_the_storage_check_finds_each_kind_of_use(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "import boto3\nfrom google.cloud import storage\nimport s3fs.core\n"
        "from apache_beam.io.aws import s3io\nfrom apache_beam.io.gcp import gcsio\n"
        "def f(tf):\n    import gcsfs\n    return tf.io.gfile.exists('x')\n"
    )
    assert _storage_uses(tmp_path / "m.py") == {
        "boto3",
        "gcsfs",
        "google.cloud.storage",
        "s3fs",
        "apache_beam.io.aws",
        "apache_beam.io.gcp.gcsio",
        "tf.io.gfile",
    }


def test_pipeline_reader_and_tools_get_their_stores_from_objstore() -> None:
    # Each consumer's storage module asks objstore for its store; nobody outside objstore makes
    # one of objstore's stores itself (which would skip the shared client and settings).
    assert set(STORAGE_ENTRY_POINTS) == {"beam_pipelines", "tfrecord_io", "dataset_tools"}
    for package, entry_points in STORAGE_ENTRY_POINTS.items():
        for relative in entry_points:
            assert relative.startswith(package + "/"), relative
            assert "storage_for" in _objstore_calls(REPO / relative), relative
    made_directly = {
        str(path.relative_to(REPO)): sorted(_objstore_calls(path) & set(_STORE_CLASSES))
        for package in LAYERS
        if package != "objstore"
        for path in _modules(package)
    }
    assert {k: v for k, v in made_directly.items() if v} == {}
    # The pipeline's helpers are where its own code reaches storage outside Beam's IO: every
    # module of the pipeline that asks objstore for a store is that one.
    asking = {
        str(path.relative_to(REPO))
        for path in _modules("beam_pipelines")
        if _objstore_calls(path) & set(_STORE_FACTORIES)
    }
    assert asking == set(STORAGE_ENTRY_POINTS["beam_pipelines"])


def test_the_objstore_call_check_finds_factories_and_classes(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "import objstore\nfrom objstore import S3Store, storage_for\n"
        "a = objstore.get_store('s3://b')\nb = storage_for('/x')\nc = S3Store()\n"
        "d = objstore.StoreSettings()\n"
    )
    assert _objstore_calls(tmp_path / "m.py") == {"get_store", "storage_for", "S3Store"}


def test_the_package_and_the_samples_command_import_without_beam() -> None:
    # Names load on first use: the quickstart's first command starts at once (a Ctrl-C in a
    # seconds-long Beam import came before its one-line interrupt handling).
    code = "import beam_pipelines, beam_pipelines.samples\nassert 'apache_beam' not in sys.modules"
    done = _run_blocked(code)
    assert done.returncode == 0, done.stderr
    done = _run_blocked(
        "from beam_pipelines import ImagesToShards\nassert 'apache_beam' in sys.modules"
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_every_beam_pipelines_module_imports_with_tensorflow_blocked() -> None:
    # The whole import graph, as Python resolves it: every module of the bottom floor and of
    # beam_pipelines, in one process where TensorFlow cannot be imported.
    modules = [
        ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for package in (*BOTTOM_FLOOR, "beam_pipelines")
        for path in _modules(package)
    ]
    done = _run_blocked(
        "import importlib, json\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m, v in sys.modules.items() if v is not None)))\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert not [m for m in loaded if m.split(".")[0] in NEVER_FROM_BEAM]
    assert set(modules) <= set(loaded)


@pytest.mark.slow
def test_pipeline_runs_without_tensorflow_against_a_faulty_bucket(
    s3_env: BucketEnv,
    moto_server: Server,
    fault_proxy: Callable,
    tmp_path: Path,
) -> None:
    images = tmp_path / "images"
    made = make_image_tree(images, {"cat": 3, "dog": 3}, size=(40, 32))
    upload_tree(images, s3_env.uri("images"))
    # Every image GET fails on its first try (a body cut short), plus random 503s and resets.
    plan = FaultPlan(seed=5, error_rate=0.1, reset_rate=0.05, latency_s=0.002, fail_first="images")
    proxy = fault_proxy(moto_server.url, plan, flavour="s3")
    s3_env.point_at(proxy.url)
    missing_in_bucket = s3_env.uri("images", "dog", "gone.jpg")
    missing_on_disk = tmp_path / "nowhere" / "cat.jpg"
    rows = [
        f"{s3_env.uri('images', label, path.name)},{label}"
        for label, paths in made.items()
        for path in paths
    ]
    listing = tmp_path / "listing.csv"
    listing.write_text(
        "\n".join(["uri,label", *rows, f"{missing_in_bucket},dog", f"{missing_on_disk},cat"]) + "\n"
    )
    output = tmp_path / "dataset"
    argv = ["--input", str(listing), "--output", str(output), "--num_shards", "2"]
    # One image thread: the proxy draws its faults in request order, which threads would make
    # vary from run to run.
    argv += ["--image_size", "24", "--max_bad_fraction", "0.5", "--image_threads", "1"]

    done = _run_blocked(
        "import json\n"
        "from beam_pipelines import images_to_tfrecord\n"
        f"code = images_to_tfrecord.main({argv!r})\n"
        "loaded = sorted(m for m, v in sys.modules.items() if v and m.split('.')[0] in "
        f"{NEVER_FROM_BEAM!r})\n"
        "print(json.dumps({'code': code, 'loaded': loaded}))\n",
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )

    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result == {"code": 0, "loaded": []}, done.stderr[-4000:]
    # The run published, with every image that exists.
    manifest = json.loads((output / "dataset.json").read_text())
    assert manifest["counts"]["written"] == 6, manifest["counts"]
    # Transient errors were met on image reads, and retried: every image still made it.
    cut = [k for action, k in proxy.stats.fault_log if action == "truncate" and "images" in k]
    assert len(cut) >= 6, proxy.stats.fault_log
    # The missing files are rejected with their real reason, not a failed TensorFlow import.
    rejected = {
        row["uri"]: row
        for row in map(json.loads, (output / "rejected.jsonl").read_text().splitlines())
    }
    assert set(rejected) == {missing_in_bucket, str(missing_on_disk)}, rejected
    for uri, row in rejected.items():
        assert row["reason"] == "unreadable", row
        assert uri in row["detail"], row
        assert "TensorFlow" not in row["detail"] and "ImportError" not in row["detail"], row
        assert any(real in row["detail"].lower() for real in ("not found", "no such file")), row
    # The bucket's missing object was asked for once (plus the certain first-try fault): a
    # permanent error is not retried.
    # Counted as the attempts that reached the bucket (the proxy's injected faults left out).
    faults = collections.Counter(key for _, key in proxy.stats.fault_log)
    gone = {k: n - faults[k] for k, n in proxy.stats.attempts_by_request.items() if "gone.jpg" in k}
    assert gone and max(gone.values()) <= 1, (gone, proxy.stats.fault_log)
