"""Object storage as the home of everything a sweep writes and reads, against a real
S3-compatible server started on loopback (moto's standalone server: `conftest.s3_server`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from embedlab.core import store
from embedlab.core.errors import UsageError
from embedlab.checkpoints.io import (
    CACHE_DIR, ENCODER_FILE, MANIFEST_FILE, CheckpointError, load_encoder, local_checkpoint, verify_checkpoint,
)

from conftest import S3_KEY_ID, S3_SECRET, run_dirs


@pytest.mark.parametrize("location", [
    "s3://key:secret@bucket/runs",
    "s3://bucket/runs?access_key=AKIA&secret_key=abc",
    "gs://bucket/runs?access_token=ya29",
])
def test_a_location_with_credentials_is_refused_and_never_echoed(location):
    with pytest.raises(UsageError) as error:
        store.check_location(location)
    message = str(error.value)
    assert "AWS_ACCESS_KEY_ID" in message and "credentials" in message
    for secret in ("secret", "abc", "ya29", "AKIA"):
        assert f"={secret}" not in message and f":{secret}@" not in message
    with pytest.raises(UsageError):  # every storage operation checks, not only the sweep's start
        store.exists(store.join(location, "study.json"))


def test_uri_parts_keep_the_query():
    uri = "s3://bucket/runs?region=eu-west-1"
    assert store.join(uri, "study-1", "trials") == "s3://bucket/runs/study-1/trials?region=eu-west-1"
    assert store.name(store.join(uri, "study-1")) == "study-1"
    assert store.parent(store.join(uri, "study-1")) == uri
    import pyarrow.fs as pafs

    assert store.location_of(pafs.S3FileSystem(), "bucket/runs/x/checkpoint_0", like=uri) == (
        "s3://bucket/runs/x/checkpoint_0?region=eu-west-1")
    assert store.location_of(pafs.LocalFileSystem(), "/tmp/runs/x", like="/tmp/runs") == "/tmp/runs/x"


@pytest.fixture
def remote_parent(s3_server, parent, tmp_path, monkeypatch):
    """The synthetic parent checkpoint uploaded to a fresh bucket, and a private node cache."""
    import uuid

    bucket = s3_server.bucket(f"ckpt-{uuid.uuid4().hex[:8]}")
    location = store.join(bucket, "runs", "study-1", "train", "checkpoint_000000")
    store.upload_tree(Path(parent), location)
    monkeypatch.setenv("EMBEDLAB_CACHE", str(tmp_path / "node-cache"))
    return location


def test_a_remote_checkpoint_is_fetched_once_verified_and_loads_like_the_local_one(remote_parent, parent):
    local = local_checkpoint(remote_parent)
    assert local.parent == store.cache_dir() / CACHE_DIR
    assert verify_checkpoint(remote_parent) == verify_checkpoint(Path(parent))
    ours, _, _ = load_encoder(remote_parent)
    theirs, _, _ = load_encoder(Path(parent))
    assert all((a == b).all() for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))
    # Fetched once: a second reader is served by the published copy, not the store.
    (local / "marker").write_text("seen")
    assert local_checkpoint(remote_parent) == local and (local / "marker").is_file()
    # Only what readers need: weights, tokenizer, manifest (not the training state).
    manifest = json.loads((local / MANIFEST_FILE).read_text())
    assert sorted(p.name for p in local.iterdir() if p.name != "marker") == sorted(
        [*manifest["files"], "tokenizer.json", MANIFEST_FILE])


def test_a_corrupted_object_is_refused_by_hash_and_never_cached(remote_parent):
    weights = store.join(remote_parent, ENCODER_FILE)
    data = bytearray(store.read_bytes(weights))
    data[-1] ^= 0xFF
    store.write_bytes(weights, bytes(data))
    with pytest.raises(CheckpointError, match=f"{ENCODER_FILE}: content hash mismatch"):
        local_checkpoint(remote_parent)
    cache = store.cache_dir() / CACHE_DIR
    assert not cache.is_dir() or not any(cache.iterdir())  # no copy, no staging left


def test_a_missing_remote_checkpoint_is_a_clear_error(s3_server, tmp_path, monkeypatch):
    monkeypatch.setenv("EMBEDLAB_CACHE", str(tmp_path / "node-cache"))
    bucket = s3_server.bucket("empty-ckpt")
    with pytest.raises(CheckpointError, match="no manifest.json; not an embedlab checkpoint"):
        verify_checkpoint(store.join(bucket, "nothing-here"))


def _secrets_absent(text: str, where: str) -> None:
    assert S3_SECRET not in text and S3_KEY_ID not in text, f"a credential in {where}"


DIVERGING = 1e30  # a learning rate whose second step overflows fp32: a non-finite loss


def _panel(tmp_path: Path):
    """A user's BEIR folder and a Hub task (a local directory in the Hub's layout, pinned by its
    content revision), both of Debian package descriptions: 30 dev and 30 test queries each."""
    from embedlab.core.beir import Task, write_task
    from embedlab.tasks.heldout import DPKG_STATUS, read_dpkg_status
    from embedlab.tasks.hub_tasks import HubTask, local_dataset_revision

    from test_hub_tasks import write_hub_directory

    items = read_dpkg_status(DPKG_STATUS).items[:120]
    qrels = {split: {f"q{i}": {f"d{i}": 1} for i in range(start, start + 30)} for split, start in (("dev", 0),
                                                                                                  ("test", 30))}

    def task(name, held):
        return Task(name=name, corpus={f"d{i}": ("", it.document) for i, it in enumerate(held)},
                    queries={f"q{i}": it.query for i, it in enumerate(held)}, qrels=qrels)

    task_dir = tmp_path / "packages"
    write_task(task("packages", items[:60]), task_dir)
    hub_dir = write_hub_directory(tmp_path / "hub-packages", task("more-packages", items[60:]))
    return task_dir, HubTask(name="more-packages", dataset=str(hub_dir), revision=local_dataset_revision(hub_dir))


# One study proves what three sweeps did (storage on S3, tuning with a failing trial, a scored
# panel, promotion into a child phase, release): each sweep costs about a minute of Ray start-ups.
@pytest.mark.timeout(900)
def test_a_tuned_panel_study_on_s3_from_sweep_to_release(ray_session, prepared, s3_server, tmp_path, capsys,
                                                         monkeypatch, offline_hub):
    """`--storage s3://...`: a phase-1 study, scored on a panel and tuned by Optuna (two tuning
    trials per arm, one of them diverging), runs its tuning, grid, evaluation, promotion on the
    panel mean, the phase-2 child started from the promoted checkpoint's URI, `table`, `report`
    and `export` with nothing written to a local run directory; no credential reaches the
    console, a record, a manifest or a log.

    Tuning: each arm's two tuning trials draw a good and a diverging learning rate (checked
    first against the study's own sampler): the diverging one leaves a nonfinite row, Optuna
    records it FAIL, study.json and the console list it, the choice takes the finished one, the
    final trials run at the study seed with it (never a tuning seed), at equal consumed tokens.
    Panel: every scored trial's per-task columns equal an in-process evaluation of its
    checkpoint, the mean column is their unweighted mean, and its per-query values (beside, not
    inside, its row) average to its means; promotion reports each task's test split and their
    mean once, and the child records the winner's hash as its parent, scored by the same evaluator."""
    import dataclasses
    import math

    import optuna

    from embedlab import load_table
    from embedlab.cli import main
    from embedlab.core.config import ContrastiveConfig
    from embedlab.stats.table import check_equal_compute, render
    from embedlab.studies.study import TUNING_SEED_OFFSET
    from embedlab.sweep.optuna_search import SamplerChoice
    from embedlab.tasks.hub_tasks import materialise_hub_task

    from conftest import tiny_trial, write_study
    from test_ray_end_to_end import in_process

    choices = (1e-3, 3e-3, DIVERGING)
    probe = optuna.create_study(sampler=SamplerChoice.for_trials(2, TUNING_SEED_OFFSET).build(), direction="maximize")
    drawn = [probe.ask().suggest_categorical("train.learning_rate", list(choices)) for _ in range(2)]
    assert DIVERGING in drawn and set(drawn) - {DIVERGING}, f"the sampler now draws {drawn}: pick other choices"

    monkeypatch.chdir(tmp_path)  # the default storage (runs/) would land here
    storage = store.join(s3_server.bucket("sweeps"), "runs")
    task_dir, hub = _panel(tmp_path)
    base = tiny_trial(num_workers=1, max_rejected_steps=1)
    trial = dataclasses.replace(base, eval=dataclasses.replace(base.eval, tasks=(str(task_dir),), hub_tasks=(hub,)))
    study_file = write_study(tmp_path / "tiny_s3.py", trial, name="tiny-s3", extra=(
        "budget=replace(DEFAULT_BUDGET, tokens=4_000), metric='mean/dev/ndcg@10', "
        f"search=(Search('train.learning_rate', choices={choices!r}),), search_trials=2"))
    assert main(["sweep", study_file, "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "trials: 6 (2 arms x (2 tuning + 1 seeds))" in plan and "tuning seeds: 10000, 10001 (never a study seed" in plan
    assert main(["sweep", study_file, "--storage", storage]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    (run_dir,) = run_dirs(storage, "tiny-s3")
    table = load_table(run_dir)
    assert sorted(table["stage"]) == ["final", "final", "tune", "tune", "tune", "tune"]
    assert all(c.startswith(f"{run_dir}/train/") for c in table["checkpoint"].dropna())
    optuna_db = tmp_path / "optuna.db"  # Optuna's storage, copied to the run
    store.download(store.join(run_dir, "optuna.db"), optuna_db)
    record = json.loads(store.read_text(store.join(run_dir, "study.json")))
    tuning = record["tuning"]
    assert tuning["sampler"].startswith(f"RandomSampler(seed={TUNING_SEED_OFFSET})")
    assert tuning["trials_per_arm"] == 2 and tuning["seeds"] == [10_000, 10_001]
    assert set(tuning["failed"]) == {"mask-15", "mask-30"}
    metric = "mean/dev/ndcg@10"
    final = table[table["stage"] == "final"]
    assert list(final["arm"]) == ["mask-15", "mask-30"] and list(final["factor_value"]) == [0.15, 0.3]
    assert list(final["seed"]) == [0, 0] and set(final["status"]) == {"finished"}
    for arm in ("mask-15", "mask-30"):
        tune = table[(table["stage"] == "tune") & (table["arm"] == arm)]
        assert sorted(tune["seed"]) == [10_000, 10_001]
        diverged = tune[tune["param/train.learning_rate"] == DIVERGING]
        assert list(diverged["status"]) == ["nonfinite"] and diverged[metric].isna().all()
        assert tuning["failed"][arm] == [{"trial_id": diverged["trial_id"].item(), "status": "nonfinite",
                                          "error": diverged["error"].item()}]
        assert "non-finite" in diverged["error"].item()
        chosen = tune[tune["status"] == "finished"]
        assert final[final["arm"] == arm]["param/train.learning_rate"].item() == (
            chosen["param/train.learning_rate"].item()) != DIVERGING
        stored = optuna.load_study(study_name=f"tiny-s3-{arm}", storage=f"sqlite:///{optuna_db}")
        states = {t.params["train.learning_rate"]: t.state.name for t in stored.trials}
        assert states[DIVERGING] == "FAIL" and sorted(states.values()) == ["COMPLETE", "FAIL"]
        assert f"optuna: arm {arm}: 1 of 2 tuning trial(s) failed, excluded from the choice" in out
    assert check_equal_compute(final, "tokens") <= 0.01
    assert final["budget/flops"].gt(0).all() and final["compute/device_seconds"].gt(0).all()
    scored = table[table["status"] == "finished"]
    for column in ("compute/eval_flops", "compute/eval_seconds", "compute/eval_wall_seconds"):
        assert scored[column].gt(0).all(), column
    # The panel: each scored trial's per-task scores are what this process computes from its checkpoint.
    hub_folder = materialise_hub_task(hub).directory  # the sweep's cached copy
    for row in scored.to_dict("records"):
        checkpoint = local_checkpoint(row["checkpoint"])
        for name, folder in (("packages", task_dir), ("more-packages", hub_folder)):
            ours = in_process(checkpoint, folder, "dev", index=trial.eval.index, max_length=trial.eval.max_length)
            assert row[f"{name}/dev/ndcg@10"] == ours["ndcg@10"], name
        assert row["python-docstrings/dev/ndcg@10"] == row["dev/ndcg@10"]
        assert row[metric] == math.fsum(
            row[f"{n}/dev/ndcg@10"] for n in ("python-docstrings", "packages", "more-packages")) / 3
    # Scored trials have per-query files averaging to their means; the diverged ones, with no scores, have none.
    assert {p.split("/")[1].removesuffix(".json") for p in store.list_tree(run_dir) if p.startswith("per_query/")} == (
        set(scored["trial_id"]))
    for row in scored.to_dict("records"):
        assert "per_query" not in row
        stored = json.loads(store.read_text(store.join(run_dir, "per_query", f"{row['trial_id']}.json")))
        assert {k: stored[k] for k in ("trial_id", "arm", "seed", "stage", "split", "task_hash")} == {
            "trial_id": row["trial_id"], "arm": row["arm"], "seed": row["seed"], "stage": row["stage"],
            "split": "dev", "task_hash": row["eval/task_hash"]}
        assert {"dev/ndcg@10", "dev/recall@100", "dev/mrr@10", "dev/map"} <= set(stored["values"])
        for column in ("dev/ndcg@10", "dev/recall@100", "dev/mrr@10", "dev/map"):
            values = stored["values"][column]
            assert len(values) == row["dev/queries"]
            assert sum(values.values()) / len(values) == pytest.approx(row[column], abs=1e-12)
    text = render(run_dir)
    assert "excluded from statistics:" in text
    for trial_id in table.loc[table["status"] == "nonfinite", "trial_id"]:
        assert any(trial_id in line and "nonfinite" in line for line in text.splitlines())
    # The prepared data, published by hash beside the runs for nodes without the driver's disk.
    arm_record = json.loads(store.read_text(store.join(run_dir, "prepared.json")))["mask-15"]
    published = json.loads(store.read_text(store.join(arm_record["published"], "files.json")))
    assert published["tree_hash"] == arm_record["tree_hash"] and "pieces.parquet" in published["files"]
    assert main(["table", run_dir, "--format", "markdown"]) == 0

    # Promote on the panel mean into a phase-2 study of one's own (--next), and run it.
    # Scored at a truncated width too: the parent must be scored at it as well (a study ranked
    # on a truncated width's metric once stopped on the parent's missing score).
    tiny = tiny_trial(num_workers=1)
    child_base = dataclasses.replace(
        tiny, phase=2, eval=dataclasses.replace(tiny.eval, dims=(tiny.model.width // 2,)),
        contrastive=ContrastiveConfig(pairs=(("title-body", 0.5), ("same-source-spans", 0.5)), pair_length=48))
    next_file = write_study(tmp_path / "tiny_pool.py", child_base, name="tiny-s3-pool", arms=("mean", "cls"),
                            change="contrastive.pooling='cls'", extra="budget=Budget(tokens=4_000, pairs=32)")
    capsys.readouterr()
    assert main(["promote", run_dir, "--next", next_file, "--run", "--max-retention-drop", "1.0"]) == 0, (
        capsys.readouterr().err)
    promotion = json.loads(store.read_text(store.join(run_dir, "promotion.json")))
    winner = final.loc[final[metric].idxmax()]
    assert promotion["winner"]["arm"] == winner["arm"] and promotion["checkpoint"] == winner["checkpoint"]
    assert promotion["checkpoint"].startswith("s3://")
    final_eval = promotion["final_eval"]
    assert final_eval["split"] == "test" and final_eval["metric"] == "mean/test/ndcg@10"
    assert set(final_eval["tasks"]) == {"python-docstrings", "packages", "more-packages"}
    assert final_eval["value"] == math.fsum(t["value"] for t in final_eval["tasks"].values()) / 3
    assert store.is_file(store.join(run_dir, "next_study.py"))
    (child_dir,) = run_dirs(storage, "tiny-s3-pool")
    child = load_table(child_dir)
    assert sorted(child["arm"]) == ["cls", "mean"] and set(child["status"]) == {"finished"} and set(child["phase"]) == {2}
    assert set(child["parent"]) == {promotion["checkpoint"]}
    assert set(child["parent_hash"]) == {winner["checkpoint_hash"]} == {promotion["lineage"]["content_hash"]}
    assert child["budget/pairs"].nunique() == 1 and child["budget/pairs"].iloc[0] >= 32
    child_record = json.loads(store.read_text(store.join(child_dir, "study.json")))
    assert child_record["parent_scores"]["dev/ndcg@10"] == pytest.approx(winner["dev/ndcg@10"])
    truncated = {column for column in child.columns if column.startswith(f"dev/dim{tiny.model.width // 2}/")}
    assert "dev/dim%d/ndcg@10" % (tiny.model.width // 2) in truncated <= set(child_record["parent_scores"])
    assert "parent (same evaluator)" in capsys.readouterr().out
    # The child's trials read the pair table its driver froze and published (recorded per arm).
    child_prepared = json.loads(store.read_text(store.join(child_dir, "prepared.json")))["mean"]
    (table_path,) = child_prepared["pair_tables"].values()
    published = json.loads(store.read_text(store.join(child_prepared["published"], "files.json")))
    assert table_path in published["files"]

    release = store.join(storage, "releases", "tiny")
    assert main(["export", promotion["checkpoint"], release]) == 0
    exported = json.loads(store.read_text(store.join(release, MANIFEST_FILE)))
    assert exported["exported_from"] == promotion["lineage"]["content_hash"]
    assert main(["report", run_dir, child_dir, "--out", str(tmp_path / "report.html")]) == 0
    assert "tiny-s3-pool" in (tmp_path / "report.html").read_text()

    assert not (tmp_path / "runs").exists()
    output = capsys.readouterr()
    _secrets_absent(out + output.out + output.err, "the console")
    for relative in store.list_tree(storage):
        _secrets_absent(store.read_bytes(store.join(storage, relative)).decode(errors="replace"), relative)
    for path in store.cache_dir().rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".txt", ".py", ".log"):
            _secrets_absent(path.read_text(errors="replace"), str(path))
    logs = Path("/tmp/ray/session_latest/logs")
    for path in logs.rglob("*") if logs.is_dir() else ():
        if path.is_file():
            _secrets_absent(path.read_text(errors="replace"), str(path))


@pytest.fixture
def published(s3_server, tmp_path, monkeypatch):
    """A small prepared-style directory in the driver's cache, published to a fresh bucket; a
    second node's cache (EMBEDLAB_CACHE) and the job's storage root (EMBEDLAB_STORAGE)."""
    import uuid

    from embedlab.artifacts import sync as prepared_sync

    driver = tmp_path / "driver-cache" / "prepared-0123456789abcdef"
    (driver / "tasks" / "t").mkdir(parents=True)
    (driver / "pieces.parquet").write_bytes(bytes(range(256)) * 40)
    (driver / "tasks" / "t" / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n')
    (driver / "prepared.json").write_text("{}")
    storage = store.join(s3_server.bucket(f"prep-{uuid.uuid4().hex[:8]}"), "runs")
    tree = prepared_sync.publish(driver, storage, progress=lambda line: None)
    monkeypatch.setenv("EMBEDLAB_CACHE", str(tmp_path / "node-cache"))
    monkeypatch.setenv(prepared_sync.STORAGE_ENV, storage)
    monkeypatch.setattr(prepared_sync, "_verified", set())
    return driver, storage, tree


def test_a_node_reads_the_drivers_paths_from_its_own_verified_copy(published):
    from embedlab.artifacts import sync as prepared_sync

    driver, storage, tree = published
    local = prepared_sync.node_path(driver / "tasks" / "t" / "corpus.jsonl")
    assert local == store.cache_dir() / driver.name / "tasks" / "t" / "corpus.jsonl"
    assert local.read_bytes() == (driver / "tasks" / "t" / "corpus.jsonl").read_bytes()
    copy = store.cache_dir() / driver.name
    assert prepared_sync.tree_manifest(copy)["tree_hash"] == tree
    record = {"directory": str(driver), "published": store.join(storage, "prepared", driver.name), "tree_hash": tree}
    assert prepared_sync.local_directory(record) == copy
    # Outside a prepared directory, or without a storage root, a path is used as it is.
    assert prepared_sync.node_path("/data/my-task/corpus.jsonl") == Path("/data/my-task/corpus.jsonl")


def test_a_node_copy_with_other_bytes_refuses_to_train(published, monkeypatch):
    from embedlab.artifacts import sync as prepared_sync

    driver, _, _ = published
    copy = store.cache_dir() / driver.name
    copy.mkdir(parents=True)
    (copy / "pieces.parquet").write_bytes(b"other bytes")  # a stale or foreign copy on this node
    with pytest.raises(prepared_sync.PreparedDataError, match="differ from the published prepared data"):
        prepared_sync.node_path(driver / "pieces.parquet")


def test_a_corrupted_published_object_is_refused(published):
    from embedlab.artifacts import sync as prepared_sync

    driver, storage, _ = published
    store.write_bytes(store.join(storage, "prepared", driver.name, "pieces.parquet"), b"corrupted")
    with pytest.raises(prepared_sync.PreparedDataError, match="pieces.parquet: content hash mismatch"):
        prepared_sync.node_path(driver / "pieces.parquet")
    assert not (store.cache_dir() / driver.name / "pieces.parquet").exists()


def test_publication_adds_files_but_never_changes_one(published):
    from embedlab.artifacts import sync as prepared_sync

    driver, storage, first = published
    (driver / "pairs").mkdir()
    (driver / "pairs" / "k.parquet").write_bytes(b"pairs")  # a later phase's pair table
    second = prepared_sync.publish(driver, storage, progress=lambda line: None)
    union = json.loads(store.read_text(store.join(storage, "prepared", driver.name, "files.json")))
    assert second != first and "pairs/k.parquet" in union["files"] and "pieces.parquet" in union["files"]
    for tree in (first, second):  # each run's snapshot stays readable by its hash
        assert store.is_file(store.join(storage, "prepared", driver.name, f"files-{tree}.json"))
    (driver / "pieces.parquet").write_bytes(b"rebuilt differently")
    with pytest.raises(prepared_sync.PreparedDataError, match="nodes would train on different bytes"):
        prepared_sync.publish(driver, storage, progress=lambda line: None)


def test_mined_negatives_published_first_are_what_every_node_reads(published, tmp_path):
    from embedlab.artifacts import sync as prepared_sync

    driver, _, _ = published
    first = driver / "mined" / "v1"
    first.mkdir(parents=True)
    (first / "negatives.parquet").write_bytes(b"first node's negatives")
    prepared_sync.publish_subtree(first)
    # Another node mined the same version with other bytes: the published set replaces its own.
    other = store.cache_dir() / driver.name / "mined" / "v1"
    prepared_sync.node_path(driver / "pieces.parquet")  # this node's copy of the prepared tree
    other.mkdir(parents=True)
    (other / "negatives.parquet").write_bytes(b"second node's negatives")
    assert prepared_sync.publish_subtree(other) == other
    assert (other / "negatives.parquet").read_bytes() == b"first node's negatives"
    # A third node that never mined reads the published set by the driver's path.
    prepared_sync._verified.clear()
    shutil.rmtree(store.cache_dir() / driver.name)
    assert prepared_sync.node_path(first / "negatives.parquet").read_bytes() == b"first node's negatives"
