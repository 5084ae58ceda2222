"""The run record's schema, and `upgrade`: the one place where a record an earlier embedlab
wrote is read into the current layout.

Records are JSON mappings of four kinds:

    "record"   a run's study record (`study.json`): {"study": <study>, "schema": ..., ...}
    "study"    a study (`Study.to_dict`): its arms are trial configs
    "config"   a trial config (`TrialConfig.to_dict`)
    "row"      a trial row (`trials/<trial id>.json`)

A study record carries `schema` (SCHEMA) from schema 2 on; one without it is schema 1. The
other kinds live inside a run whose record says its schema, and are read by their shape, so a
config or row of any schema reads alike. `upgrade(record, kind)` returns the record in the
current layout, as a new mapping (the argument is not changed); a record of a later schema
than this code's is refused, as guessing at it could misread it. Each step:

    schema 1 -> 2   budgets as one mapping: a trial config's flat `train.budget_*` keys and a
                    study's flat `budget_*` keys become one `budget` mapping of `Budget`'s
                    fields (both layouts at once is refused: which one holds would be a guess);
                    a study that declared no pairs (a phase-1 study's 0) gets its arms' own,
                    which its trials trained to. A trial row without `status` or `stage` (written
                    before unfinished trials and tuning trials were recorded) is a finished
                    final trial.
    schema 2 -> 3   phases 2-3's config in sections: a trial config's flat contrastive fields
                    move into `negatives`, `distillation`, `matryoshka` and `prefixes`
                    (`CONTRASTIVE_MOVES`, e.g. `hard_negatives` -> `negatives.count`), and the
                    config paths a study names (its factor, its searches) and a row records (its
                    factor, its `param/<path>` columns) follow them.
    schema 3 -> 4   seeds until decided, equivalence and reuse, all additions: a study may say
                    `until_decided` with `max_seeds` and an `equivalence_margin`, a run may hold
                    `sequential.json` (its looks), a record says whether the run reused finished
                    trials (`reuse`), and a grid trial's row carries its `trial_key` and, when it
                    was copied from another run, `reused_from`. An older record has none of them,
                    and reads as it did (a run of fixed seeds that trained every trial itself, its
                    table as before). The step moves nothing; the number keeps an older embedlab
                    from printing a fixed-seed test of a sequential run, which would not hold its
                    size.
    schema 4 -> 5   wall time by stage, additions: a trial row carries `time/<stage>`, `time/wall`
                    and its span (`time/started`, `time/ended`), and a study record
                    `time_by_stage`, one entry per run of the sweep on its directory
                    (`embedlab.core.timing`). An older record has none, and its table shows no
                    breakdown, as before; the step moves nothing.

A step added later goes here, as a function of the kinds it changes, and in the list above;
`tests/test_records.py` reads every run record under `docs/results/runs/` through it and holds
each table, re-rendered, to the one recorded with the records.
"""

from __future__ import annotations

import copy
from typing import Any

from embedlab.core.errors import ConfigError, RunRecordError

SCHEMA = 5
KINDS = ("record", "study", "config", "row")
# The flat keys configs and study records held before the budget was one object (schema 1),
# and the Budget field each is now.
FLAT_BUDGET_KEYS = {"budget_tokens": "tokens", "budget_pairs": "pairs", "budget_flops": "flops",
                    "budget_device_seconds": "device_seconds", "budget_scope": "scope"}


# Schema 3: ContrastiveConfig's flat fields of schema 2, and the section and field each is now.
CONTRASTIVE_MOVES = {
    "hard_negatives": ("negatives", "count"), "mining_top_k": ("negatives", "top_k"),
    "mining_margin": ("negatives", "margin"), "mine_negatives": ("negatives", "mine"),
    "given_negative_margin": ("negatives", "given_margin"),
    "teacher": ("distillation", "teacher"), "teacher_query_prefix": ("distillation", "query_prefix"),
    "teacher_passage_prefix": ("distillation", "passage_prefix"), "kl_weight": ("distillation", "kl_weight"),
    "margin_mse_weight": ("distillation", "margin_mse_weight"),
    "embedding_mse_weight": ("distillation", "embedding_mse_weight"),
    "kl_student_temperature": ("distillation", "student_temperature"),
    "kl_teacher_temperature": ("distillation", "teacher_temperature"),
    "teacher_min_confidence": ("distillation", "min_confidence"),
    "matryoshka_dims": ("matryoshka", "dims"), "matryoshka_weights": ("matryoshka", "weights"),
    "query_prefix": ("prefixes", "query"), "passage_prefix": ("prefixes", "passage"),
}


def upgrade(record: dict[str, Any], kind: str) -> dict[str, Any]:
    """`record`, a mapping of `kind` (KINDS) written by this or any earlier embedlab, in the
    current schema (a new mapping)."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}; valid: {list(KINDS)}")
    if not isinstance(record, dict):
        raise RunRecordError(f"a {kind} must be a JSON object, got {type(record).__name__}")
    return _STEPS[kind](copy.deepcopy(record))


def _record(record: dict[str, Any]) -> dict[str, Any]:
    schema = record.get("schema", 1)
    if not isinstance(schema, int) or schema > SCHEMA:
        raise RunRecordError(f"study record of schema {schema!r}: this embedlab reads schemas 1 to {SCHEMA}; "
                             "read it with the embedlab that wrote it, or a later one")
    if isinstance(record.get("study"), dict):
        record["study"] = _study(record["study"])
    record["schema"] = SCHEMA
    return record


def _study(study: dict[str, Any]) -> dict[str, Any]:
    if isinstance(study.get("factor"), str):
        study["factor"] = config_path(study["factor"])
    if isinstance(study.get("search"), list):
        study["search"] = [{**s, "path": config_path(s["path"])} if isinstance(s, dict) and "path" in s else s
                           for s in study["search"]]
    arms = study.get("arms")
    if isinstance(arms, dict):
        study["arms"] = {arm: _config(config) if isinstance(config, dict) else config for arm, config in arms.items()}
    study = nest_flat_budget(study, "study")
    budget = study.get("budget")
    if isinstance(budget, dict) and not budget.get("pairs"):
        # A phase-1 study declared no pairs; its arms trained to their own figure, theirs still.
        arm_pairs = [config.get("train", {}).get("budget", {}).get("pairs") for config in (arms or {}).values()
                     if isinstance(config, dict)]
        if arm_pairs and arm_pairs[0]:
            study["budget"] = {**budget, "pairs": arm_pairs[0]}
    return study


def _config(config: dict[str, Any]) -> dict[str, Any]:
    if isinstance(config.get("train"), dict):
        config["train"] = nest_flat_budget(config["train"], "trial.train")
    if isinstance(config.get("contrastive"), dict):
        config["contrastive"] = nest_contrastive(config["contrastive"])
    return config


def _row(row: dict[str, Any]) -> dict[str, Any]:
    row.setdefault("status", "finished")
    row.setdefault("stage", "final")
    if isinstance(row.get("factor"), str):
        row["factor"] = config_path(row["factor"])
    for key in [k for k in row if k.startswith("param/")]:
        row[f"param/{config_path(key[len('param/'):])}"] = row.pop(key)
    return row


def config_path(path: str) -> str:
    """A dotted config path as the current schema names it (`contrastive.hard_negatives` ->
    `contrastive.negatives.count`); any other path as it is."""
    section, _, rest = path.partition(".")
    if section == "contrastive" and rest in CONTRASTIVE_MOVES:
        return ".".join((section, *CONTRASTIVE_MOVES[rest]))
    return path


def nest_contrastive(raw: dict[str, Any]) -> dict[str, Any]:
    """A contrastive section with the flat fields of schema 2 (`CONTRASTIVE_MOVES`) moved into
    their sections; `raw` itself when it has none. A flat field beside its section's own value
    is a ConfigError: which one holds would be a guess."""
    flat = [key for key in CONTRASTIVE_MOVES if key in raw]
    if not flat:
        return raw
    nested = {key: value for key, value in raw.items() if key not in CONTRASTIVE_MOVES}
    for key in flat:
        section, name = CONTRASTIVE_MOVES[key]
        part = dict(nested.get(section) or {})
        if name in part:
            raise ConfigError(f"contrastive: has both {key} and {section}.{name}; keep one")
        part[name] = raw[key]
        nested[section] = part
    return nested


_STEPS = {"record": _record, "study": _study, "config": _config, "row": _row}


def nest_flat_budget(raw: dict[str, Any], section: str) -> dict[str, Any]:
    """`raw` (a TrainConfig's or a study's mapping) with the flat budget keys of schema 1
    (`FLAT_BUDGET_KEYS`) moved into one `budget` mapping; `raw` itself when it has none. Both
    layouts at once is a ConfigError: which one holds would be a guess."""
    flat = [key for key in FLAT_BUDGET_KEYS if key in raw]
    if not flat:
        return raw
    if "budget" in raw:
        raise ConfigError(f"{section}: has both a budget mapping and the older flat keys {flat}; keep one")
    rest = {key: value for key, value in raw.items() if key not in FLAT_BUDGET_KEYS}
    return {**rest, "budget": {FLAT_BUDGET_KEYS[key]: raw[key] for key in flat}}
