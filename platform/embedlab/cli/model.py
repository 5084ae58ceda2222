"""`embedlab model params|check-cuda`: a preset's parameter counts; the GPU paths against their oracles.

`embedlab.cli.build_parser` registers them with `add_parsers`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from embedlab.cli.common import require_cuda, stderr
from embedlab.core.config import model_preset


def cmd_model_params(args: argparse.Namespace) -> int:
    from embedlab.model.encoder import parameter_counts  # here: it loads torch

    counts = parameter_counts(model_preset(args.preset))
    if args.json:
        print(json.dumps(counts))
    else:
        for name, value in counts.items():
            print(f"{name:<14} {value:>15,}")
    return 0


def cmd_model_check_cuda(args: argparse.Namespace) -> int:
    # here: torch, and the checks' kernels and compiler, load only for this command
    import torch

    from embedlab.bench.cuda_checks import run_checks

    if args.device == "cuda":
        require_cuda("model check-cuda", "--device cpu runs the same checks on the CPU")
    checks = run_checks(torch.device(args.device), progress=stderr)
    if args.json:
        print(json.dumps({"device": args.device, "torch": torch.__version__,
                          "checks": [dataclasses.asdict(c) for c in checks]}, sort_keys=True))
    else:
        for check in checks:
            detail = check.error or ", ".join(f"{k} {v:.2e}" for k, v in check.measured.items())
            print(f"{'ok' if check.ok else 'FAILED':<7} {check.name:<14} {detail}  [{check.compares}]")
    return 0 if all(c.ok for c in checks) else 1


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register `embedlab model params|check-cuda` on the main parser's subcommands."""
    model = sub.add_parser("model", help="model utilities")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    params = model_sub.add_parser("params", help="parameter counts of a preset, from the meta-device tree")
    params.add_argument("preset")
    params.add_argument("--json", action="store_true")
    params.set_defaults(func=cmd_model_params)
    check_cuda = model_sub.add_parser(
        "check-cuda", help="the GPU paths (flash varlen, bf16, compile, NCCL) against their CPU-tested oracles")
    check_cuda.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                            help="cpu runs the same checks with the CPU kernel, compiler and gloo")
    check_cuda.add_argument("--json", action="store_true")
    check_cuda.set_defaults(func=cmd_model_check_cuda)
