"""The dataset tools import, and ``inspect --help`` and ``diff`` run, where TensorFlow cannot be
imported (``sys.modules["tensorflow"] = None``, as on a pipeline-only install).

Only ``verify --deep`` (decoding images) and reading ``gs://`` through ``tf.io.gfile`` need
TensorFlow, and they import it inside the functions that do so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_BLOCK_TENSORFLOW = 'import sys\nsys.modules["tensorflow"] = None  # as if not installed\n'
_NAMED = ("dataset_tools", "dataset_tools.diff", "dataset_tools.inspect.inspection",
          "dataset_tools.adopt")  # fmt: skip


def _run_blocked(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _BLOCK_TENSORFLOW + code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )


def _run_module_blocked(module: str, *argv: str) -> subprocess.CompletedProcess:
    """``python -m module argv...`` with TensorFlow blocked."""
    return _run_blocked(
        "import runpy\n"
        f"sys.argv = [{module!r}, *{list(argv)!r}]\n"
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
    )


def test_every_dataset_tools_module_imports_without_tensorflow() -> None:
    modules = sorted(
        ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for path in (REPO / "dataset_tools").rglob("*.py")
    )
    assert set(_NAMED) <= set(modules)
    done = _run_blocked(
        "import importlib, json\n"
        f"for name in {[*_NAMED, *modules]!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m, v in sys.modules.items() if v is not None)))\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert set(modules) <= set(loaded)
    assert not [m for m in loaded if m.split(".")[0] in ("tensorflow", "keras", "tensorboard")]


def test_inspect_help_runs_without_tensorflow() -> None:
    done = _run_module_blocked("dataset_tools.inspect", "--help")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--per_class" in done.stdout and "--fail_on_leakage" in done.stdout


def test_diff_runs_without_tensorflow(tmp_path: Path) -> None:
    from tests.test_diff import BASE, write_catalog_dataset

    old = write_catalog_dataset(tmp_path / "old", BASE)
    new = write_catalog_dataset(tmp_path / "new", BASE[1:])
    done = _run_module_blocked("dataset_tools.diff", str(old), str(new), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["changed"] is True and report["totals"]["removed"] == 1
