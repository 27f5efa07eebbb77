"""``cliflags.lazy_names``: a package's public names load on first use, from one table."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from cliflags import lazy_names


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package ``planted_pkg`` with a module ``light`` and one that needs a missing module."""
    package = tmp_path / "planted_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "light.py").write_text("VALUE = 42\n")
    (package / "heavy.py").write_text("import planted_missing_dep\nTHING = 1\n")
    (package / "broken.py").write_text("import planted_other_missing\nOTHER = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for name in [m for m in sys.modules if m.startswith("planted_pkg")]:
        del sys.modules[name]


def _names(namespace: dict[str, Any]) -> tuple[Any, Any]:
    table = {
        "VALUE": "planted_pkg.light",
        "THING": "planted_pkg.heavy",
        "OTHER": "planted_pkg.broken",
    }
    return lazy_names("planted_pkg", namespace, table, install_hints={"planted_missing_dep": "X"})


def test_a_name_loads_on_first_use_and_is_kept(planted: Path) -> None:
    namespace: dict[str, Any] = {}
    getattr_, dir_ = _names(namespace)
    assert "planted_pkg.light" not in sys.modules
    assert dir_() == ["OTHER", "THING", "VALUE"]
    assert getattr_("VALUE") == 42
    assert "planted_pkg.light" in sys.modules
    assert namespace == {"VALUE": 42}


def test_an_unknown_name_is_an_attribute_error_naming_it(planted: Path) -> None:
    getattr_, _ = _names({})
    with pytest.raises(AttributeError, match="module 'planted_pkg' has no attribute 'absent'"):
        getattr_("absent")


def test_a_missing_dependency_with_a_hint_says_what_to_install(planted: Path) -> None:
    getattr_, _ = _names({})
    with pytest.raises(ImportError, match=r"^planted_pkg.THING needs X$"):
        getattr_("THING")
    # A missing module without a hint is not dressed up: its own error comes through.
    with pytest.raises(ModuleNotFoundError, match="planted_other_missing"):
        getattr_("OTHER")
