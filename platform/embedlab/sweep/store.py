"""Where run directories live: a local path or any pyarrow filesystem URI (file://, s3://,
gs://, hdfs://, abfs://).

Ray Train and Tune take the same location as their `storage_path`, so checkpoints, trial
rows and study records sit side by side; on a multi-node cluster the location must be one
every node reaches (a shared mount or an object store). Small records are written to a
temporary name and moved into place, so a reader sees a file whole or not at all (a rename
on local and POSIX filesystems; object stores have no partial objects to begin with).
"""

from __future__ import annotations

import posixpath
import uuid
from pathlib import Path

import pyarrow.fs as pafs
from embedlab.errors import UsageError


def is_uri(location: str | Path) -> bool:
    return "://" in str(location)


def resolve(location: str | Path) -> str:
    """An absolute local path, or the URI unchanged."""
    return str(location) if is_uri(location) else str(Path(location).resolve())


def join(location: str | Path, *parts: str) -> str:
    if is_uri(location):
        return posixpath.join(str(location).rstrip("/"), *parts)
    return str(Path(location, *parts))


def name(location: str | Path) -> str:
    return posixpath.basename(str(location).rstrip("/"))


def parent(location: str | Path) -> str:
    if is_uri(location):
        return posixpath.dirname(str(location).rstrip("/"))
    return str(Path(location).parent)


def _split(location: str | Path) -> tuple[pafs.FileSystem, str]:
    if is_uri(location):
        try:
            return pafs.FileSystem.from_uri(str(location))
        except (ValueError, OSError) as error:  # pyarrow's ArrowInvalid is a ValueError
            raise UsageError(f"storage {location!r}: not a filesystem pyarrow can open ({error})") from None
    return pafs.LocalFileSystem(), str(Path(location).resolve())


def exists(location: str | Path) -> bool:
    fs, path = _split(location)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def is_file(location: str | Path) -> bool:
    fs, path = _split(location)
    return fs.get_file_info(path).type == pafs.FileType.File


def make_dir(location: str | Path, *, exist_ok: bool = True) -> None:
    fs, path = _split(location)
    if not exist_ok and fs.get_file_info(path).type != pafs.FileType.NotFound:
        raise FileExistsError(f"{location}: exists")
    fs.create_dir(path, recursive=True)


def read_bytes(location: str | Path) -> bytes:
    fs, path = _split(location)
    try:
        with fs.open_input_stream(path) as stream:
            return stream.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{location}: not found") from None


def read_text(location: str | Path) -> str:
    return read_bytes(location).decode()


def write_text(location: str | Path, text: str) -> None:
    write_bytes(location, text.encode())


def write_bytes(location: str | Path, data: bytes) -> None:
    """Write whole-or-nothing: to a temporary sibling, then moved over the target."""
    fs, path = _split(location)
    directory, base = posixpath.split(path) if is_uri(location) else (str(Path(path).parent), Path(path).name)
    fs.create_dir(directory, recursive=True)
    staging = posixpath.join(directory, f".{base}.{uuid.uuid4().hex[:8]}.tmp")
    with fs.open_output_stream(staging) as stream:
        stream.write(data)
    fs.move(staging, path)


def list_files(location: str | Path, suffix: str) -> list[str]:
    """The files directly in a directory whose names end with `suffix`, sorted, as locations;
    temporary and hidden files are left out."""
    fs, path = _split(location)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=False))
    names = sorted(i.base_name for i in infos
                   if i.type == pafs.FileType.File and i.base_name.endswith(suffix) and not i.base_name.startswith("."))
    return [join(location, n) for n in names]


def local_path(location: str | Path) -> Path | None:
    """The local path of a location on the local filesystem, else None."""
    if not is_uri(location):
        return Path(location).resolve()
    fs, path = _split(location)
    return Path(path) if isinstance(fs, pafs.LocalFileSystem) else None


def fetch(location: str | Path) -> Path:
    """A local path holding the file: itself when local, else a copy in a temporary directory."""
    local = local_path(location)
    if local is not None:
        return local
    import tempfile

    copy = Path(tempfile.mkdtemp(prefix="embedlab-")) / name(location)
    copy.write_bytes(read_bytes(location))
    return copy
