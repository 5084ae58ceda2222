"""Object storage as the home of everything a sweep writes and reads, against a real
S3-compatible server started on loopback (moto's standalone server: `conftest.s3_server`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from embedlab import store
from embedlab.errors import UsageError
from embedlab.train.checkpoint import (
    CACHE_DIR, ENCODER_FILE, MANIFEST_FILE, CheckpointError, load_encoder, local_checkpoint, verify_checkpoint,
)

from conftest import S3_KEY_ID, S3_SECRET


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


def _run_dirs(storage: str, study: str) -> list[str]:
    import re

    names = {p.split("/")[0] for p in store.list_tree(storage)}
    return sorted(store.join(storage, n) for n in names if re.fullmatch(rf"{study}-\d{{8}}-\d{{6}}(-\d+)?", n))


def _secrets_absent(text: str, where: str) -> None:
    assert S3_SECRET not in text and S3_KEY_ID not in text, f"a credential in {where}"


@pytest.mark.timeout(900)
def test_a_study_on_s3_from_sweep_to_release(ray_session, prepared, s3_server, tmp_path, capsys, monkeypatch):
    """`--storage s3://...`: an Optuna-tuned phase-1 study's trials, evaluation, promotion, the
    phase-2 child started from the promoted checkpoint's URI, `table`, `report` and `export`
    all work with nothing written to a local run directory; no credential reaches the
    console, a record, a manifest or a log."""
    import dataclasses

    from embedlab import load_table
    from embedlab.cli import main
    from embedlab.config import ContrastiveConfig

    from conftest import tiny_trial, write_study

    monkeypatch.chdir(tmp_path)  # the default storage (runs/) would land here
    storage = store.join(s3_server.bucket("sweeps"), "runs")
    study_file = write_study(tmp_path / "tiny_s3.py", tiny_trial(num_workers=1), name="tiny-s3", extra=(
        "budget=replace(DEFAULT_BUDGET, tokens=4_000), search=(Search('train.learning_rate', low=1e-4, high=1e-2, log=True),), search_trials=1"))
    assert main(["sweep", study_file, "--storage", storage]) == 0
    (run_dir,) = _run_dirs(storage, "tiny-s3")
    table = load_table(run_dir)
    assert sorted(table["stage"]) == ["final", "final", "tune", "tune"] and set(table["status"]) == {"finished"}
    assert all(c.startswith(f"{run_dir}/train/") for c in table["checkpoint"])
    assert store.is_file(store.join(run_dir, "optuna.db"))  # Optuna's storage, copied to the run
    # The prepared data, published by hash beside the runs for nodes without the driver's disk.
    record = json.loads(store.read_text(store.join(run_dir, "prepared.json")))["mask-15"]
    published = json.loads(store.read_text(store.join(record["published"], "files.json")))
    assert published["tree_hash"] == record["tree_hash"] and "pieces.parquet" in published["files"]
    assert main(["table", run_dir]) == 0

    base = dataclasses.replace(
        tiny_trial(num_workers=1), phase=2,
        contrastive=ContrastiveConfig(pairs=(("title-body", 0.5), ("same-source-spans", 0.5)), pair_length=48))
    next_file = write_study(tmp_path / "tiny_pool.py", base, name="tiny-s3-pool", arms=("mean", "cls"),
                            change="contrastive.pooling='cls'", extra="budget=Budget(tokens=4_000, pairs=32)")
    assert main(["promote", run_dir, "--next", next_file, "--run"]) == 0
    promotion = json.loads(store.read_text(store.join(run_dir, "promotion.json")))
    assert promotion["checkpoint"].startswith("s3://") and promotion["final_eval"]["split"] == "test"
    assert store.is_file(store.join(run_dir, "next_study.py"))
    (child_dir,) = _run_dirs(storage, "tiny-s3-pool")
    child = load_table(child_dir)
    assert sorted(child["arm"]) == ["cls", "mean"] and set(child["status"]) == {"finished"}
    assert set(child["parent"]) == {promotion["checkpoint"]}
    assert set(child["parent_hash"]) == {promotion["lineage"]["content_hash"]}
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
    _secrets_absent(output.out + output.err, "the console")
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

    from embedlab.data import prepared_sync

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
    from embedlab.data import prepared_sync

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
    from embedlab.data import prepared_sync

    driver, _, _ = published
    copy = store.cache_dir() / driver.name
    copy.mkdir(parents=True)
    (copy / "pieces.parquet").write_bytes(b"other bytes")  # a stale or foreign copy on this node
    with pytest.raises(prepared_sync.PreparedDataError, match="differ from the published prepared data"):
        prepared_sync.node_path(driver / "pieces.parquet")


def test_a_corrupted_published_object_is_refused(published):
    from embedlab.data import prepared_sync

    driver, storage, _ = published
    store.write_bytes(store.join(storage, "prepared", driver.name, "pieces.parquet"), b"corrupted")
    with pytest.raises(prepared_sync.PreparedDataError, match="pieces.parquet: content hash mismatch"):
        prepared_sync.node_path(driver / "pieces.parquet")
    assert not (store.cache_dir() / driver.name / "pieces.parquet").exists()


def test_publication_adds_files_but_never_changes_one(published):
    from embedlab.data import prepared_sync

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
    from embedlab.data import prepared_sync

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
