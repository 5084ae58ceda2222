"""Where run directories live: a local path or any pyarrow filesystem URI (file://, s3://,
gs://, hdfs://, abfs://).

Ray Train and Tune take the same location as their `storage_path`, so checkpoints, trial
rows and study records sit side by side; on a multi-node cluster the location must be one
every node reaches (a shared mount or an object store). Small records are written to a
temporary name and moved into place, so a reader sees a file whole or not at all (a rename
on local and POSIX filesystems; object stores have no partial objects to begin with).

Credentials come from each store's standard environment and files (for S3:
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_ENDPOINT_URL, ~/.aws/; for
GCS: GOOGLE_APPLICATION_CREDENTIALS), never from a location: a location is written into run
records and progress lines, so one carrying a key or a password is refused (`check_location`).
What counts as a credential is one rule, `redact`, which every line embedlab prints also passes
through (`embedlab.cli`): userinfo, a query parameter with a secret name, a token of a known form.
A URI's query (`?region=...&endpoint_override=...`) is kept when parts are joined to it.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shutil
import urllib.parse
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from embedlab.core import paths
from embedlab.core.errors import UsageError

if TYPE_CHECKING:
    import pyarrow.fs as pafs


# The redaction rule, one for every URI and address embedlab prints or records (`redact`):
# the userinfo of an authority (`user:password@`), the value of a query parameter whose name
# holds one of SECRET_WORDS (split at `_ - .` and case: `aws_secret_access_key`, `X-Amz-Signature`,
# `sas_token`), and any of TOKEN_FORMS anywhere in the text.
SECRET_WORDS = frozenset({
    "secret", "token", "password", "passwd", "pwd", "key", "credential", "credentials", "signature", "sig",
    "auth", "authorization", "apikey", "sas",
})
# Credentials recognisable by their form alone: AWS access key ids, GitHub, Hugging Face, Slack,
# OpenAI and Google OAuth tokens, JSON web tokens, and the value of a bearer header.
TOKEN_FORMS = re.compile(
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b|\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}|\bhf_[A-Za-z0-9]{20,}"
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}|\bsk-[A-Za-z0-9_-]{20,}|\bya29\.[A-Za-z0-9_.-]+"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+|(?<=Bearer )[^\s\'\"]+")
# A URI inside a longer text (an error message, a progress line), and an address without a
# scheme whose authority carries userinfo (`user:password@host:port`).
_URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\'\"<>]*[^\s\'\"<>:,.;)]")  # not the sentence's punctuation
_BARE_USERINFO = re.compile(r"(?<![\w/:.@-])[\w.%+-]+:[^\s/@'\"]*@(?=[\w.-]+:\d+\b)")
# A URI's userinfo: what comes before the last `@` of an authority without `/`, or before an `@`
# that follows `user:` (an S3 secret may hold `/`).
_USERINFO = re.compile(r"^(?:[^/@]*|[^@]*:[^@]*)@")
MASK = "***"
CHUNK_BYTES = 8 << 20  # copies stream in pieces of this size, whatever the file's size



def _pafs():
    """pyarrow's filesystems, loaded on first use: the library (checkpoint reading) imports this
    module and imports with torch alone."""
    import pyarrow.fs

    return pyarrow.fs

def is_uri(location: str | Path) -> bool:
    return "://" in str(location)


def is_secret_name(name: str) -> bool:
    """Whether a query parameter (or setting) named `name` carries a secret: one of its words
    (split at `_ - .` and at a lower-to-upper case change) is in SECRET_WORDS, or it holds
    "secret", "token", "password" or "credential" inside a word."""
    words = re.split(r"[_\-.\s]+|(?<=[a-z])(?=[A-Z])", name)
    lowered = name.lower()
    return any(word.lower() in SECRET_WORDS for word in words) or any(
        part in lowered for part in ("secret", "token", "password", "credential"))


def check_location(location: str | Path) -> str:
    """The location as a string; a UsageError when it is empty, or when it carries a credential
    (userinfo in its authority, a query parameter `is_secret_name` calls secret, a token of a
    known form), which run records and progress lines would otherwise keep."""
    text = str(location)
    if not text.strip():
        raise UsageError("storage '': an empty location; name a folder (default ./runs) or a URI such as "
                         "s3://bucket/runs")
    if redact(text) == text:
        return text
    parsed = urllib.parse.urlsplit(text) if is_uri(text) else None
    secrets = sorted({k for k, _ in urllib.parse.parse_qsl(parsed.query)} if parsed else set())
    secrets = [k for k in secrets if is_secret_name(k)]
    what = (", ".join(secrets) if secrets else "userinfo (user:password@) in its authority"
            if parsed is not None and "@" in parsed.netloc else "a token")
    raise UsageError(
        f"storage {redact(text)}: a location carries no credentials ({what}); they would be written "
        "into run records. Give them to the store's standard environment instead (S3: "
        "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or ~/.aws/credentials; GCS: GOOGLE_APPLICATION_CREDENTIALS)")


def redact(text: str | Path) -> str:
    """`text` (a location, an address, or a message holding them) with every credential the
    redaction rule finds replaced by `***`: userinfo before an authority's `@`, the value of
    a query parameter with a secret name (`is_secret_name`), and any token of TOKEN_FORMS.
    Every line embedlab prints goes through it (`embedlab.cli`), and every location it checks."""
    text = _BARE_USERINFO.sub(f"{MASK}@", str(text))
    text = _URI_IN_TEXT.sub(lambda match: _redact_uri(match.group(0)), text)
    return TOKEN_FORMS.sub(MASK, text)


class RedactedStream:
    """A text stream that writes what it is given with every credential masked (`redact`):
    the console of the `embedlab` command, and a run's ray.log. Anything else (fileno, isatty,
    encoding, flush) is the wrapped stream's."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _redact_uri(uri: str) -> str:
    """One URI with its userinfo and secret query values masked, its form otherwise kept."""
    scheme, rest = uri.split("://", 1)
    rest, hash_mark, fragment = rest.partition("#")
    rest, mark, query = rest.partition("?")
    rest = _USERINFO.sub(f"{MASK}@", rest)
    if mark:
        pairs = [part.partition("=") for part in query.split("&")]
        query = "&".join(f"{k}{eq}{MASK if eq and is_secret_name(urllib.parse.unquote_plus(k)) else v}"
                         for k, eq, v in pairs)
    return f"{scheme}://{rest}{mark}{query}{hash_mark}{fragment}"


def _base_and_query(location: str | Path) -> tuple[str, str]:
    text = str(location)
    base, mark, query = text.partition("?")
    return base.rstrip("/") or base, mark + query


def resolve(location: str | Path) -> str:
    """An absolute local path, or the URI unchanged."""
    return check_location(location) if is_uri(location) else str(Path(location).resolve())


def join(location: str | Path, *parts: str) -> str:
    if is_uri(location):
        base, query = _base_and_query(location)
        return posixpath.join(base, *parts) + query
    return str(Path(location, *parts))


def name(location: str | Path) -> str:
    return posixpath.basename(_base_and_query(location)[0])


def parent(location: str | Path) -> str:
    if is_uri(location):
        base, query = _base_and_query(location)
        return posixpath.dirname(base) + query
    return str(Path(location).parent)


def location_of(filesystem: pafs.FileSystem, path: str, like: str | Path) -> str:
    """The location of `path` on `filesystem` (as Ray Train reports a checkpoint), in the form
    of `like` (the storage it was written under): a local path, or a URI with `like`'s scheme
    and query."""
    if isinstance(filesystem, _pafs().LocalFileSystem) or not is_uri(like):
        return str(Path(path))
    scheme = urllib.parse.urlsplit(str(like)).scheme
    return f"{scheme}://{path.lstrip('/')}" + _base_and_query(like)[1]


def _split(location: str | Path) -> tuple[pafs.FileSystem, str]:
    if is_uri(location):
        checked = check_location(location)  # its own UsageError, outside the "cannot open" below
        try:
            return _pafs().FileSystem.from_uri(checked)
        except (ValueError, OSError) as error:  # pyarrow's ArrowInvalid is a ValueError
            raise UsageError(f"storage {redact(location)}: not a filesystem pyarrow can open ({error})") from None
    return _pafs().LocalFileSystem(), str(Path(location).resolve())


def filesystem(location: str | Path) -> tuple[pafs.FileSystem, str]:
    """pyarrow's filesystem and path for a location (Ray Train's `storage_filesystem`)."""
    return _split(location)


def exists(location: str | Path) -> bool:
    fs, path = _split(location)
    return fs.get_file_info(path).type != _pafs().FileType.NotFound


def is_file(location: str | Path) -> bool:
    fs, path = _split(location)
    return fs.get_file_info(path).type == _pafs().FileType.File


def make_dir(location: str | Path, *, exist_ok: bool = True) -> None:
    fs, path = _split(location)
    if not exist_ok and fs.get_file_info(path).type != _pafs().FileType.NotFound:
        raise FileExistsError(f"{redact(location)}: exists")
    fs.create_dir(path, recursive=True)


def read_bytes(location: str | Path) -> bytes:
    fs, path = _split(location)
    try:
        with fs.open_input_stream(path) as stream:
            return stream.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{redact(location)}: not found") from None


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
    if fs.get_file_info(path).type == _pafs().FileType.NotFound:
        return []
    infos = fs.get_file_info(_pafs().FileSelector(path, recursive=False))
    names = sorted(i.base_name for i in infos
                   if i.type == _pafs().FileType.File and i.base_name.endswith(suffix) and not i.base_name.startswith("."))
    return [join(location, n) for n in names]


def list_dirs(location: str | Path) -> list[str]:
    """The directories directly in a directory, sorted, as locations; hidden ones left out."""
    fs, path = _split(location)
    if fs.get_file_info(path).type == _pafs().FileType.NotFound:
        return []
    infos = fs.get_file_info(_pafs().FileSelector(path, recursive=False))
    names = sorted(i.base_name for i in infos if i.type == _pafs().FileType.Directory and not i.base_name.startswith("."))
    return [join(location, n) for n in names]


def local_path(location: str | Path) -> Path | None:
    """The local path of a location on the local filesystem, else None."""
    if not is_uri(location):
        return Path(location).resolve()
    fs, path = _split(location)
    return Path(path) if isinstance(fs, _pafs().LocalFileSystem) else None


def list_tree(location: str | Path) -> list[str]:
    """Every file under a directory, as paths relative to it (posix), sorted; hidden and
    temporary files are left out."""
    fs, path = _split(location)
    if fs.get_file_info(path).type == _pafs().FileType.NotFound:
        return []
    root = path.rstrip("/") + "/"
    found = []
    for info in fs.get_file_info(_pafs().FileSelector(path, recursive=True)):
        relative = info.path[len(root):] if info.path.startswith(root) else info.path
        if info.type == _pafs().FileType.File and not any(p.startswith(".") for p in relative.split("/")):
            found.append(relative)
    return sorted(found)


def download(location: str | Path, target: Path) -> None:
    """Copy a file at `location` to the local path `target`, streamed in `CHUNK_BYTES` pieces."""
    fs, path = _split(location)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with fs.open_input_stream(path) as source, open(target, "wb") as sink:
            while chunk := source.read(CHUNK_BYTES):
                sink.write(chunk)
    except FileNotFoundError:
        raise FileNotFoundError(f"{redact(location)}: not found") from None


def upload(source: Path, location: str | Path) -> None:
    """Copy the local file `source` to `location`, whole or not at all (`write_bytes`'s rule)."""
    fs, path = _split(location)
    if isinstance(fs, _pafs().LocalFileSystem):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        staging = Path(path).with_name(f".{Path(path).name}.{uuid.uuid4().hex[:8]}.tmp")
        shutil.copyfile(source, staging)
        os.replace(staging, path)
        return
    fs.create_dir(posixpath.dirname(path), recursive=True)
    staging = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
    with open(source, "rb") as reader, fs.open_output_stream(staging) as sink:
        while chunk := reader.read(CHUNK_BYTES):
            sink.write(chunk)
    fs.move(staging, path)


def upload_tree(source: Path, location: str | Path, last: str | None = None) -> list[str]:
    """Copy every file under the local directory `source` to the directory `location`, each
    whole or not at all, the relative path `last` (a manifest) after all others; returns the
    relative paths copied, in that order."""
    names = sorted((p.relative_to(source).as_posix() for p in Path(source).rglob("*") if p.is_file()),
                   key=lambda relative: (relative == last, relative))
    for relative in names:
        upload(Path(source) / relative, join(location, *relative.split("/")))
    return names


def file_sha256(path: Path) -> str:
    """The sha256 of a local file's bytes, read in pieces (a file of any size)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def files_sha256(files: dict[str, str]) -> str:
    """The sha256 of a {relative path: sha256} mapping (sorted JSON): the identity of a set of
    files, such as a checkpoint's weights or a published tree."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def cache_dir() -> Path:
    """This node's local cache (EMBEDLAB_CACHE, default ~/.cache/embedlab): prepared data,
    fetched checkpoints and tasks. Each node of a cluster may have its own. A UsageError when
    something other than a directory is there, before anything is built into it."""
    named = os.environ.get("EMBEDLAB_CACHE")
    path = Path(named) if named else Path.home() / ".cache" / "embedlab"
    found = paths.kind(path)
    if found not in (None, "a directory"):
        setting = f"EMBEDLAB_CACHE={path}" if named else f"the data cache {path}"
        raise UsageError(f"{setting}: {found}, not a directory; point EMBEDLAB_CACHE at a directory "
                         "(or unset it for ~/.cache/embedlab)")
    return path


def fetch(location: str | Path) -> Path:
    """A local path holding the file: itself when local, else a copy in a temporary directory."""
    local = local_path(location)
    if local is not None:
        return local
    import tempfile

    copy = Path(tempfile.mkdtemp(prefix="embedlab-")) / name(location)
    download(location, copy)
    return copy
