"""Strict command lines for every entry point: unknown or misspelled flags fail at once.

Imports nothing of the project (a bottom-floor package, like ``schemas``), so the pipeline, the
reader's tools and the trainer share it.
"""

from cliflags.strict import (
    StrictArgumentParser,
    command_name,
    quiet_tensorflow,
    suggest_flag,
    unknown_flags,
)

__all__ = [
    "StrictArgumentParser",
    "command_name",
    "quiet_tensorflow",
    "suggest_flag",
    "unknown_flags",
]
