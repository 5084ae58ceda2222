"""What several `embedlab` subcommand modules share: where progress lines go, the CUDA check
of the GPU-only commands, and the data-spec argument of the data and bench commands.

Kept apart from `embedlab.cli` (which imports every subcommand module to build the parser) so
that the subcommand modules can use these without importing the package that imports them.
"""

from __future__ import annotations

import argparse
import sys

from embedlab.core.errors import UsageError


def progress(message: str) -> None:
    """A progress line on stdout, among a sweep's or a tour's results."""
    print(message, flush=True)


def stderr(message: str) -> None:
    """A progress line on stderr, so that stdout holds only the result (e.g. --json)."""
    print(message, file=sys.stderr, flush=True)


def require_cuda(command: str, instead: str) -> None:
    """UsageError naming `command` and what to do `instead` on a machine without CUDA."""
    import torch  # here: the parser and the commands that need no GPU do not load torch

    if not torch.cuda.is_available():
        raise UsageError(f"{command} needs CUDA (torch.cuda.is_available() is False here); {instead}")


def add_spec(p: argparse.ArgumentParser) -> None:
    """The optional data spec and Ray cluster of `embedlab data`, `tokenizer` and `bench` subcommands."""
    p.add_argument("spec", nargs="?", default=None,
                   help="a study file (.py: every arm's data), a data spec (.toml/.json), or none for the defaults")
    p.add_argument("--address", default=None, help="an existing Ray cluster (default: the one RAY_ADDRESS names, else start a new local one)")
