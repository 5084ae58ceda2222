"""The line between a user's mistake and a bug.

`embedlab.cli.main` prints a `UserError` (and FileNotFoundError, ConnectionError) as one
`error: ...` line and exits 2; every other exception is a bug and keeps its traceback. The
project's own exception classes for bad input subclass `UserError` beside their older bases
(ValueError, RuntimeError ...), so code that catches those still catches them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


class UserError(Exception):
    """An error in what the user asked for, shown in one line."""


class UsageError(UserError, ValueError):
    """A command asked for something its arguments or this machine cannot give (e.g. CUDA on
    a machine without it, demo study files that are not where they were looked for)."""


class ConfigError(UserError, ValueError):
    """A config value is invalid; the message names the field."""


class UnknownKey(UserError, KeyError):
    """A name the user gave (an arm, a split) that is not there; still a KeyError for callers."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class RunRecordError(UserError, ValueError):
    """A record in a run directory (study.json, a trial's row, a per-query file) that cannot be
    read as one: truncated or not JSON, not an object, without a field every record has, of
    another study, or a second finished row for one arm and seed. The message names the file."""


class StudyCodeError(ConfigError):
    """An exception raised by a user's own study (or tour) file, at import or in its `study()`:
    reported as theirs, `<file>:<line>: <type>: <message>`, in one line; the original is its
    `__cause__`, whose traceback `embedlab --debug` prints."""


# What a message may quote of what it read from a user's file: a column name or an id, and only
# one that looks like one. A message never quotes a cell, a line or a header otherwise: a file
# linked to /etc/passwd is refused without its first line appearing in the error.
_NAME_LIKE = re.compile(r"[\w .:+-]{1,64}")


def quoted(value: object) -> str:
    """`repr(value)` of a column name or id read from a file, when it looks like one (letters,
    digits, ` _.:+-`, at most 64 characters); otherwise a note that it is not shown."""
    return repr(value) if isinstance(value, str) and _NAME_LIKE.fullmatch(value) else "(a value not shown)"


def quoted_names(names: Iterable[object]) -> str:
    """The names read from a file's header, comma-separated, each as `quoted` would show it;
    those that do not look like names are counted, never shown."""
    names = list(names)
    shown = [str(n) for n in names if isinstance(n, str) and _NAME_LIKE.fullmatch(n)]
    hidden = len(names) - len(shown)
    return ", ".join(shown + ([f"{hidden} not shown (not name-like)"] if hidden else [])) or "(none)"
