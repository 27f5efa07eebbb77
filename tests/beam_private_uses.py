"""Finds the project's uses of Apache Beam's private names, statically (``ast``).

Used by ``tests/test_beam_internals.py``: outside ``beam_pipelines/engines/beam_internals.py``
there must be none. A use is

- an import of a name starting with ``_`` from ``apache_beam...``;
- ``x._name`` or ``getattr(x, "_name")`` (``hasattr`` too), where ``x`` is (an attribute of) a name bound by an
  ``apache_beam`` import, or by a ``for`` loop over such names;
- in a module that imports Beam, ``x._name`` where ``_name`` is a private name Beam defines
  (``def _name``, ``class _name``, ``self._name =``) and the project defines nowhere: Beam's
  private attributes read from its objects (a runner's result, a job server, a side input),
  whatever they were bound to;
- an assignment to an attribute of a Beam-bound name, or ``setattr`` (``monkeypatch.setattr``
  too) on one: Beam's modules or classes changed at run time.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PrivateUse", "beam_private_names", "private_uses", "project_private_names"]

_DEFINED = re.compile(r"(?:\bdef|\bclass)\s+(_[A-Za-z0-9]\w*)|\bself\.(_[A-Za-z0-9]\w*)\s*=")


@dataclass(frozen=True)
class PrivateUse:
    """One use: where, and what (``_OutputHandler from apache_beam.runners.common``...)."""

    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_names(texts: Iterable[str]) -> set[str]:
    names: set[str] = set()
    for text in texts:
        for match in _DEFINED.finditer(text):
            names.add(match.group(1) or match.group(2))
    return names


def beam_private_names(beam_root: Path) -> set[str]:
    """The private names Beam's own modules (not its tests) define."""
    files = (p for p in beam_root.rglob("*.py") if not p.name.endswith("_test.py"))
    return _defined_names(p.read_text(encoding="utf-8", errors="replace") for p in files)


def project_private_names(sources: Iterable[str]) -> set[str]:
    """The private names the project's sources define themselves."""
    return _defined_names(sources)


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _beam_bound(tree: ast.AST) -> set[str]:
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "apache_beam":
                    bound.add(alias.asname or "apache_beam")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("apache_beam"):
            bound.update(alias.asname or alias.name for alias in node.names)
    for node in ast.walk(tree):  # for module in (worker_pool_main, subprocess_server): ...
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            items = node.iter.elts if isinstance(node.iter, ast.Tuple | ast.List) else []
            if any(isinstance(e, ast.Name) and e.id in bound for e in items):
                bound.add(node.target.id)
    return bound


def _checks(node: ast.AST, bound: set[str], beam_only: set[str]) -> Iterable[tuple[int, str]]:
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("apache_beam"):
        for alias in node.names:
            if _private(alias.name):
                yield node.lineno, f"import of {alias.name} from {node.module}"
    elif isinstance(node, ast.Attribute) and _private(node.attr):
        if _root(node.value) in bound:
            yield node.lineno, f"{ast.unparse(node)} (an attribute of a Beam import)"
        elif node.attr in beam_only and _root(node.value) not in ("self", "cls"):
            yield node.lineno, f"{ast.unparse(node)} (a private attribute Beam defines)"
    elif isinstance(node, ast.Call) and node.args:
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        first, second = node.args[0], node.args[1] if len(node.args) > 1 else None
        text = second.value if isinstance(second, ast.Constant) else None
        if name in ("getattr", "hasattr", "setattr") and isinstance(text, str):
            on_beam = _root(first) in bound
            if (on_beam and (name == "setattr" or _private(text))) or text in beam_only:
                yield node.lineno, f"{ast.unparse(node.func)}({ast.unparse(first)}, {text!r})"
    elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and _root(target.value) in bound:
                yield node.lineno, f"assignment to {ast.unparse(target)} (Beam's, at run time)"


def private_uses(source: str, path: str, beam_only: Iterable[str] = ()) -> list[PrivateUse]:
    """The private Beam uses in ``source`` (a module's text, ``path`` for messages).

    Args:
      beam_only: private names Beam defines and the project does not
        (``beam_private_names`` minus ``project_private_names``).
    """
    if "apache_beam" not in source:
        return []  # no Beam import, so nothing of Beam's to use
    tree = ast.parse(source, filename=path)
    bound, only = _beam_bound(tree), set(beam_only)
    found = {(line, what) for node in ast.walk(tree) for line, what in _checks(node, bound, only)}
    return [PrivateUse(path, line, what) for line, what in sorted(found)]
