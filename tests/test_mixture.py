"""Mixture sampling: token shares, repetition cap, determinism, the pilot mapping."""

import numpy as np
import pytest

from embedlab.sources.mixture import MixtureError, PHASE1_FAMILIES, pilot_mixture, sample_schedule


def lengths(seed: int, n: int, low: int, high: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(low, high, size=n)


SOURCES = {
    "general": lengths(1, 4000, 20, 128),
    "reference": lengths(2, 800, 100, 128),
    "technical": lengths(3, 3000, 5, 60),
    "qa": lengths(4, 500, 60, 128),
}
SHARES = {"general": 0.5, "reference": 0.2, "technical": 0.2, "qa": 0.1}


def test_observed_token_shares_within_one_point_over_a_million_tokens():
    """Over >= 1M sampled tokens every source's observed token share is within 1 point of intended, at every 100k prefix too."""
    schedule = sample_schedule(SOURCES, SHARES, target_units=1_000_000, max_epochs=10, seed=0)
    assert schedule.units.sum() >= 1_000_000
    cumulative = np.cumsum(schedule.units)
    for tokens in range(100_000, 1_000_001, 100_000):
        prefix = int(np.searchsorted(cumulative, tokens)) + 1
        observed = schedule.observed_shares(prefix)
        for name, share in SHARES.items():
            assert abs(observed[name] - share) < 0.01, (tokens, name, observed[name])


def test_repetition_cap_is_never_exceeded():
    """No item is drawn more than ceil(max_epochs) times, no source beyond max_epochs epochs."""
    schedule = sample_schedule(SOURCES, SHARES, target_units=1_000_000, max_epochs=3.5, seed=0)
    counts = {name: len(units) for name, units in SOURCES.items()}
    for name, epochs in schedule.epochs(counts).items():
        assert epochs <= 3.5
    for i, name in enumerate(schedule.sources):
        draws = np.bincount(schedule.item[schedule.source == i], minlength=counts[name])
        assert draws.max() <= 4


def test_infeasible_mixture_is_refused_naming_the_source():
    """A share that would need more than max_epochs passes over a source is refused before sampling."""
    with pytest.raises(MixtureError, match="'general'.*repetition cap"):
        sample_schedule(SOURCES, SHARES, target_units=1_000_000, max_epochs=1, seed=0)


def test_same_seed_same_stream_other_seed_other_order():
    """The same seed reproduces the schedule exactly; another seed reorders items but keeps shares."""
    a = sample_schedule(SOURCES, SHARES, target_units=200_000, max_epochs=5, seed=7)
    b = sample_schedule(SOURCES, SHARES, target_units=200_000, max_epochs=5, seed=7)
    c = sample_schedule(SOURCES, SHARES, target_units=200_000, max_epochs=5, seed=8)
    assert np.array_equal(a.item, b.item) and np.array_equal(a.source, b.source)
    assert not np.array_equal(a.item[:1000], c.item[:1000])
    for name in SHARES:
        assert abs(a.observed_shares()[name] - c.observed_shares()[name]) < 0.01


def test_every_item_is_read_once_before_any_repeats():
    """Within a source, an epoch is a permutation: all items appear once before the second pass."""
    schedule = sample_schedule({"a": np.ones(50, dtype=int)}, {"a": 1.0}, target_units=120, max_epochs=3, seed=0)
    assert sorted(schedule.item[:50]) == list(range(50))
    assert sorted(schedule.item[50:100]) == list(range(50))


def test_pilot_mixture_maps_families_and_discloses_the_missing_one():
    """The pilot mixture covers the available built-in sources, sums to 1 and discloses that no built-in source is question-answer prose."""
    available = [s for family in PHASE1_FAMILIES.values() for s in family]
    mixture = pilot_mixture(available)
    assert abs(sum(mixture.shares.values()) - 1) < 1e-9
    general = sum(mixture.shares[s] for s in PHASE1_FAMILIES["general"])
    assert abs(general - 0.5 / 0.9) < 1e-9
    assert any("question-answer" in note for note in mixture.notes)
    only_python = pilot_mixture(["python-docs", "python-docstrings"])
    assert only_python.shares == {"python-docs": 0.5, "python-docstrings": 0.5}
