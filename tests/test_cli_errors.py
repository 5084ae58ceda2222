"""The command line tells a user's mistake from a bug: a UserError (and FileNotFoundError,
ConnectionError) is one `error:` line and exit code 2; anything else keeps its traceback.
The demo finds its study files from the installed package, wherever it runs from."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from embedlab.cli import main
from embedlab.core.errors import UserError
from embedlab.sweep.tour import find_demo_tour

REPOSITORY = Path(__file__).parent.parent


def test_a_user_error_is_one_line_and_exit_code_2(capsys):
    """An unknown model preset (a ConfigError) prints one `error:` line naming it, no traceback."""
    assert main(["model", "params", "no-such-preset"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model.preset: unknown preset 'no-such-preset'") and err.count("\n") == 1


def test_an_internal_key_error_keeps_its_traceback(tmp_path, capsys, monkeypatch):
    """A bare KeyError inside the table code (here planted in the trial-row reader; a study.json
    without its "study" section is a user error now, test_run_records.py) is a bug to see, so it
    propagates instead of becoming `error: 'study'`."""
    from embedlab.stats import table

    (tmp_path / "trials").mkdir()
    (tmp_path / "study.json").write_text(json.dumps({"study": {"name": "s", "metric": "m", "arms": {"a": {}}}}))
    monkeypatch.setattr(table, "_checked_rows", lambda *a: {}["study"])
    with pytest.raises(KeyError, match="study"):
        main(["table", str(tmp_path), "--json"])
    assert "error:" not in capsys.readouterr().err


def test_the_projects_input_errors_are_user_errors_and_keep_their_old_bases():
    """Every user-facing exception class is a UserError, and still what callers caught before."""
    from embedlab.checkpoints.io import CheckpointError
    from embedlab.contamination.audit import ContaminationError
    from embedlab.core.beir import TaskFormatError
    from embedlab.core.config import ConfigError
    from embedlab.sources.builtin import SourceUnavailableError
    from embedlab.sources.external import SourceError
    from embedlab.sources.mixture import MixtureError
    from embedlab.stats.table import UnequalComputeError
    from embedlab.sweep.promote import PromotionError
    from embedlab.sweep.tuning import TuningError

    old_bases = {ConfigError: ValueError, PromotionError: ValueError, UnequalComputeError: ValueError,
                 TaskFormatError: ValueError, CheckpointError: ValueError, MixtureError: ValueError,
                 SourceError: Exception, ContaminationError: RuntimeError, TuningError: RuntimeError,
                 SourceUnavailableError: FileNotFoundError}
    assert [cls.__name__ for cls, base in old_bases.items() if not issubclass(cls, UserError)] == []
    assert [cls.__name__ for cls, base in old_bases.items() if not issubclass(cls, base)] == []


def test_the_demo_finds_its_tour_from_another_working_directory(tmp_path, monkeypatch):
    """From a directory without ablations/, the demo's tour is the installed checkout's."""
    monkeypatch.chdir(tmp_path)
    assert find_demo_tour() == (REPOSITORY / "ablations" / "recipe.py").resolve()


def test_demo_study_files_that_are_not_there_fail_in_one_line(tmp_path, capsys):
    """`--ablations` pointing at a directory without recipe.py: one line saying where it looked
    and how to point at the study files; nothing is run."""
    assert main(["demo", "--ablations", str(tmp_path), "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"not in {tmp_path};" in err and "embedlab demo --ablations DIR" in err
    assert not (tmp_path / "runs").exists()


def test_promote_run_takes_the_sweeps_fleet_options_and_checks_them_before_promoting(tmp_path, capsys):
    """`promote --run` launches the next phase as `sweep` would, with --max-concurrent and
    --wait-for-resources; a bad value is refused before anything is promoted."""
    run_dir = tmp_path / "no-such-run"
    assert main(["promote", str(run_dir), "--run", "--max-concurrent", "0"]) == 2
    assert "--max-concurrent 0: Tune needs at least 1 trial at a time" in capsys.readouterr().err
    assert main(["promote", str(run_dir), "--run", "--wait-for-resources", "-1"]) == 2
    assert "--wait-for-resources -1: give seconds to wait" in capsys.readouterr().err
    assert main(["promote", str(run_dir), "--run", "--max-concurrent", "2"]) == 2  # checked, then promotion runs
    assert "not an embedlab run directory" in capsys.readouterr().err


# What `embedlab --help` and argument parsing must not load: each costs seconds, or most of a
# second, and none is needed before a command runs.
HEAVY_LIBRARIES = ("torch", "ray", "pandas", "scipy", "faiss", "datasets", "matplotlib", "transformers")


def test_parsing_the_command_line_loads_no_heavy_library():
    """Building the parser and parsing every group's command, in a fresh interpreter, imports
    none of HEAVY_LIBRARIES: the subcommand modules import the library inside their commands."""
    argvs = [["sweep", "s.py"], ["table", "r"], ["tour", "t.py"], ["promote", "r"], ["heldout", "score"],
             ["evaluate", "--encoder", "c", "--task", "t"], ["data", "build"], ["bench", "train"],
             ["model", "params", "tiny"], ["export", "c", "o"], ["evaluator", "status"]]
    script = (
        "import sys\n"
        "from embedlab.cli import build_parser\n"
        f"for argv in {argvs!r}:\n"
        "    build_parser().parse_args(argv)\n"
        f"print([m for m in {HEAVY_LIBRARIES!r} if m in sys.modules])\n"
    )
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_the_profile_help_lists_every_profile_with_its_summary():
    """sweep, plan and tour describe --profile from `recipes.PROFILES`, so a new profile is never
    missing from --help (gpu-300m once was)."""
    from embedlab.cli import build_parser
    from embedlab.studies.recipes import PROFILES

    parser = build_parser()
    subcommands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    for command in ("sweep", "plan", "tour"):
        flat = " ".join(subcommands.choices[command].format_help().split())
        for name, profile in PROFILES.items():
            assert f"{name} ({profile.summary})" in flat, (command, name)


SECRET = "S3CR3T-never-printed"


def test_a_credential_in_any_position_is_never_printed_or_written(tmp_path, capsys):
    """A set of commands, each given the same secret in one position: a Ray address's userinfo
    (ray:// and bare), a storage URI's userinfo and its query parameters (an AWS secret, a
    token, a password, an S3 signature), a pair file given as an s3:// URI, a checkpoint URI.
    Each is refused in one line; the secret is in nothing printed (stdout, stderr, with
    --debug's traceback too) and in no file the commands wrote under tmp_path."""
    from conftest import tiny_trial, write_study

    study = write_study(tmp_path / "study.py", tiny_trial(num_workers=1),
                        extra="budget=replace(DEFAULT_BUDGET, tokens=4_000)")
    pairs_study = tmp_path / "pairs_study.py"
    pairs_study.write_text(
        "from dataclasses import replace\nfrom embedlab import Study, recipes\n"
        "from embedlab.core.config import PairFiles\n\n"
        "def study(profile='demo'):\n"
        "    base = recipes.phase3_baseline('demo')\n"
        f"    mine = PairFiles(name='mine', path='s3://AKIDKEY:{SECRET}@bucket/pairs.jsonl', rights='test')\n"
        "    base = replace(base, data=replace(base.data, pair_files=(mine,)))\n"
        "    return Study(name='p', factor='contrastive.temperature', seeds=(0,), budget=recipes.budget_for(\n"
        "        recipes.profile('demo'), phase=3, control=base), arms={'a': base, 'b': replace(base, contrastive=\n"
        "        replace(base.contrastive, temperature=0.1))})\n")
    tour = str(REPOSITORY / "ablations" / "recipe.py")
    written_before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    commands = [
        ["sweep", study, "--dry-run", "--address", f"ray://user:{SECRET}@127.0.0.1:10001"],
        ["sweep", study, "--address", f"user:{SECRET}@127.0.0.1:6379", "--storage", str(tmp_path / "runs")],
        ["evaluator", "status", "--address", f"ray://admin:{SECRET}@127.0.0.1:10001"],
        ["sweep", study, "--dry-run", "--storage", f"s3://AKIDKEY:{SECRET}@bucket/runs"],
        ["sweep", study, "--dry-run", "--storage", f"s3://bucket/runs?region=eu-west-1&aws_secret_access_key={SECRET}"],
        ["sweep", study, "--storage", f"gs://bucket/runs?token={SECRET}"],
        ["sweep", study, "--ladder", "0.5,1", "--dry-run", "--storage", f"s3://bucket/runs?password={SECRET}"],
        ["tour", tour, "--profile", "demo", "--dry-run", "--storage", f"s3://bucket/r?X-Amz-Signature={SECRET}"],
        ["sweep", str(pairs_study), "--dry-run"],
        ["export", f"s3://bucket/ckpt?sas_token={SECRET}", str(tmp_path / "out")],
        ["--debug", "sweep", str(pairs_study), "--dry-run"],
    ]
    printed = []
    for argv in commands:
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert err.splitlines()[-1].startswith("error: "), (argv, err)
        printed.append(out + err)
    assert [argv for argv, text in zip(commands, printed) if SECRET in text] == []
    written = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert [p for p, data in written.items() if written_before.get(p) != data and SECRET.encode() in data] == []
    assert "source 'mine': path is a s3:// URI; sources are read from this machine" in printed[8]
    assert "--address ray://***@127.0.0.1:10001: an address carries no credential" in printed[0]
    assert "storage s3://bucket/runs?region=eu-west-1&aws_secret_access_key=***:" in printed[4]


def test_an_out_of_range_port_is_a_usage_error_not_connection_refused(capsys):
    """`evaluator status --address HOST:70000` is refused as a usage error before connecting."""
    assert main(["evaluator", "status", "--address", "127.0.0.1:70000"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --address 127.0.0.1:70000: port '70000' is not a TCP port (1-65535)\n"


def test_every_printed_line_passes_the_redaction_rule():
    """The rule itself, on each form it covers and on text that must pass unchanged."""
    from embedlab.core.store import redact

    cases = {
        "ray://user:pw@host:10001": "ray://***@host:10001",
        "connecting to user:pw@10.0.0.5:6379 now": "connecting to ***@10.0.0.5:6379 now",
        "s3://AKID:se/cret@bucket/x": "s3://***@bucket/x",
        "s3://b/r?region=eu&aws_secret_access_key=x&endpoint_override=h:9000":
            "s3://b/r?region=eu&aws_secret_access_key=***&endpoint_override=h:9000",
        "gs://b/r?access_token=ya29.abc&X-Amz-Credential=c&sig=s": "gs://b/r?access_token=***&X-Amz-Credential=***&sig=***",
        "key AKIAIOSFODNN7EXAMPLE and hf_abcdefghijklmnopqrstuvwxyz0123": "key *** and ***",
        "Authorization: Bearer abc.def": "Authorization: Bearer ***",
        "/home/me/runs@v2/x": "/home/me/runs@v2/x",
        "s3://bucket/runs?region=eu-west-1": "s3://bucket/runs?region=eu-west-1",
        "mail me@example.com": "mail me@example.com",
    }
    assert {text: redact(text) for text in cases} == cases
