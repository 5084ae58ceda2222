"""The line between a user's mistake and a bug.

`embedlab.cli.main` prints a `UserError` (and FileNotFoundError, ConnectionError) as one
`error: ...` line and exits 2; every other exception is a bug and keeps its traceback. The
project's own exception classes for bad input subclass `UserError` beside their older bases
(ValueError, RuntimeError ...), so code that catches those still catches them.
"""

from __future__ import annotations


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
