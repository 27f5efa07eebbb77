"""Command lines for every entry point: strict parsers, and flags generated from config dataclasses.

Unknown or misspelled flags fail at once (``StrictArgumentParser``); each flag is written once,
on its config dataclass's field, from which ``add_dataclass_flags`` generates it
(``dataclass_flags``). Counts in the commands' output agree with their nouns (``plural``).
Ctrl-C, SIGTERM and a closed pipe end every command the same way (``interrupts``). Packages
load their public names on first use through one table (``lazy``), so a command starts before
Beam or TensorFlow is imported.
Imports nothing of the project (a bottom-floor package, like
``schemas``), so the pipeline, the reader's tools, the tf.data service and the trainer share it.
"""

from cliflags.dataclass_flags import (
    NESTED_FLAGS,
    NO_FLAG,
    Flag,
    FlagContainer,
    add_dataclass_flags,
    field_docs,
    flag,
    flag_groups,
    flag_values,
)
from cliflags.lazy import lazy_names
from cliflags.strict import (
    StrictArgumentParser,
    add_verbose_flag,
    command_name,
    quiet_tensorflow,
    suggest_flag,
    unknown_flags,
)
from cliflags.wording import plural

__all__ = [
    "NESTED_FLAGS",
    "NO_FLAG",
    "Flag",
    "FlagContainer",
    "StrictArgumentParser",
    "add_dataclass_flags",
    "add_verbose_flag",
    "command_name",
    "field_docs",
    "flag",
    "flag_groups",
    "flag_values",
    "lazy_names",
    "plural",
    "quiet_tensorflow",
    "suggest_flag",
    "unknown_flags",
]
