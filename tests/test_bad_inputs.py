"""The catalogue of bad inputs: each is refused with a message naming the file, field or id,
and nothing written earlier is touched (a finished run directory next to it stays byte-identical)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from embedlab.cli import main

from conftest import PLANTED, TEST_DATA, tiny_trial, write_study



class Storage:
    """A storage directory and whether its files are byte-identical to when it was made."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.snapshot = self._files()

    def _files(self) -> dict[Path, bytes]:
        return {p: p.read_bytes() for p in self.path.rglob("*") if p.is_file()}

    def intact(self) -> bool:
        return self._files() == self.snapshot

    def __str__(self) -> str:
        return str(self.path)


@pytest.fixture
def storage(tmp_path):
    """A storage holding one finished run; `intact()` says whether it is byte-identical."""
    storage = tmp_path / "runs"
    run_dir = storage / "earlier-20261129-120000"
    (run_dir / "trials").mkdir(parents=True)
    (run_dir / "study.json").write_text(json.dumps({"study": {"name": "earlier"}, "study_hash": "1" * 64}))
    (run_dir / "trials" / "t0.json").write_text(json.dumps({"arm": "a", "seed": 0, "dev/ndcg@10": 0.5}))
    return Storage(storage)


def _study(tmp_path: Path, budget: int = 10_000, extra: str = "", text: str | None = None) -> str:
    path = tmp_path / "bad_study.py"
    if text is not None:
        path.write_text(text)
        return str(path)
    return write_study(path, tiny_trial(num_workers=1), name="bad",
                       extra=f"budget=replace(DEFAULT_BUDGET, tokens={budget}){extra}")


def _refused(capsys, argv: list[str], *fragments: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err  # one line
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def test_unknown_key_in_a_study_file(tmp_path, storage, capsys):
    path = _study(tmp_path, extra=", sedes=(1,)")
    _refused(capsys, ["sweep", path, "--dry-run", "--storage", str(storage)], "bad_study.py", "sedes", "seeds")
    assert storage.intact()


def test_malformed_study_file(tmp_path, storage, capsys):
    path = _study(tmp_path, text="def study(:\n    pass\n")
    _refused(capsys, ["sweep", path, "--storage", str(storage)], "bad_study.py:1", "syntax error")
    assert storage.intact()


def test_unknown_config_key_in_a_study_file(tmp_path, storage, capsys):
    raw = tiny_trial(num_workers=1).to_dict()
    raw["train"]["learning_rat"] = 1e-3
    path = tmp_path / "bad_config.py"
    path.write_text(f"from embedlab.core.config import TrialConfig\nTrialConfig.from_dict({raw!r})\n")
    _refused(capsys, ["sweep", str(path), "--dry-run"], "bad_config.py", "learning_rat", "learning_rate")
    assert storage.intact()


def test_mixture_shares_that_do_not_sum_to_one(tmp_path, storage, capsys):
    path = write_study(tmp_path / "bad_study.py", tiny_trial(num_workers=1), name="bad",
                       change="data.mixture=replace(base.data.mixture, "
                              "shares=(('python-docs', 0.5), ('python-docstrings', 0.3)))")
    _refused(capsys, ["sweep", path, "--storage", str(storage)], "bad_study.py", "data.mixture.shares",
             "must sum to 1, got 0.800000")
    assert storage.intact()


@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_missing_or_empty_source(tmp_path, storage, capsys, ray_session, kind):
    source = tmp_path / ("nothing-here" if kind == "missing" else "empty-dir")
    if kind == "empty":
        source.mkdir()
    data = dataclasses.replace(TEST_DATA, local_files=(dataclasses.replace(PLANTED, path=str(source)),))
    spec = tmp_path / "data.json"
    spec.write_text(json.dumps(dataclasses.asdict(data)))
    message = "does not exist" if kind == "missing" else "no "
    _refused(capsys, ["data", "build", str(spec)], str(source), message)
    assert storage.intact()


def test_budget_too_small_for_one_step(tmp_path, storage, capsys):
    path = _study(tmp_path, budget=100)
    _refused(capsys, ["sweep", path, "--dry-run"], "study.budget.tokens", "less than one step", "512 tokens")
    assert storage.intact()


def test_corrupt_or_truncated_checkpoint(tmp_path, storage, capsys):
    from test_promote import TINY  # a one-layer encoder

    from embedlab.checkpoints.io import save_checkpoint
    from embedlab.model.encoder import MLMModel
    from embedlab.tokenizer.frozen import save_tokenizer, train_tokenizer

    tokenizer = save_tokenizer(train_tokenizer([f"text {i}" for i in range(50)], vocab_size=300), tmp_path / "tok")
    model = MLMModel(TINY)
    save_checkpoint(tmp_path / "ckpt", model.encoder, head=model.mlm_head, tokenizer=tokenizer,
                    fields={"config": tiny_trial().to_dict(), "data_revision": "r"})
    weights = tmp_path / "ckpt" / "encoder.safetensors"
    weights.write_bytes(weights.read_bytes()[: len(weights.read_bytes()) // 2])
    _refused(capsys, ["export", str(tmp_path / "ckpt"), str(tmp_path / "out")], "encoder.safetensors")
    assert not (tmp_path / "out").exists() and storage.intact()


def test_tokenizer_hash_that_does_not_match_the_checkpoint(tmp_path):
    from test_promote import TINY

    from embedlab.checkpoints.io import CheckpointError, load_parent, save_checkpoint
    from embedlab.model.encoder import MLMModel
    from embedlab.tokenizer.frozen import save_tokenizer, train_tokenizer

    tokenizer = save_tokenizer(train_tokenizer([f"text {i}" for i in range(50)], vocab_size=300), tmp_path / "tok")
    model = MLMModel(TINY)
    save_checkpoint(tmp_path / "ckpt", model.encoder, head=model.mlm_head, tokenizer=tokenizer, fields={})
    with pytest.raises(CheckpointError, match=r"ckpt: parent tokenizer .* differs from this phase's tokenizer"):
        load_parent(tmp_path / "ckpt", tokenizer_hash="f" * 64, need_head=False)


def test_missing_parent_checkpoint(tmp_path, storage, capsys):
    study = str(Path(__file__).parent.parent / "ablations" / "pooling.py")
    _refused(capsys, ["sweep", study, "--profile", "demo", "--parent", str(tmp_path / "no-such-checkpoint"),
                      "--storage", str(storage)], "checkpoint directory not found", "no-such-checkpoint")
    assert storage.intact()


def test_beir_task_whose_qrels_name_unknown_ids(tmp_path, storage, capsys):
    task = tmp_path / "task"
    (task / "qrels").mkdir(parents=True)
    (task / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "title": "", "text": "a document"}) + "\n")
    (task / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "a query"}) + "\n")
    (task / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td404\t1\n")
    _refused(capsys, ["evaluate", "--encoder", "baseline:bm25", "--task", str(task), "--json"],
             "qrels/test.tsv:3", "'d404'", "corpus.jsonl")
    assert storage.intact()


def test_unreachable_cluster_address(tmp_path, storage):
    """Refused within seconds (not after Ray's long GCS retries), naming the address."""
    path = _study(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "embedlab.cli", "sweep", path, "--address", "127.0.0.1:9", "--storage", str(storage)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2 and "cannot reach the Ray cluster at '127.0.0.1:9'" in done.stderr
    assert storage.intact()


def _release(tmp_path: Path) -> Path:
    from test_promote import TINY

    from embedlab.checkpoints.io import save_checkpoint
    from embedlab.model.encoder import MLMModel
    from embedlab.release.export import export_release
    from embedlab.tokenizer.frozen import save_tokenizer, train_tokenizer

    tokenizer = save_tokenizer(train_tokenizer([f"text {i}" for i in range(50)], vocab_size=300), tmp_path / "tok")
    model = MLMModel(TINY)
    save_checkpoint(tmp_path / "ckpt", model.encoder, head=model.mlm_head, tokenizer=tokenizer,
                    fields={"config": tiny_trial().to_dict(), "data_revision": "r"})
    export_release(tmp_path / "ckpt", tmp_path / "release")
    return tmp_path / "release"


def _task(tmp_path: Path, grades: tuple[str, ...]) -> Path:
    task = tmp_path / "task"
    (task / "qrels").mkdir(parents=True)
    (task / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": f"document {i}"}) + "\n"
                                               for i in range(2)))
    (task / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": f"query {i}"}) + "\n"
                                                for i in range(2)))
    (task / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                             + "".join(f"q{i}\td{i}\t{g}\n" for i, g in enumerate(grades)))
    return task


def test_an_edited_release_tokenizer_and_an_export_under_a_file_are_one_line_errors(tmp_path, storage, capsys):
    release = _release(tmp_path)
    task = _task(tmp_path, ("1", "1"))
    tokenizer = release / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text() + "\n")
    _refused(capsys, ["evaluate", "--encoder", str(release), "--task", str(task), "--split", "test"],
             f"tokenizer {tokenizer} has hash", "different tokenizer (or the file was edited)")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    _refused(capsys, ["export", str(tmp_path / "ckpt"), str(blocker / "out")], f"{blocker} is a file, not a directory")
    assert storage.intact() and blocker.read_text() == "x"


@pytest.mark.parametrize("grades, message", [
    (("0", "0"), "every grade is 0, so no query has a relevant document"),
    (("1", "-1"), "qrels/test.tsv:3: grade -1 for ('q1', 'd1') is outside 0..20"),
    (("1", "99999999999999999999"), "qrels/test.tsv:3: grade 99999999999999999999 for ('q1', 'd1') is outside 0..20"),
])
def test_qrels_grades_outside_their_range_or_all_zero_are_refused(tmp_path, storage, capsys, grades, message):
    _refused(capsys, ["evaluate", "--encoder", "baseline:bm25", "--task", str(_task(tmp_path, grades)), "--json"],
             message)
    assert storage.intact()


def test_a_pair_csv_that_is_not_utf8_names_its_line(tmp_path):
    from embedlab.core.config.sources import PairFiles, SourceError
    from embedlab.pairs.readers import read_pairs

    path = tmp_path / "pairs.csv"
    rows = "".join(f"query {i},positive text {i}\n" for i in range(5000))
    path.write_bytes(b"query,positive\n" + rows.encode() + "caf\u00e9 in latin-1,ok\n".encode("latin-1"))
    with pytest.raises(SourceError, match=r"pairs.csv line 5002: not UTF-8 \(byte 0xe9 at column 4"):
        read_pairs(PairFiles(name="mine", path=str(path), rights="test"))


def test_a_misspelt_config_field_in_a_study_file_names_that_config_and_the_close_field(tmp_path, capsys):
    path = tmp_path / "typo.py"
    path.write_text(
        "from dataclasses import replace\n"
        "from embedlab import Study, recipes\n"
        "from embedlab.core.config import DEFAULT_BUDGET\n\n"
        "def study(profile=None):\n"
        "    base = recipes.phase1_baseline('demo')\n"
        "    return Study(name='t', factor='masking.ratio', seeds=(0,), budget=DEFAULT_BUDGET,\n"
        "                 arms={'a': base, 'b': replace(base, masking=replace(base.masking, ration=0.3))})\n")
    _refused(capsys, ["sweep", str(path), "--dry-run"], f"{path}:8: MaskingConfig.__init__() got an unexpected "
             "keyword argument 'ration'; did you mean 'ratio'? MaskingConfig fields are [")


# --- issue 61: every numeric field, path kind and option refused before work, in one line ---------


class Tree:
    """Every file under a folder and its bytes: `unchanged()` says whether nothing was written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.snapshot = self._files()

    def _files(self) -> dict[Path, bytes]:
        return {p: p.read_bytes() for p in self.path.rglob("*") if p.is_file() and not p.is_symlink()}

    def unchanged(self) -> bool:
        return self._files() == self.snapshot


def _tiny_study(tmp_path: Path, extra: str, *, name: str = "bad_study.py") -> str:
    return write_study(tmp_path / name, tiny_trial(num_workers=1), name="bad", extra=extra)


@pytest.mark.parametrize("budget, message", [
    ("tokens=float('inf')", "train.budget.tokens: inf: must be a finite amount of at most 1e+15 tokens"),
    ("tokens=10**30", "train.budget.tokens: 1e+30: must be a finite amount of at most 1e+15 tokens"),
    ("tokens=4000, flops=1e40", "train.budget.flops: 1e+40: must be a finite amount of at most 1e+27 flops"),
    ("tokens=4000, flops=float('nan')", "train.budget.flops: nan: must be a finite amount of at most 1e+27 flops"),
    ("tokens='4000'", "train.budget.tokens: must be an integer, got str '4000'"),
    ("tokens=4000.0", "train.budget.tokens: must be an integer, got float 4000.0"),
])
def test_a_budget_beyond_its_maximum_or_not_a_number_is_refused_naming_the_maximum(tmp_path, capsys, budget,
                                                                                    message):
    """inf, 1e40 FLOPs, 10**30 tokens, NaN, a string and a float token count: one line naming the
    field and (for an amount) the largest budget embedlab trains to; nothing is written."""
    path = _tiny_study(tmp_path, f"budget=Budget({budget}, pairs=2000)")
    tree = Tree(tmp_path)
    tree = Tree(tmp_path)
    _refused(capsys, ["sweep", path, "--dry-run", "--storage", str(tmp_path / "runs")], "bad_study.py", message)
    assert tree.unchanged() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("seeds, message", [
    ("('0',)", "study.seeds: item 0: must be an integer, got str '0'"),
    ("(0.0,)", "study.seeds: item 0: must be an integer, got float 0.0"),
    ("(True,)", "study.seeds: item 0: must be an integer, got bool True"),
    ("(-1,)", "study.seeds: -1: a seed is an integer in [0, 2**32)"),
    ("(2**40,)", "study.seeds: 1099511627776: a seed is an integer in [0, 2**32)"),
])
def test_seeds_must_be_integers_in_numpys_range(tmp_path, capsys, seeds, message):
    """A seed given as a string, a float or a bool, or outside [0, 2**32), is refused in one line."""
    path = write_study(tmp_path / "bad_study.py", tiny_trial(num_workers=1), name="bad", seeds=eval(seeds))
    _refused(capsys, ["sweep", path, "--dry-run"], "bad_study.py", message)


def test_an_arm_that_is_not_a_trial_config_is_named(tmp_path, capsys):
    """An arm given as a string (it once crashed Study.__post_init__ reading its eval section)."""
    path = tmp_path / "bad_study.py"
    path.write_text("from embedlab import Study\nfrom embedlab.core.config import DEFAULT_BUDGET, TrialConfig\n\n"
                    "def study():\n"
                    "    return Study(name='s', factor='masking.ratio', seeds=(0,), budget=DEFAULT_BUDGET,\n"
                    "                 arms={'a': TrialConfig(), 'b': 'masking.ratio=0.3'})\n")
    _refused(capsys, ["sweep", str(path), "--dry-run"],
             f"{path}:5: study.arms['b']: must be a TrialConfig, got str 'masking.ratio=0.3'")


def test_a_model_no_configured_node_can_hold_is_refused_by_the_dry_run_with_its_estimate(tmp_path, capsys):
    """100,000 layers at width 65,536: the dry run states what one worker needs (its parameters
    by the encoder's formula, 16 bytes each) and the largest node there is, and refuses."""
    from embedlab.model.memory import encoder_parameters, gib
    from embedlab.sweep.capacity import FLEET_NODES, this_machine

    config = tiny_trial(num_workers=1)
    huge = dataclasses.replace(config.model, layers=100_000, width=65_536, heads=64, ffn_width=4 * 65_536)
    config = dataclasses.replace(config, model=huge)
    path = write_study(tmp_path / "huge.py", config, name="huge", extra="budget=replace(DEFAULT_BUDGET, tokens=4_000)")
    parameters = encoder_parameters(huge) + 65_536 ** 2 + 3 * 65_536 + huge.vocab_size
    largest = max((this_machine(), *FLEET_NODES), key=lambda node: node.host_memory)
    err = _refused(capsys, ["sweep", path, "--dry-run", "--storage", str(tmp_path / "runs")],
                   "arm mask-15: a model of 100,000 layers at width 65,536, 8 rows a microbatch, needs at least ",
                   f"per CPU worker ({parameters:,} parameters: ",
                   f"the largest of this machine or the fleets in workers/, {largest.name}, holds "
                   f"{gib(largest.host_memory)}: use a smaller model or batch (or --profile)")
    assert parameters == 5_153_991_332_004_864 and "7.68e+07 GiB of weights, gradients and AdamW state" in err
    assert not (tmp_path / "runs").exists()


def test_a_nan_pair_score_is_refused_like_any_score_that_is_not_a_number(tmp_path, capsys):
    """A JSON `NaN` and a CSV `nan` in the score column: refused naming the file, the line and the
    column, never kept as a positive pair."""
    from test_preflight import PAIRS, _study as pair_study

    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text("".join(json.dumps({**p, "score": float("nan") if i == 3 else 1.0}) + "\n"
                             for i, p in enumerate(PAIRS)))
    _refused(capsys, ["sweep", pair_study(tmp_path, jsonl), "--dry-run"],
             f"{jsonl} line 4: column 'score' is NaN, expected a finite number")
    csv = tmp_path / "pairs.csv"
    csv.write_text("query,positive,score\n" + "".join(f"{p['query']},{p['positive']},{'nan' if i == 5 else 1}\n"
                                                      for i, p in enumerate(PAIRS)))
    _refused(capsys, ["sweep", pair_study(tmp_path, csv), "--dry-run"],
             f"{csv} line 7: column 'score' is NaN, expected a finite number")


def test_a_pairs_csv_linked_to_etc_passwd_is_refused_without_its_first_line(tmp_path, capsys):
    """The header of a file that is not a pairs file is not quoted: the error counts its columns."""
    from test_preflight import _study as pair_study

    link = tmp_path / "pairs.csv"
    link.symlink_to("/etc/passwd")
    first = Path("/etc/passwd").read_text().splitlines()[0]
    err = _refused(capsys, ["sweep", pair_study(tmp_path, link), "--dry-run"],
                   f"{link}: no pair columns among 1 not shown (not name-like); expected one of: anchor + positive")
    assert first not in err and first.split(":")[0] + ":" not in err


@pytest.mark.parametrize("argv, message", [
    (["--storage", ""], "storage '': an empty location; name a folder (default ./runs) or a URI"),
    (["--max-concurrent", "0"], "--max-concurrent 0: Tune needs at least 1 trial at a time"),
    (["--wait-for-resources", "-1"], "--wait-for-resources -1: give seconds to wait"),
    (["--address", "127.0.0.1:99999"], "--address 127.0.0.1:99999: port '99999' is not a TCP port (1-65535)"),
    (["--address", "http://127.0.0.1:8265"], "--address http://127.0.0.1:8265: a Ray address is HOST:PORT or "
                                             "ray://HOST:PORT (the client port), not a http:// URI"),
    (["--budget-scale", "inf"], "budget scale: inf: must be a finite positive factor"),
])
def test_a_bad_option_is_refused_by_the_dry_run_and_the_sweep_before_ray(tmp_path, capsys, monkeypatch, argv,
                                                                          message):
    """Each option is checked by the dry run and, before Ray starts, by the sweep itself."""
    from embedlab.sweep import run as run_module

    monkeypatch.setattr(run_module, "connect", lambda *a, **k: pytest.fail("the sweep started Ray before its checks"))
    path = _tiny_study(tmp_path, "budget=replace(DEFAULT_BUDGET, tokens=4_000)")
    tree = Tree(tmp_path)
    for dry in (["--dry-run"], []):
        _refused(capsys, ["sweep", path, *dry, *argv], message)
    assert tree.unchanged() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("ladder", ["1,inf", "0.5,nan", "-1,1"])
def test_a_ladder_of_a_factor_that_is_not_finite_and_positive_is_refused(tmp_path, capsys, ladder):
    path = _tiny_study(tmp_path, "budget=replace(DEFAULT_BUDGET, tokens=4_000)")
    _refused(capsys, ["sweep", path, f"--ladder={ladder}", "--dry-run"],
             f"--ladder '{ladder}': two or more distinct finite positive budget factors")


def test_a_ladder_dry_run_runs_every_check_of_the_plain_dry_run(tmp_path, capsys):
    """A pairs file the plain dry run refuses, a storage that is a file or carries a credential,
    an out-of-range port: the ladder's dry run refuses each the same way; nothing is written."""
    from test_preflight import _study as pair_study

    missing = pair_study(tmp_path, tmp_path / "nothing.jsonl")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    good = _tiny_study(tmp_path, "budget=replace(DEFAULT_BUDGET, tokens=4_000)", name="good.py")
    tree = Tree(tmp_path)
    for study, argv, message in (
            (missing, [], f"source 'mine': path {tmp_path / 'nothing.jsonl'} does not exist"),
            (good, ["--storage", str(blocker)], f"storage {blocker}: {blocker} is a file, not a directory"),
            (good, ["--storage", str(blocker / "runs")], f"storage {blocker / 'runs'}: {blocker} is a file"),
            (good, ["--storage", "s3://bucket/runs?token=S3CR3T"], "storage s3://bucket/runs?token=***: a location "
                                                                    "carries no credentials (token)"),
            (good, ["--address", "127.0.0.1:0"], "port '0' is not a TCP port")):
        plain = _refused(capsys, ["sweep", study, "--dry-run", *argv], message)
        assert _refused(capsys, ["sweep", study, "--ladder", "0.5,1", "--dry-run", *argv], message) == plain
        assert "S3CR3T" not in plain
    for argv in (["--dry-run"], []):  # a real ladder too refuses a storage that is a file before any rung
        _refused(capsys, ["sweep", good, "--ladder", "0.5,1", "--storage", str(blocker), *argv],
                 f"{blocker} is a file, not a directory")
    assert tree.unchanged()


def test_a_tour_dry_run_checks_its_storage_and_options(tmp_path, capsys):
    """`tour --dry-run` refuses a storage that is a file or carries a credential, and a bad
    --max-concurrent, as a sweep's dry run does."""
    tour = str(Path(__file__).parent.parent / "ablations" / "recipe.py")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for argv, message in (
            (["--storage", str(blocker)], f"storage {blocker}: {blocker} is a file, not a directory"),
            (["--storage", "s3://KEY:S3CR3T@bucket/runs"], "storage s3://***@bucket/runs: a location carries no "
                                                           "credentials (userinfo (user:password@) in its authority)"),
            (["--max-concurrent", "0"], "--max-concurrent 0: Tune needs at least 1 trial at a time")):
        err = _refused(capsys, ["tour", tour, "--profile", "demo", "--dry-run", *argv], message)
        assert "S3CR3T" not in err
    assert blocker.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_phase_2_study_without_a_parent_is_refused_before_a_cluster_starts(tmp_path, capsys, monkeypatch):
    """The sweep (not its dry run, which prints what it would need) refuses before `connect`."""
    from embedlab.sweep import run as run_module

    monkeypatch.setattr(run_module, "connect", lambda *a, **k: pytest.fail("the sweep started Ray before its checks"))
    study = str(Path(__file__).parent.parent / "ablations" / "pooling.py")
    _refused(capsys, ["sweep", study, "--profile", "demo", "--storage", str(tmp_path / "runs")],
             "study pooling trains phase 2 from a parent checkpoint: give --parent CKPT_DIR")
    assert not (tmp_path / "runs").exists()


def test_a_hub_dataset_that_cannot_resolve_offline_is_refused_before_a_cluster_starts(tmp_path, capsys,
                                                                                      monkeypatch):
    """HF_HUB_OFFLINE and a Hub dataset not in the cache: refused, naming it, before `connect`."""
    from embedlab.core.config import HFDataset
    from embedlab.sweep import run as run_module

    monkeypatch.setattr(run_module, "connect", lambda *a, **k: pytest.fail("the sweep started Ray before its checks"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # an empty cache
    config = tiny_trial(num_workers=1)
    web = HFDataset(name="web", dataset="embedlab-tests/no-such-dataset", revision="0" * 40)
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, hf_datasets=(web,)))
    path = write_study(tmp_path / "hub.py", config, name="hub")
    _refused(capsys, ["sweep", path, "--storage", str(tmp_path / "runs")],
             f"documents 'web': hub dataset 'embedlab-tests/no-such-dataset' at revision '{'0' * 40}' does not "
             "resolve (ConnectionError); offline (HF_HUB_OFFLINE), only a dataset in the local cache resolves")
    assert not (tmp_path / "runs").exists()


def test_an_error_in_the_study_files_own_code_is_reported_as_theirs(tmp_path, capsys):
    """An exception raised by study() is one line: the file, the line, the type and the message;
    `embedlab --debug` prints its traceback through that line above it."""
    path = tmp_path / "mine.py"
    path.write_text("from embedlab import recipes\n\n\ndef study(profile=None):\n    base = recipes.phase1_baseline('demo')\n"
                    "    return {'a': base}['b']\n")
    _refused(capsys, ["sweep", str(path), "--dry-run"],
             f"error: {path}:6: KeyError: 'b' (raised by the study file's own code; `embedlab --debug ...` shows "
             "its traceback)")
    assert main(["--debug", "sweep", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f'File "{path}", line 6, in study' in err and err.splitlines()[-1].startswith(f"error: {path}:6: KeyError")
    path.write_text("import no_such_module_here\n")  # at import: the same
    _refused(capsys, ["sweep", str(path), "--dry-run"],
             f"{path}:1: ModuleNotFoundError: No module named 'no_such_module_here'")


def test_a_study_path_of_the_wrong_kind_is_named(tmp_path, capsys):
    """A directory, /etc/passwd, a file not named *.py and a named pipe: each named for what it is."""
    import os

    pipe = tmp_path / "pipe.py"
    os.mkfifo(pipe)
    text = tmp_path / "study.txt"
    text.write_text("def study(): pass\n")
    for path, message in ((tmp_path, f"study file {tmp_path}: a directory, not a file"),
                          ("/etc/passwd", "study file /etc/passwd: not a *.py file"),
                          (text, f"study file {text}: not a *.py file"),
                          (pipe, f"study file {pipe}: a named pipe, not a file")):
        _refused(capsys, ["sweep", str(path), "--dry-run"], message)
    _refused(capsys, ["tour", "/etc/passwd", "--dry-run"], "tour file /etc/passwd: not a *.py file")


def test_path_arguments_of_the_wrong_kind_are_refused_before_work(tmp_path, storage, capsys, monkeypatch):
    """A checkpoint that is a file; --out a directory, a file or under a file for report and
    heldout build (before their work); --storage a named pipe; EMBEDLAB_CACHE a file."""
    import os

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    study = _tiny_study(tmp_path, "budget=replace(DEFAULT_BUDGET, tokens=4_000)")
    run = next(storage.path.iterdir())
    tree = Tree(tmp_path)
    for argv, message in (
            (["export", str(blocker), str(tmp_path / "out")], f"checkpoint {blocker}: a file, not a directory"),
            (["sweep", study, "--dry-run", "--parent", str(blocker)], f"checkpoint {blocker}: a file, not a directory"),
            (["report", str(run), "--out", str(tmp_path)], f"--out {tmp_path}: a directory, not a file"),
            (["report", str(run), "--out", str(blocker / "r.html")],
             f"--out {blocker / 'r.html'}: {blocker} is a file, not a directory"),
            (["heldout", "build", "--out", str(blocker)], f"--out {blocker}: a file, not a directory"),
            (["sweep", study, "--dry-run", "--storage", str(pipe)], f"storage {pipe}: {pipe} is a named pipe, "
                                                                    "not a directory")):
        _refused(capsys, argv, message)
    monkeypatch.setenv("EMBEDLAB_CACHE", str(blocker))
    for argv in (["sweep", study, "--dry-run"], ["heldout", "build"]):
        _refused(capsys, argv, f"EMBEDLAB_CACHE={blocker}: a file, not a directory; point EMBEDLAB_CACHE at a "
                               "directory")
    assert tree.unchanged() and storage.intact() and not (tmp_path / "out").exists()


def test_stats_ladder_projecting_to_a_negative_budget_is_refused(tmp_path, storage, capsys):
    run = str(next(storage.path.iterdir()))
    for value in ("-1", "0", "inf", "nan"):
        _refused(capsys, ["stats", "ladder", run, run, "--project-to", value],
                 f"--project-to {float(value):g}: a number of training FLOPs, positive and finite")


def test_a_truncated_promotion_json_is_named_by_report(tmp_path, capsys):
    """report reads the run's promotion.json: a truncated one is named, nothing is written."""
    import shutil

    run = tmp_path / "demo-dual-heads-20261208-020823"
    shutil.copytree(Path(__file__).parent.parent / "docs" / "results" / "runs" / run.name, run)
    promotion = run / "promotion.json"
    promotion.write_bytes(promotion.read_bytes()[:100])
    tree = Tree(tmp_path)
    _refused(capsys, ["report", str(run), "--out", str(tmp_path / "report.html")],
             f"{promotion}: not a promotion record: truncated or invalid JSON")
    assert tree.unchanged() and not (tmp_path / "report.html").exists()


def test_a_user_pairs_sweep_refused_for_too_few_pairs_leaves_no_trace_in_the_prepared_data(
        tmp_path, prepared, parent, capsys):
    """A phase-2 sweep whose budget schedules more pairs than its user pairs file holds is refused
    by the gate before any trial; the shared prepared directory keeps no frozen pairs of it and
    its data card is byte-identical, and no run directory is made."""
    from conftest import TEST_DATA
    from embedlab.core.config import ContrastiveConfig, PairFiles, TrialConfig
    from test_preflight import PAIRS

    pairs = tmp_path / "few.jsonl"
    pairs.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    data = dataclasses.replace(TEST_DATA, pair_files=(PairFiles(name="few", path=str(pairs), rights="test"),))
    trial = dataclasses.replace(tiny_trial(num_workers=1), phase=2, data=data,
                                contrastive=ContrastiveConfig(pairs=(("few", 1.0),)))
    study = write_study(tmp_path / "few_pairs.py", TrialConfig.from_dict(trial.to_dict()), name="few-pairs",
                        change="contrastive.temperature=0.1", extra="budget=replace(DEFAULT_BUDGET, pairs=4_000)")
    shared = Tree(prepared.directory)
    _refused(capsys, ["sweep", study, "--parent", str(parent), "--storage", str(tmp_path / "runs")],
             "study few-pairs, arm mask-15: its budget schedules more pairs than the frozen pairs hold", "'few'")
    assert shared.unchanged() and not (tmp_path / "runs").exists()
    assert sorted(p.name for p in prepared.directory.rglob(".*.lock") if "few" in p.name) == []


def test_a_source_that_is_a_uri_is_refused_naming_its_scheme_only():
    """Pair files, BEIR folders, document files and Hub dataset names that are URIs are refused
    at construction, naming the field and the scheme, never the URI (it may carry a credential)."""
    from embedlab.core.config import BEIRPairs, HFDataset, HFPairs, LocalFiles, PairFiles, SourceError

    uri = "s3://AKIDKEY:S3CR3T@bucket/data"
    for build, field in ((lambda: PairFiles(name="p", path=uri, rights="r"), "path"),
                         (lambda: BEIRPairs(name="p", path=uri, rights="r"), "path"),
                         (lambda: LocalFiles(name="p", path=uri), "path"),
                         (lambda: HFPairs(name="p", dataset=uri, revision="0" * 40, rights="r"), "dataset"),
                         (lambda: HFDataset(name="p", dataset=uri, revision="0" * 40), "dataset")):
        with pytest.raises(SourceError) as error:
            build()
        assert str(error.value) == (f"source 'p': {field} is a s3:// URI; sources are read from this machine, so "
                                    "copy the files to a local (or shared) disk and name that path (the URI is not "
                                    "shown: it may carry a credential)")


def test_a_task_folder_or_data_spec_of_the_wrong_kind_is_named(tmp_path, capsys):
    """A BEIR task folder that is a file and `data build DIR`: what is there, not "not found"."""
    from embedlab.core.beir import TaskFormatError, load_task

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(TaskFormatError) as error:
        load_task(blocker)
    assert str(error.value) == f"{blocker}: a file, not a task directory (corpus.jsonl, queries.jsonl, qrels/)"
    _refused(capsys, ["data", "build", str(tmp_path)], f"data spec {tmp_path}: a directory, not a file")
