"""Public names a package loads on first use (PEP 562), from one table of name -> module.

A package whose names pull in heavy libraries (Apache Beam, TensorFlow, Keras) lists them in a
table and lets ``lazy_names`` build its module ``__getattr__`` and ``__dir__``: importing the
package, or running one of its command modules with ``python -m``, then costs nothing until a
name is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str,
    namespace: dict[str, Any],
    module_of: Mapping[str, str],
    *,
    install_hints: Mapping[str, str] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, loading ``module_of``'s names.

    Args:
      package: the package's name (``__name__``), for error messages.
      namespace: the package's ``globals()``: a loaded name is stored there, so it is imported
        once and ``__getattr__`` is not called for it again.
      module_of: public name -> the module that defines it.
      install_hints: a dependency's top-level module -> what to install to get it. When
        loading a name fails because that module is missing, ``ImportError`` says
        ``"<package>.<name> needs <hint>"``.

    Returns:
      ``(__getattr__, __dir__)``, to assign to the package's own names.

    Raises (from ``__getattr__``):
      AttributeError: the name is not in ``module_of``.
      ImportError: its module needs a dependency named in ``install_hints`` that is missing.
    """
    hints = dict(install_hints or {})

    def getattr_(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            value = getattr(importlib.import_module(module), name)
        except ModuleNotFoundError as e:
            missing = (e.name or "").split(".")[0]
            if missing not in hints:
                raise
            raise ImportError(f"{package}.{name} needs {hints[missing]}") from e
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(module_of))

    return getattr_, dir_
