"""Every report of a Ray Train run, one JSON object a line, in `<storage>/<name>/metrics.jsonl`.

`Result.metrics` holds the last report only; the log holds all of them, across restarts
(a restarted worker group's replayed steps appear again, after the step it restored) and
across runs of the same name (a resumed run appends). The storage may be a local path
(appended to) or a pyarrow filesystem URI (object stores cannot append: the object is
rewritten whole after each report, written aside and then moved).
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
from ray.train import UserCallback

FILE_NAME = "metrics.jsonl"


def log_location(storage_path: str | Path, name: str) -> str:
    if "://" in str(storage_path):
        return posixpath.join(str(storage_path).rstrip("/"), name, FILE_NAME)
    return str(Path(storage_path).resolve() / name / FILE_NAME)


def _open(location: str) -> tuple[pafs.FileSystem, str]:
    if "://" in location:
        return pafs.FileSystem.from_uri(location)
    return pafs.LocalFileSystem(), location


def _read(location: str) -> str:
    filesystem, path = _open(location)
    if filesystem.get_file_info(path).type == pafs.FileType.NotFound:
        return ""
    with filesystem.open_input_stream(path) as stream:
        return stream.read().decode()


class MetricsLog(UserCallback):
    """Log rank 0's metrics of each report at `location` (runs on the Ray Train controller)."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.text: str | None = None

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        line = json.dumps({**metrics[0], "checkpoint": checkpoint is not None}, sort_keys=True) + "\n"
        if "://" not in self.location:
            Path(self.location).parent.mkdir(parents=True, exist_ok=True)
            with open(self.location, "a") as log:
                log.write(line)
            return
        if self.text is None:
            self.text = _read(self.location)  # an earlier run of the same name
        self.text += line
        filesystem, path = _open(self.location)
        directory = posixpath.dirname(path)
        filesystem.create_dir(directory, recursive=True)
        staging = posixpath.join(directory, f".{FILE_NAME}.partial")
        with filesystem.open_output_stream(staging) as stream:
            stream.write(self.text.encode())
        filesystem.move(staging, path)


def read_metrics(location: str | Path) -> list[dict[str, Any]]:
    """The logged reports, in order."""
    return [json.loads(line) for line in _read(str(location)).splitlines()]
