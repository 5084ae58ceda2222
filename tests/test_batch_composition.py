"""One-source batches (`contrastive.batch_composition`): every step holds one builder's pairs on
every worker, steps follow the deficit rule over whole steps, the mixed stream is unchanged,
and the study comparing the two validates."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from embedlab.core.config import ContrastiveConfig, DEFAULT_BUDGET, TrainConfig, TrialConfig
from embedlab.sources.mixture import MixtureError, sample_schedule
from embedlab.streams.packed import schedule_windows, worker_rows
from embedlab.streams.pair_stream import ONE_SOURCE_SCHEDULE, group_hash, pair_schedule, tokenize_pair_window
from embedlab import recipes
from embedlab.studies.study import load_study
from embedlab.train.session import LocalSession

import synthetic

SHARES = {"a": 0.5, "b": 0.3, "c": 0.2}
SIZES = {"a": 50, "b": 40, "c": 30}  # pairs per builder in the table
STUDY = Path(__file__).parent.parent / "ablations" / "batch_composition.py"


@pytest.fixture(scope="module")
def pairs_path(tmp_path_factory) -> Path:
    """A pairs table as `pair_table_path` freezes one: sorted by builder, then pair id."""
    rows = [{"builder": name, "pair_id": f"{name}-{i:03d}", "query": synthetic.TEXTS[i],
             "positive": synthetic.TEXTS[i + 1], "positive_group": f"{name}-{i}"}
            for name, size in SIZES.items() for i in range(size)]
    path = tmp_path_factory.mktemp("pairs") / "pairs.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def reference_steps(shares: dict[str, float], step_pairs: int, target_pairs: int) -> list[str]:
    """The deficit rule written out: before each step, the builder furthest below its share of
    the pairs scheduled so far takes the whole step (ties: the first listed)."""
    pairs = {name: 0 for name in shares}
    steps: list[str] = []
    while sum(pairs.values()) < target_pairs:
        total = sum(pairs.values())
        name = max(shares, key=lambda n: shares[n] * total - pairs[n])
        pairs[name] += step_pairs
        steps.append(name)
    return steps


def one_source(pairs_path: Path, step_pairs: int, target_pairs: int, seed: int = 3):
    return pair_schedule(pairs_path, SHARES, target_pairs=target_pairs, max_epochs=4, seed=seed,
                         composition="one-source", step_pairs=step_pairs)


@pytest.mark.parametrize("world", [1, 2])
def test_every_step_holds_one_builder_on_every_worker(pairs_path, tmp_path, world):
    """Each optimizer step (all workers' rows of all its microbatches, as the loop deals them)
    is one builder's, and its rows are that builder's rows of the table."""
    batch_rows, microbatches = 3, 2
    step_pairs = world * batch_rows * microbatches
    schedule, offsets = one_source(pairs_path, step_pairs, target_pairs=120)
    file_rows = np.array([offsets[n] for n in schedule.sources])[schedule.source] + schedule.item
    builders = pq.read_table(pairs_path, columns=["builder"])["builder"].to_numpy(zero_copy_only=False)
    assert (builders[file_rows] == np.array(schedule.sources)[schedule.source]).all()

    session = LocalSession({"builder_index": schedule.source}, tmp_path, world=world)
    batches = session.global_batches(world * batch_rows)
    step_builders = []
    while group := list(itertools.islice(batches, microbatches)):
        seen = {int(b) for batch in group for rank in range(world)
                for b in worker_rows(batch, rank, world)["builder_index"]}
        assert len(seen) == 1
        step_builders.append(seen.pop())
    assert len(step_builders) == len(schedule.source) // step_pairs and set(step_builders) == {0, 1, 2}


def test_steps_follow_the_deficit_rule_and_the_shares(pairs_path):
    """The step builders are the reference rule's, so each builder's consumed pairs are its
    share of the total to within one step; within a builder, pairs come in the mixed order."""
    step_pairs, target = 7, 350
    schedule, _ = one_source(pairs_path, step_pairs, target)
    expected = reference_steps(SHARES, step_pairs, target)
    names = np.array(schedule.sources)
    assert list(names[schedule.source[::step_pairs]]) == expected
    assert (schedule.source.reshape(-1, step_pairs) == schedule.source[::step_pairs, None]).all()
    total = len(expected) * step_pairs
    counts = {name: expected.count(name) * step_pairs for name in SHARES}
    assert {n: int((names[schedule.source] == n).sum()) for n in SHARES} == counts
    assert all(abs(counts[n] - SHARES[n] * total) <= step_pairs for n in SHARES)
    assert schedule.version == ONE_SOURCE_SCHEDULE and (schedule.units == 1).all()
    mixed, _ = pair_schedule(pairs_path, SHARES, target_pairs=target, max_epochs=4, seed=3)
    for index, name in enumerate(SHARES):
        ours, theirs = schedule.item[schedule.source == index], mixed.item[mixed.source == index]
        common = min(len(ours), len(theirs))
        assert (ours[:common] == theirs[:common]).all()
        assert np.bincount(ours, minlength=SIZES[name]).max() <= 4  # the repetition cap


def test_one_pair_steps_are_the_mixed_schedule_and_mixed_is_unchanged(pairs_path):
    """Mixed (the default) is `sample_schedule` pair by pair, as before; one-source with steps
    of one pair is the same schedule, since the step rule is the pair rule over whole steps."""
    mixed, offsets = pair_schedule(pairs_path, SHARES, target_pairs=200, max_epochs=4, seed=5)
    units = {n: np.ones(s, dtype=np.int64) for n, s in SIZES.items()}
    before = sample_schedule(units, SHARES, target_units=200, max_epochs=4, seed=5)
    assert offsets == {"a": 0, "b": 50, "c": 90}
    for schedule in (before, one_source(pairs_path, 1, 200, seed=5)[0]):
        assert (mixed.source == schedule.source).all() and (mixed.item == schedule.item).all()
    assert mixed.version == before.version


def test_a_step_past_the_repetition_cap_is_refused_naming_the_builder(pairs_path):
    """Three steps of 40 pairs go to a, b, c; c holds 30 pairs, so at 1.3 epochs (39) its step
    is refused, though its 20% share (24 pairs) fits the mixed stream."""
    pair_schedule(pairs_path, SHARES, target_pairs=120, max_epochs=1.3, seed=0)
    with pytest.raises(MixtureError, match="'c' holds 30 pairs; one-source steps of 40 pairs give it 40"):
        pair_schedule(pairs_path, SHARES, target_pairs=120, max_epochs=1.3, seed=0, composition="one-source",
                      step_pairs=40)


def test_recorded_consumption_and_a_cut_last_step(frozen, parent, pairs_path, tmp_path):
    """A trial trained on a one-source stream records per builder exactly the pairs of its full
    steps' builders, and the step the budget cuts short lands on that step's builder alone."""
    from embedlab.sources.mixture import schedule_target
    from embedlab.train.budget import schedule_units, step_units
    from embedlab.train.contrastive import ContrastiveLoop
    from embedlab.train.loop import run

    trial = TrialConfig(
        model=synthetic.MODEL, data=synthetic.DATA, phase=2, parent=str(parent),
        contrastive=ContrastiveConfig(pairs=tuple(SHARES.items()), pair_length=16, batch_composition="one-source"),
        train=TrainConfig(budget=dataclasses.replace(DEFAULT_BUDGET, pairs=59), num_workers=1, batch_rows=4,
                          microbatches=2, report_every_steps=1, learning_rate=1e-3),
    )
    step_pairs = step_units(trial)
    schedule, _ = one_source(pairs_path, step_pairs, schedule_target(schedule_units(trial), step_pairs))
    rows = synthetic.pair_rows(frozen, len(schedule.source))
    rows["builder_index"] = schedule.source.astype(np.int64)
    config = dataclasses.replace(synthetic.loop_config(trial, frozen), sources=tuple(SHARES), intended_shares=SHARES)
    loop = ContrastiveLoop(config, rank=0, world=1, device=torch.device("cpu"))
    session = LocalSession(rows, tmp_path)
    run(loop, session)

    full = 59 // step_pairs
    steps = reference_steps(SHARES, step_pairs, len(schedule.source))
    consumed = {n: steps[:full].count(n) * step_pairs for n in SHARES}
    cut = loop.progress.pairs - full * step_pairs
    assert 0 < cut < step_pairs and loop.progress.steps == full + 1
    consumed[steps[full]] += cut
    assert dict(zip(SHARES, loop.progress.consumed_pairs)) == consumed
    assert {n: session.reports[-1][f"data/observed_pair_share/{n}"] for n in SHARES} == pytest.approx(
        {n: c / loop.progress.pairs for n, c in consumed.items()})


def test_mined_negatives_stay_with_their_pairs(frozen, pairs_path, tmp_path):
    """Tokenised one-source windows carry each pair's own mined negatives (by pair id) and the
    builder of the step the pair was scheduled in."""
    pair_ids = pq.read_table(pairs_path, columns=["pair_id"])["pair_id"].to_pylist()
    negatives = pa.Table.from_pylist([{"pair_id": p, "doc_id": f"neg-{p}-{k}", "rank": k, "negative": f"other {p}"}
                                      for p in pair_ids for k in range(2)])
    negatives_path = tmp_path / "negatives.parquet"
    pq.write_table(negatives, negatives_path)
    schedule, offsets = one_source(pairs_path, step_pairs=6, target_pairs=60)
    window = schedule_windows(schedule, offsets)[0]
    out = tokenize_pair_window(
        {"rows": [window["rows"]], "source_index": [window["source_index"]]}, pairs_path=str(pairs_path),
        tokenizer_path=str(frozen.path), length=16, query_prefix="query: ", passage_prefix="passage: ",
        negatives_path=str(negatives_path), negatives_per_pair=2,
    )
    expected = [[group_hash(f"neg-{pair_ids[r]}-{k}") for k in range(2)] for r in window["rows"]]
    assert out["negative_group"].tolist() == expected
    assert (out["builder_index"] == schedule.source[: len(window["rows"])]).all()
    assert (out["negative_len"] > 0).all()


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


@pytest.mark.parametrize("profile", ["demo", "cpu", "full"])
def test_the_study_validates_and_its_arms_differ_only_in_composition(profile):
    """ablations/batch_composition.py at every profile: phase 2, mixed control vs one-source,
    the two arms' trials equal but for the factor, at one budget of measured FLOPs."""
    study = load_study(STUDY, profile)
    assert study.phase == 2 and study.needs_parent and study.metric == "dev/ndcg@10"
    assert study.factor == "contrastive.batch_composition" and list(study.arms) == ["mixed", "one-source"]
    assert study.unit == "flops" and study.budget.flops > 0 and study.seeds == recipes.profile(profile).seeds
    mixed, one = (_flat(study.trial_config(arm, study.seeds[0], "/checkpoints/parent").to_dict())
                  for arm in study.arms)
    assert {k for k in mixed if mixed[k] != one[k]} == {"contrastive.batch_composition"}
    assert (mixed["contrastive.batch_composition"], one["contrastive.batch_composition"]) == ("mixed", "one-source")
    assert mixed["train.budget.flops"] == study.budget.flops
