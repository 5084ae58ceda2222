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
