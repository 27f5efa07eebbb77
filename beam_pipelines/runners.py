"""Runner short names accepted on the command line, mapped to the class paths Beam needs."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["RUNNER_ALIASES", "resolve_runner_aliases"]

# Beam resolves only its built-in runners by short name; the Dask runner must be named by its
# full class path.
RUNNER_ALIASES = {
    "DaskRunner": "apache_beam.runners.dask.dask_runner.DaskRunner",
}


def resolve_runner_aliases(argv: Sequence[str]) -> list[str]:
    """Returns ``argv`` with any ``--runner`` short name from ``RUNNER_ALIASES`` expanded."""
    out: list[str] = []
    expand_next = False
    for arg in argv:
        if expand_next:
            out.append(RUNNER_ALIASES.get(arg, arg))
            expand_next = False
        elif arg == "--runner":
            out.append(arg)
            expand_next = True
        elif arg.startswith("--runner="):
            name = arg.split("=", 1)[1]
            out.append(f"--runner={RUNNER_ALIASES.get(name, name)}")
        else:
            out.append(arg)
    return out
