"""What a path argument is, checked before any work starts: every command names the path, what
it found there (a directory, a file, a named pipe ...) and what it wanted, in one line, instead
of failing later inside a library with `NotADirectoryError`, `FileExistsError` or a pipe read
that never returns.

    require_file        an existing regular file (optionally with one of some suffixes)
    require_directory   an existing directory
    require_output_dir  a directory to write into: one that exists, or a path whose nearest
                        existing parent is a writable directory
    require_output_file a file to write: a regular file or nothing yet, in a place where
                        `require_output_dir` holds for its folder

Local paths only; a storage URI is the store's to check (`embedlab.core.store`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from embedlab.core.errors import UsageError

# What `os.stat`'s mode says a path is, in the words the messages use.
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a file"), (stat.S_ISFIFO, "a named pipe"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def kind(path: str | Path) -> str | None:
    """What is at `path` ("a directory", "a file", "a named pipe", ...), following links; None
    when nothing is (a dangling link included)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:  # a permission denied on the way, a loop of links
        return f"unreadable ({error.strerror})"
    return next((name for test, name in _KINDS if test(mode)), "not a file or directory")


def require_file(path: str | Path, what: str, suffixes: tuple[str, ...] = ()) -> Path:
    """`path` as a Path when it is a regular file (with one of `suffixes`, when given); else a
    UsageError naming `what` it should be and what is there. A missing one is a
    FileNotFoundError, as the commands have always said."""
    found = kind(path)
    if found is None:
        raise FileNotFoundError(f"{what} not found: {path}")
    if found != "a file":
        raise UsageError(f"{what} {path}: {found}, not a file")
    if suffixes and Path(path).suffix not in suffixes:
        raise UsageError(f"{what} {path}: not a {' or '.join(f'*{s}' for s in suffixes)} file")
    return Path(path)


def require_directory(path: str | Path, what: str) -> Path:
    """`path` as a Path when it is a directory; else FileNotFoundError (missing) or a
    UsageError saying what is there instead."""
    found = kind(path)
    if found is None:
        raise FileNotFoundError(f"{what} not found: {path}")
    if found != "a directory":
        raise UsageError(f"{what} {path}: {found}, not a directory")
    return Path(path)


def require_output_dir(path: str | Path, what: str) -> Path:
    """`path` when a directory can be written there: it is one, or its nearest existing parent
    is a directory this user may write into."""
    _check_folder(Path(path), Path(path).absolute(), what)
    return Path(path)


def require_output_file(path: str | Path, what: str) -> Path:
    """`path` when a file can be written there: nothing is there yet, or a regular file is
    (replaced), in a folder `require_output_dir` would accept."""
    found = kind(path)
    if found not in (None, "a file"):
        raise UsageError(f"{what} {path}: {found}, not a file; give the path of a file to write")
    _check_folder(Path(path), Path(path).absolute().parent, what)
    return Path(path)


def _check_folder(given: Path, folder: Path, what: str) -> None:
    """The folder `given` writes into (itself, or a file's parent) is a directory, or can be
    made inside one this user may write into; the message names `given` and what is in the way."""
    existing = next(p for p in (folder, *folder.parents) if kind(p) is not None)
    found = kind(existing)
    if found != "a directory":
        where = f"{found}" if existing == given.absolute() else f"{existing} is {found}"
        raise UsageError(f"{what} {given}: {where}, not a directory; name a path in a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {given}: {existing} is not writable by this user")
