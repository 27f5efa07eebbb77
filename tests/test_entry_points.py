"""The commands: every ``[project.scripts]`` entry follows one naming scheme, points at a command
module's ``main(argv)``, runs as ``python -m`` without a second import of its module, and no
module of the project imports a command module."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCRIPTS: dict[str, str] = _PYPROJECT["project"]["scripts"]
# The top-level packages ("beam_pipelines*" in the find list stands for it and its subpackages).
PACKAGES: list[str] = [
    name.rstrip("*") for name in _PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
]
COMMAND_MODULES = sorted({target.split(":")[0] for target in SCRIPTS.values()})


def _package_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _imported_names(tree: ast.AST, module: str) -> set[str]:
    """Every module a file imports (at any depth: top level, functions, TYPE_CHECKING), and the
    module names in lazy import tables and ``importlib.import_module`` calls."""
    package = module if module.count(".") == 0 else module.rsplit(".", 1)[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([package, *([base] if base else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Dict):  # a lazy table: {"name": "package.module"}
            names.update(_module_strings(node.values))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            names.update(_module_strings(node.args[:1]))
    return names


def _module_strings(nodes: list[ast.expr | None]) -> set[str]:
    return {
        node.value
        for node in nodes
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", node.value)
    }


def test_scripts_follow_one_naming_scheme() -> None:
    assert {"pipeline", "verify", "service", "train", "diagnose"} <= {
        name.removeprefix("tfrecord-") for name in SCRIPTS
    }
    for name, target in SCRIPTS.items():
        assert re.fullmatch(r"tfrecord-[a-z]+(-[a-z]+)*", name), name
        assert re.fullmatch(r"[a-z_]+(\.[a-z_]+)+:main", target), (name, target)
        assert target.split(".")[0] in PACKAGES, (name, target)


def test_every_command_the_readme_names_has_a_console_script() -> None:
    # The README says each of its commands has a tfrecord-* script, not only python -m.
    named = set(re.findall(r"python -m ([a-z_]+(?:\.[a-z_]+)+)", (REPO / "README.md").read_text()))
    assert {"beam_pipelines.images_to_tfrecord", "dataset_tools.diff", "trainer.train"} <= named
    scripted = set(COMMAND_MODULES)
    missing = sorted(module for module in named if not {module, f"{module}.__main__"} & scripted)
    assert not missing, f"README commands without a console script: {missing}"


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_each_command_module_has_main_taking_argv(module: str) -> None:
    main = importlib.import_module(module).main
    parameters = list(inspect.signature(main).parameters.values())
    assert [p.name for p in parameters] == ["argv"], module
    assert parameters[0].default is None, module
    source = (REPO / Path(*module.split("."))).with_suffix(".py").read_text()
    assert 'if __name__ == "__main__":\n    sys.exit(main())' in source, module


def test_no_module_of_the_project_imports_a_command_module() -> None:
    offenders = []
    for module, path in _package_modules().items():
        imported = _imported_names(ast.parse(path.read_text()), module)
        for command in COMMAND_MODULES:
            if command != module and command in imported:
                offenders.append(f"{module} imports {command}")
    assert not offenders, offenders


@pytest.mark.slow
@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_python_m_runs_the_module_once(module: str) -> None:
    # runpy warns (RuntimeWarning) when the package import already loaded the module it is
    # about to run as __main__: made an error here.
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", module, "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={"TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "usage:" in done.stdout
