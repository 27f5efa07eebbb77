"""Wording shared by the commands' output: a count with its noun in agreement.

The commands' summary lines put a number before a noun through ``plural`` ("1 duplicate",
"3 duplicates"), so that none prints "1 duplicates" or "2 shard".
"""

from __future__ import annotations

import operator

__all__ = ["plural"]


def plural(count: int, noun: str, plural_form: str | None = None, *, grouped: bool = False) -> str:
    """``count`` and ``noun`` in agreement: ``"1 duplicate"``, ``"0 duplicates"``.

    Args:
      count: how many.
      noun: the singular noun (or words ending in one: ``"staged file"``).
      plural_form: the plural where adding ``s`` is wrong (``"classes"``); ``noun + "s"``
        when None.
      grouped: separate thousands with commas (``"1,234 examples"``).

    Raises:
      TypeError: if ``count`` is not an integer.
    """
    try:
        count = operator.index(count)  # ints, numpy's too; never a float
    except TypeError as e:
        raise TypeError(f"plural() counts with an int, got {count!r}") from e
    word = noun if count == 1 else (plural_form if plural_form is not None else noun + "s")
    return f"{count:,} {word}" if grouped else f"{count} {word}"
