"""`embedlab export CKPT_DIR OUT_DIR`: a checkpoint's inference package, by `embedlab.release.export`.

`embedlab.cli.build_parser` registers it with `add_parsers`.
"""

from __future__ import annotations

import argparse


def cmd_export(args: argparse.Namespace) -> int:
    from embedlab.release.export import export_release_to  # here: it loads torch

    manifest = export_release_to(args.checkpoint, args.out)
    print(f"exported {args.out}: encoder {manifest['content_hash'][:16]} (from {manifest['exported_from'][:16]}), "
          f"pooling {manifest['pooling']['method']}, prefixes {manifest['pooling'].get('prefixes')}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register `embedlab export` on the main parser's subcommands."""
    export = sub.add_parser("export", help="the inference package of a checkpoint (encoder, tokenizer, manifest)")
    export.add_argument("checkpoint", help="a checkpoint directory or storage URI (s3://, gs://, ...)")
    export.add_argument("out", help="a new or empty directory, or a storage URI")
    export.set_defaults(func=cmd_export)
