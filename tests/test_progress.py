"""Console progress of the long steps: encoding during evaluation (in process and through the
evaluation actor), tokenizer training and a trial's budget. Each line is checked against
the counts of a real (tiny) run, not only for being there."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import synthetic
from embedlab.checkpoints.io import load_encoder
from embedlab.core.beir import Task, write_task
from embedlab.evaluate.checkpoint_eval import evaluate_checkpoint
from embedlab.model.encode import encode_texts
from embedlab.sweep.progress import BudgetLines, evaluate_with_progress
from embedlab.tokenizer.frozen import train_tokenizer

ENCODED = re.compile(r"^(.+): ([\d,]+)/([\d,]+) texts encoded \((\d+)%\), ([\d,]+) texts/s$")
READ = re.compile(r"^tokenizer: ([\d,]+)/([\d,]+) \((\d+)%\) documents read, ([\d,]+) documents/s$")


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _task(documents: int = 120, queries: int = 30) -> Task:
    """A retrieval task over the synthetic texts: query i judges document i relevant."""
    corpus = {f"d{i:04d}": ("", text) for i, text in enumerate(synthetic.TEXTS[:documents])}
    asked = {f"q{i:04d}": f"fox {i} number {i * 7}" for i in range(queries)}
    qrels = {f"q{i:04d}": {f"d{i:04d}": 1} for i in range(queries)}
    half = sorted(qrels)[: queries // 2]
    return Task(name="foxes", corpus=corpus, queries=asked,
                qrels={"dev": {q: qrels[q] for q in half}, "test": {q: v for q, v in qrels.items() if q not in half}})


@pytest.fixture(scope="module")
def checkpoint(parent):
    return parent


def test_encoding_reports_each_batch_when_unthrottled(checkpoint):
    """With no throttle, one line per batch whose counts are the batch boundaries (the last one
    the total, 100%), and the embeddings are those of a silent pass."""
    encoder, tokenizer, _ = load_encoder(checkpoint)
    texts = synthetic.TEXTS[:50]
    lines: list[str] = []
    with_progress = encode_texts(encoder, tokenizer, texts, batch_size=8, progress=lines.append, label="docs",
                                 progress_seconds=0)
    np.testing.assert_array_equal(with_progress, encode_texts(encoder, tokenizer, texts, batch_size=8))
    parsed = [ENCODED.match(line) for line in lines]
    assert all(parsed), lines
    assert [_number(m.group(2)) for m in parsed] == [8, 16, 24, 32, 40, 48, 50]
    assert {(m.group(1), _number(m.group(3))) for m in parsed} == {("docs", 50)}
    assert [int(m.group(4)) for m in parsed] == [round(100 * n / 50) for n in (8, 16, 24, 32, 40, 48, 50)]
    assert all(_number(m.group(5)) > 0 for m in parsed)


def test_throttled_encoding_says_only_the_end():
    """With the default throttle, a pass shorter than the interval prints one line: the total."""
    from embedlab.model.encode import EncodingProgress

    lines: list[str] = []
    tracker = EncodingProgress(lines.append, "docs", 30, every_seconds=math.inf)
    for done in (10, 20, 30):
        tracker.update(done)
    assert [ENCODED.match(line).group(2) for line in lines] == ["30"]


def test_evaluation_reports_documents_then_queries(checkpoint):
    """An evaluation says how many documents, then how many dev queries, it encoded: the
    task's own counts, each pass ending at 100%."""
    task = _task()
    lines: list[str] = []
    scores = evaluate_checkpoint(checkpoint, task, "dev", progress=lines.append)
    ends = [(m.group(1), _number(m.group(2)), _number(m.group(3))) for m in map(ENCODED.match, lines)
            if m and m.group(2) == m.group(3)]
    assert ends == [("evaluate foxes/dev documents", 120, 120), ("evaluate foxes/dev queries", 15, 15)]
    assert scores["docs"] == 120 and scores["queries"] == 15


def test_the_actor_forwards_its_encoding_lines_to_the_trial(checkpoint, tmp_path, ray_session):
    """Through the real evaluation actor: the trial's `report` gets this request's lines in
    order, the last being the final pass complete; scores equal an in-process evaluation."""
    from embedlab.evaluate.actor import get_evaluator

    task = _task(documents=200, queries=40)
    write_task(task, tmp_path / "foxes")
    reported: list[str] = []
    scores = evaluate_with_progress(get_evaluator(), (str(checkpoint), str(tmp_path / "foxes"), "dev"),
                                    request="trial-1", report=reported.append, poll_seconds=0.01)
    parsed = [ENCODED.match(line) for line in reported]
    assert parsed and all(parsed), reported
    assert (parsed[-1].group(1), _number(parsed[-1].group(2))) == ("evaluate foxes/dev queries", 20)
    documents = [_number(m.group(2)) for m in parsed if m.group(1).endswith("documents")]
    assert documents == sorted(documents) and all(n <= 200 for n in documents)
    local = evaluate_checkpoint(checkpoint, task, "dev")
    assert scores["ndcg@10"] == pytest.approx(local["ndcg@10"], abs=1e-6)


def test_tokenizer_training_reports_documents_read_and_is_unchanged(tmp_path):
    """Unthrottled, the tokenizer says it read 1, 2, ... N of N documents, then that it
    computes the vocabulary and its size; the trained tokenizer is the silent one, byte for byte."""
    texts = synthetic.TEXTS[:60]
    lines: list[str] = []
    trained = train_tokenizer(texts, 300, progress=lines.append, progress_seconds=0)
    assert trained.to_str() == train_tokenizer(texts, 300).to_str()
    reads = [READ.match(line) for line in lines[:-2]]
    assert all(reads), lines
    assert [_number(m.group(1)) for m in reads] == list(range(1, 61))
    assert {_number(m.group(2)) for m in reads} == {60}
    assert re.match(r"^tokenizer: 60 documents read in [\d.]+s; computing the bpe vocabulary$", lines[-2])
    assert lines[-1].startswith(f"tokenizer: bpe vocabulary of {trained.get_vocab_size():,} trained in ")


def test_budget_lines_follow_a_real_runs_reports(frozen, tmp_path):
    """Fed the reports of a real (in-process) phase-1 run: unthrottled, one line per report
    before the end quoting its budget fraction, loss and tokens/s; throttled, only the first
    report and the first past each quarter of the budget."""
    reports, _ = synthetic.train(synthetic.phase1_trial(), frozen, tmp_path / "run")
    fractions = [r["budget/fraction"] for r in reports]
    assert fractions[-1] >= 1 and len(reports) >= 5

    every = BudgetLines(every_seconds=0)
    lines = [every.line("t", r, now=float(i)) for i, r in enumerate(reports)]
    for line, report in zip(lines, reports):
        if report["budget/fraction"] >= 1:
            assert line is None
            continue
        assert line == (f"{report['budget/fraction']:.0%} of budget, loss {report['train/loss']:.3f}, "
                        f"{report['train/tokens_per_s']:,.0f} tokens/s")

    quarters = BudgetLines(every_seconds=math.inf)
    printed = [i for i, r in enumerate(reports) if quarters.line("t", r, now=0.0) is not None]
    expected = [0] + [next(i for i, f in enumerate(fractions) if f >= q / 4) for q in (1, 2, 3)]
    assert printed == sorted(set(i for i in expected if fractions[i] < 1))
    assert BudgetLines().line("t", {"train/loss": 1.0}) is None  # no budget figure: no line


@pytest.mark.parametrize("verbose", [False, True])
def test_tunes_own_output_goes_to_the_run_log_and_to_the_console_only_when_verbose(tmp_path, ray_session, capsys,
                                                                                   verbose):
    """A real Tune experiment inside the sweep's `tune_output_to_log`: Tune's configuration box,
    its TensorBoard hint and a warning on its logger (where its Ctrl-C `Tuner.restore(...)`
    advice goes) reach `<run_dir>/ray.log`, and the console only with --verbose; embedlab's own
    line reaches the console either way."""
    import logging

    from ray import tune

    from embedlab.sweep.experiment import RAY_LOG, tune_output_to_log

    def trainable(config):
        tune.report({"score": 1.0})

    with tune_output_to_log(str(tmp_path), print, verbose=verbose) as shown:
        tune.Tuner(trainable, run_config=tune.RunConfig(name="t", storage_path=str(tmp_path / "tune"),
                                                        verbose=0)).fit()
        logging.getLogger("ray.tune.tune").warning("Resume experiment with: Tuner.restore(path=...)")
        shown("tune: 1 trials, at most 1 at a time")
    out, err = capsys.readouterr()
    log = (tmp_path / RAY_LOG).read_text()
    for line in ("Configuration for experiment", "To visualize your results with TensorBoard",
                 "Resume experiment with: Tuner.restore(path=...)"):
        assert line in log and (line in out + err) == verbose, line
    assert "tune: 1 trials, at most 1 at a time\n" in out and "tune: 1 trials" not in log
