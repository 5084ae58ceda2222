"""Mixture sampling: which source the next piece of training text comes from.

Shares are fractions of *consumed units*: non-padding tokens for phase 1, positive pairs
for phases 2-3. Schedule `deficit/1` is deterministic: before every draw it picks the
source whose consumption lags its intended share the most,

    next source = argmax_s ( share_s * consumed_total - consumed_s )   (ties: listed order)

so after any prefix every source is within one item of its intended share; items are
pieces of at most `sequence_length` tokens, so over 10^6 tokens the error is well under
0.1 points. Inside a source, items are read in an order shuffled per epoch from
(`seed`, source name, epoch). `max_epochs` caps repetition: a source may be read at most
floor(max_epochs * items) times in total; a mixture that would need more is refused
before training, naming the source.

The recipe's phase-1 pilot mixture (50% general / 20% reference / 20% technical / 10%
question-answer prose) maps onto the built-in sources through `PHASE1_FAMILIES`; a
family's share is split equally among its available sources. The built-in corpus has no
question-answer prose, so that 10% is redistributed over the other families in
proportion to their shares, and the redistribution is recorded with the mixture.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from embedlab.core.errors import UserError

SCHEDULE_VERSION = "deficit/1"

PHASE1_FAMILIES: dict[str, tuple[str, ...]] = {
    "general": ("bible-kjv", "fortunes"),
    "reference": (
        "python-docs", "debian-handbook", "postgresql-doc-15", "dict-foldoc", "dict-jargon", "mythes-en-us",
    ),
    "technical": ("python-docstrings", "manpages-dev"),
    "question-answer": (),
}
PHASE1_PILOT: dict[str, float] = {"general": 0.5, "reference": 0.2, "technical": 0.2, "question-answer": 0.1}


class MixtureError(UserError, ValueError):
    """A mixture cannot be honoured (unknown source, empty source, repetition cap)."""


@dataclass(frozen=True)
class ResolvedMixture:
    """Per-source shares plus how they were derived (family mapping, redistribution)."""

    shares: dict[str, float]
    origin: str
    notes: tuple[str, ...] = ()


def pilot_mixture(available: Sequence[str], families: dict[str, float] | None = None) -> ResolvedMixture:
    """Family shares (the recipe's phase-1 pilot by default) mapped onto the available
    built-in sources, split evenly within a family."""
    families = PHASE1_PILOT if families is None else families
    if set(families) != set(PHASE1_FAMILIES) or abs(sum(families.values()) - 1.0) > 1e-9:
        raise MixtureError(f"family shares must cover {sorted(PHASE1_FAMILIES)} and sum to 1, got {families}")
    present = {family: [s for s in sources if s in available] for family, sources in PHASE1_FAMILIES.items()}
    usable = {family: share for family, share in families.items() if present[family] and share > 0}
    if not usable:
        raise MixtureError(f"no source of any pilot family is available (have {list(available)})")
    notes = [
        f"family {family!r} ({share:.0%}) has no available source; its share is redistributed "
        "over the other families in proportion to their shares"
        for family, share in families.items() if family not in usable and share > 0
    ]
    scale = 1.0 / sum(usable.values())
    shares: dict[str, float] = {}
    for family, share in usable.items():
        for source in present[family]:
            shares[source] = share * scale / len(present[family])
    origin = "recipe phase-1 pilot families" if families == PHASE1_PILOT else f"family shares {families}"
    return ResolvedMixture(shares=shares, origin=origin, notes=tuple(notes))


def resolve_mixture(configured: dict[str, float], available: Sequence[str]) -> ResolvedMixture:
    """The configured shares, or the pilot mixture when none are configured."""
    if not configured:
        return pilot_mixture(available)
    missing = sorted(set(configured) - set(available))
    if missing:
        raise MixtureError(f"data.mixture.shares names sources that were not built: {missing}; built: {list(available)}")
    return ResolvedMixture(shares=dict(configured), origin="configured")


@dataclass(frozen=True)
class Schedule:
    """The drawn sequence: `source[i]`, `item[i]` (index within that source's items)."""

    sources: tuple[str, ...]
    source: np.ndarray  # (N,) int16 index into `sources`
    item: np.ndarray  # (N,) int64
    units: np.ndarray  # (N,) int64 units of each drawn item
    version: str
    seed: int

    def observed_shares(self, prefix: int | None = None) -> dict[str, float]:
        """Unit shares per source over the first `prefix` draws (all by default)."""
        source, units = self.source[:prefix], self.units[:prefix]
        total = max(int(units.sum()), 1)
        return {name: int(units[source == i].sum()) / total for i, name in enumerate(self.sources)}

    def epochs(self, item_counts: dict[str, int]) -> dict[str, float]:
        """How many times over each source was read."""
        return {
            name: int((self.source == i).sum()) / item_counts[name] for i, name in enumerate(self.sources)
        }


def _source_order(seed: int, source: str, epoch: int, n: int) -> np.ndarray:
    return np.random.default_rng([seed, zlib.crc32(source.encode()), epoch]).permutation(n)


def sample_schedule(
    units_by_source: dict[str, np.ndarray],
    shares: dict[str, float],
    *,
    target_units: int,
    max_epochs: float,
    seed: int,
) -> Schedule:
    """Draw items until `target_units` units are scheduled, honouring shares and the cap.

    `units_by_source[s][i]` is the size of item i of source s in the share's unit (tokens
    of a piece for phase 1, 1 per pair for phases 2-3).
    """
    names = [s for s in shares]
    for name in names:
        if name not in units_by_source or len(units_by_source[name]) == 0:
            raise MixtureError(f"mixture source {name!r} has no training items")
    share = np.array([shares[n] for n in names])
    caps = [int(np.floor(max_epochs * len(units_by_source[n]))) for n in names]
    _check_feasible(names, share, units_by_source, max_epochs, target_units)
    consumed = np.zeros(len(names))
    used = [0] * len(names)
    orders: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(names)
    out_source: list[int] = []
    out_item: list[int] = []
    out_units: list[int] = []
    total = 0
    while total < target_units:
        s = int(np.argmax(share * total - consumed))
        if used[s] >= caps[s]:
            raise MixtureError(
                f"source {names[s]!r} reached its repetition cap ({max_epochs:g} epochs) before "
                f"{target_units:,} units were scheduled; lower the budget or its share, or raise max_epochs"
            )
        n = len(units_by_source[names[s]])
        position = used[s] % n
        if position == 0:
            orders[s] = _source_order(seed, names[s], used[s] // n, n)
        item = int(orders[s][position])
        size = int(units_by_source[names[s]][item])
        used[s] += 1
        consumed[s] += size
        total += size
        out_source.append(s)
        out_item.append(item)
        out_units.append(size)
    return Schedule(
        sources=tuple(names),
        source=np.asarray(out_source, dtype=np.int16),
        item=np.asarray(out_item, dtype=np.int64),
        units=np.asarray(out_units, dtype=np.int64),
        version=SCHEDULE_VERSION,
        seed=seed,
    )


def schedule_target(budget: int, step_units: int) -> int:
    """Units to schedule for a budget: 10% and four global steps more.

    The margin covers pieces split across rows, padding at the end of each packing window
    and the step that crosses the budget; a worker that still runs out stops with an error
    rather than re-reading data past the repetition cap.
    """
    return int(budget * 1.1) + 4 * step_units


def _check_feasible(names, share, units_by_source, max_epochs, target_units) -> None:
    """Refuse up front when a source's capped supply cannot cover its share of the target."""
    for name, fraction in zip(names, share):
        supply = max_epochs * float(np.sum(units_by_source[name]))
        needed = fraction * target_units
        if supply < needed:
            raise MixtureError(
                f"source {name!r} holds {supply / max_epochs:,.0f} units; its share {fraction:.1%} of "
                f"{target_units:,} needs {needed:,.0f}, more than {max_epochs:g} epochs (the repetition cap)"
            )
