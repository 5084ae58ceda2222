"""One evaluator version: `get_evaluator` replaces an idle evaluator of other code, refuses a busy
one naming the command that stops it, and the code hash follows the source bytes."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import pytest

import embedlab
from embedlab.core.beir import Task, write_task
from embedlab.core.code_identity import code_hash, current
from embedlab.core.errors import UsageError

STALE = {"version": "0.0.0-stale", "code_hash": "0" * 64}


@pytest.fixture
def no_evaluator(ray_session):
    """No evaluator before the test and none after it (the session's later tests create a current one)."""
    from embedlab.evaluate.actor import stop_evaluator

    stop_evaluator()
    yield
    stop_evaluator()


def _long_task(directory: Path, documents: int = 20_000) -> str:
    """A task whose evaluation with the tiny parent takes seconds on one CPU thread (~4 s measured)."""
    corpus = {f"d{i:05d}": ("", f"the quick brown fox {i} jumps over the lazy dog number {i * 7}")
              for i in range(documents)}
    queries = {f"q{i:03d}": f"fox {i} number {i * 7}" for i in range(20)}
    qrels = {q: {f"d{int(q[1:]):05d}": 1} for q in queries}
    write_task(Task(name="foxes", corpus=corpus, queries=queries, qrels={"dev": qrels, "test": qrels}), directory)
    return str(directory)


def test_a_stale_idle_evaluator_is_replaced_by_the_current_code(no_evaluator, caplog):
    """An idle evaluator created with another identity is killed and replaced; the new one reports
    this code's identity, its handle is the one cached, and one warning line names both versions."""
    import ray

    from embedlab.evaluate.actor import get_evaluator, start_evaluator

    stale = start_evaluator(identity=STALE)
    assert ray.get(stale.identity.remote(), timeout=120) == {**STALE, "in_flight": False}
    with caplog.at_level(logging.WARNING, logger="embedlab.evaluate.actor"):
        fresh = get_evaluator()
    assert ray.get(fresh.identity.remote(), timeout=120) == {**current().to_dict(), "in_flight": False}
    assert get_evaluator() is fresh
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(stale.identity.remote(), timeout=60)
    replaced = [r.getMessage() for r in caplog.records if "replaced" in r.getMessage()]
    assert replaced == [f"evaluator: replaced embedlab 0.0.0-stale (code 000000000000) with {current()}"]


def test_a_stale_busy_evaluator_is_refused_naming_the_stop_command(no_evaluator, parent, tmp_path, capsys):
    """While a stale evaluator is in a real evaluation, get_evaluator refuses with both versions and
    `embedlab evaluator stop --address ...`, and leaves it running; that command then stops it."""
    import ray

    from embedlab.cli import main
    from embedlab.evaluate.actor import find_evaluator, get_evaluator, start_evaluator

    stale = start_evaluator(identity=STALE)
    evaluation = stale.evaluate.remote(str(parent), _long_task(tmp_path / "foxes"), "dev")
    deadline = time.monotonic() + 120
    while not ray.get(stale.identity.remote(), timeout=120)["in_flight"]:
        assert time.monotonic() < deadline, "the evaluation never started"
        time.sleep(0.02)
    with pytest.raises(UsageError) as refused:
        get_evaluator()
    message = str(refused.value)
    assert "embedlab 0.0.0-stale (code 000000000000)" in message and str(current()) in message
    assert f"embedlab evaluator stop --address {ray.get_runtime_context().gcs_address}" in message
    assert ray.get(stale.identity.remote(), timeout=60)["in_flight"], "the evaluation ended: the refusal proves nothing"
    capsys.readouterr()
    assert main(["evaluator", "stop", "--address", ray.get_runtime_context().gcs_address]) == 0
    assert capsys.readouterr().out == ("stopped the evaluator (embedlab 0.0.0-stale (code 000000000000), "
                                       "an evaluation in flight failed)\n")
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(evaluation, timeout=60)
    assert find_evaluator() is None


def test_the_code_hash_follows_the_source_bytes(tmp_path):
    """A copy of the package hashes as the running code; one changed byte, or a renamed module,
    changes the hash; restoring the bytes restores it; a non-Python file does not count."""
    copy = shutil.copytree(Path(embedlab.__file__).parent, tmp_path / "embedlab",
                           ignore=shutil.ignore_patterns("__pycache__"))
    original = code_hash(copy)
    assert original == current().code_hash
    module = copy / "evaluate" / "actor.py"
    source = module.read_bytes()
    module.write_bytes(source + b"\n")
    assert code_hash(copy) != original
    module.write_bytes(source)
    (copy / "notes.txt").write_text("not code")
    assert code_hash(copy) == original
    module.rename(copy / "evaluate" / "actor_renamed.py")
    assert code_hash(copy) != original


def test_a_cached_handle_to_an_evaluator_killed_elsewhere_is_looked_up_again(no_evaluator):
    """An evaluator killed behind this process's back (another process's `evaluator stop`, here
    `ray.kill` on the handle, which leaves the cache alone) is not served from the cache: the
    next `get_evaluator` starts a new one that answers."""
    import ray

    from embedlab.evaluate.actor import find_evaluator, get_evaluator

    first = get_evaluator()
    assert ray.get(first.identity.remote(), timeout=120)["code_hash"] == current().code_hash
    ray.kill(first)
    deadline = time.monotonic() + 60
    while find_evaluator() is not None:
        assert time.monotonic() < deadline, "the killed evaluator's name was never freed"
        time.sleep(0.1)
    second = get_evaluator()
    assert second != first
    assert ray.get(second.identity.remote(), timeout=120) == {**current().to_dict(), "in_flight": False}


def test_a_process_of_other_code_than_its_sweep_refuses(tmp_path):
    """`check_same_code` passes this process's own identity and refuses another, naming both; a
    trial checks it before any work (its context holds nothing else here, so any other step
    would fail differently)."""
    from embedlab.core.code_identity import CodeChangedError, check_same_code
    from embedlab.sweep.driver import TrialClock, run_trial

    check_same_code(current().to_dict())
    with pytest.raises(CodeChangedError) as refused:
        check_same_code(STALE)
    assert str(current()) in str(refused.value) and "embedlab 0.0.0-stale (code 000000000000)" in str(refused.value)
    identity = {"arm": "a", "seed": 0, "stage": "final", "trial_id": "t"}
    with pytest.raises(CodeChangedError):
        run_trial(None, identity, {}, {"code": STALE}, TrialClock())


def test_resuming_a_run_of_other_code_is_refused_before_any_work(tmp_path):
    """A run directory whose study record names other code than this process's is not resumed:
    its finished trials and the new ones would share one table."""
    from conftest import tiny_trial, write_study

    from embedlab.stats.table import STUDY_FILE
    from embedlab.studies.study import load_study
    from embedlab.sweep.run import run_sweep

    study_file = write_study(tmp_path / "study.py", tiny_trial(num_workers=1))
    study = load_study(study_file)
    run_dir = tmp_path / "runs" / "tiny-old"
    run_dir.mkdir(parents=True)
    (run_dir / STUDY_FILE).write_text(json.dumps(
        {"study": study.to_dict(), "study_hash": study.hash, "parent": None, "code": STALE}))
    with pytest.raises(UsageError, match="one table never mixes trials of two codes") as refused:
        run_sweep(study_file, resume=run_dir, progress=lambda line: None)
    assert "embedlab 0.0.0-stale (code 000000000000)" in str(refused.value) and str(current()) in str(refused.value)
