"""Promotion: pick a study's winner on recipe-dev, check the retention margin, write its
lineage and the next phase's study.

The winner is the arm with the best mean of a `dev/` metric across seeds (final-eval
columns are never read: selection on test labels would leak them into the recipe). Within
the winning arm, the seed with the best dev metric supplies the checkpoint. A winner whose
retention panel, as the arm's mean over seeds, falls more than `max_retention_drop` below its
parent's (scored by the same evaluator when the run started) is refused with a
`RetentionMarginError` that names the arm, the broken metrics and the best arm within the
margin. The margin is absolute, in metric points: 0.10 lets a score end 0.10 below the
parent's, not 10% below it. Every retention metric the parent has is checked; an arm
without one is refused (`RetentionMetricMissing`), never skipped. A dual-head parent is
scored per head (`retention/mlm_accuracy/<head>`): a child, which carries one head on, is
checked against the head it continued (the one nearest its masking ratio, as
`single_head_state` chose when it loaded the parent). The result is `RUN_DIR/promotion.json` and,
unless the study was phase 3, `RUN_DIR/next_study.py`: the next phase's study file with the
winner as every arm's parent, which `embedlab sweep` (or `promote --run`) runs.

After the winner is chosen, and only then, its checkpoint is scored once on the final-eval
split (the `test` qrels of the task the study scored on dev) and the number is written beside
its dev metric as `final_eval`, labelled as never used for selection: nothing reads it back to
choose an arm, a seed or a hyperparameter. A task without a test split, or a run whose task
can no longer be found, records why instead of a number. The record also carries the one line
saying what the arms were matched in (`compute_match`: data, FLOPs or device time).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from embedlab.artifacts.sync import local_directory
from embedlab.core import beir, store
from embedlab.core.code_identity import PACKAGE_DIR
from embedlab.core.config import DEFAULT_MAX_RETENTION_DROP, PHASES, EvalConfig, MaskingConfig, build_config
from embedlab.core.errors import UserError
from embedlab.records.rundir import last_error_line
from embedlab.stats.paired import final_trials
from embedlab.stats.ladder import LadderError, ladder_of, load_rungs, rung_record
from embedlab.stats.table import budget_unit, check_equal_compute, compute_match_line, load_table, read_study_record
from embedlab.studies.study import load_study
from embedlab.tasks.hub_tasks import materialise_hub_task

PROMOTION_FILE = "promotion.json"
NEXT_STUDY_FILE = "next_study.py"
PREPARED_FILE = "prepared.json"
FINAL_EVAL_SPLIT = "test"
FINAL_EVAL_NOTE = "reported once after selection; never used to choose anything"
MARGIN_UNIT = "absolute, in metric points: 0.10 lets a score end 0.10 below the parent's, not 10% below it"
RETENTION_PREFIX = "retention/"
# A drop equal to the margin passes; float subtraction (0.8 - 0.7) must not tip it over.
MARGIN_TOLERANCE = 1e-9
# The next phase's study when none is named: the recipe's order of ablations.
NEXT_STUDY = {1: "joint_vs_contrastive.py", 2: "hard_negatives.py"}
ABLATIONS_DIR = "ablations"
# Manifest fields that make up the stage contract a child run inherits.
LINEAGE_FIELDS = (
    "content_hash", "parent_hash", "parent_phase", "tokenizer_hash", "pooling", "data_revision", "objective",
    "precision", "distributed", "optimizer", "budget", "seed", "phase",
)


class PromotionError(UserError, ValueError):
    """A promotion was refused: the message says which rule and the numbers behind it."""


class RetentionMarginError(PromotionError):
    """An arm's mean retention over seeds fell more than the margin below its parent's.

    `arm` is the refused arm, `broken` its broken metrics (metric -> the drop record of
    `arm_retention`), `max_drop` the margin, and `within_margin` the best-ranked arm that
    keeps it (None when no arm does, or when the refused arm was asked for with --arm)."""

    def __init__(self, arm: str, broken: dict[str, dict[str, Any]], max_drop: float, within_margin: str | None):
        self.arm, self.broken, self.max_drop, self.within_margin = arm, broken, max_drop, within_margin
        detail = "; ".join(f"{k} {v['parent']:.4f} -> {v['child']:.4f} (drop {v['drop']:.4f}; worst seed "
                           f"{v['worst_seed']}: {v['worst_child']:.4f})" for k, v in broken.items())
        seeds = next(iter(broken.values()))["seeds"]
        passing = (f"; the best arm within the margin is {within_margin!r} (promote it with --arm {within_margin})"
                   if within_margin is not None else "")
        super().__init__(f"winner {arm!r} breaks the retention margin {max_drop:g} ({MARGIN_UNIT}) against its "
                         f"parent, on its mean over {seeds} seeds: {detail}{passing}")


class RetentionMetricMissing(PromotionError):
    """The parent has a retention metric that an arm's trials lack, so the margin cannot be
    checked: refused rather than skipped. `arm`, `metric` and `seeds` (the seeds without it)."""

    def __init__(self, arm: str, metric: str, seeds: list[int], parent: float):
        self.arm, self.metric, self.seeds = arm, metric, seeds
        super().__init__(f"arm {arm!r} has no {metric} at seed(s) {seeds}, but its parent scored {parent:.4f}: "
                         "the retention margin cannot be checked without it (the trials were scored without "
                         "that part of the retention panel)")


def rank_arms(table: pd.DataFrame, metric: str, arm_order: list[str]) -> pd.DataFrame:
    """Arms by mean `metric` across seeds, best first (ties keep the study's arm order)."""
    grouped = table.groupby("arm")[metric].agg(["mean", "count"])
    grouped["order"] = [arm_order.index(arm) for arm in grouped.index]
    return grouped.sort_values(["mean", "order"], ascending=[False, True]).drop(columns="order")


def _ladder_rungs(run_dir: str) -> list | None:
    """The rungs of the budget ladder `run_dir` tops (`ladder.load_rungs`), None when it is no
    rung of one; PromotionError when it is a lower rung: a ladder promotes from its top rung."""
    dirs = ladder_of(run_dir)
    if len(dirs) < 2:
        return None
    try:
        rungs = load_rungs(dirs)
    except LadderError as error:
        raise PromotionError(f"{run_dir}: a rung of a budget ladder whose rungs do not read together: {error}") from None
    if store.resolve(rungs[-1].run_dir) != run_dir:
        raise PromotionError(f"{run_dir}: a lower rung of a budget ladder ({len(rungs)} rungs beside it); a ladder "
                             f"promotes from its top rung, the largest budget: {rungs[-1].run_dir}")
    return rungs


def _ladder_record(rungs: list, winner: str) -> dict[str, Any]:
    """What promotion.json says of the ladder: each rung's winner on the study metric, and
    whether the promoted arm also won every lower rung."""
    record = rung_record(rungs, winner)
    lost = [f"rung {i} ({arm}, {run_dir})" for i, arm, run_dir in record["lost"]]
    return {"rungs": record["rungs"], "won_every_rung": record["won_every_rung"],
            "line": (f"top rung of a {len(rungs)}-rung budget ladder; {winner} "
                     + ("also won every lower rung" if not lost else f"did not win {', '.join(lost)}"))}


def parent_retention(parent_scores: dict[str, Any]) -> dict[str, float]:
    """The parent's retention metrics that hold a number (a panel part it could not score is None)."""
    return {k: float(v) for k, v in parent_scores.items()
            if k.startswith(RETENTION_PREFIX) and isinstance(v, (int, float)) and not math.isnan(v)}


def arm_masking_ratio(record: dict[str, Any], arm: str) -> float:
    """The masking ratio `arm` trained at, which chose the head it took from a dual-head parent;
    the config default for a record that holds no masking config (written before arms were
    recorded in full)."""
    return float((record["study"]["arms"].get(arm) or {}).get("masking", {}).get("ratio", MaskingConfig.ratio))


def retention_pairs(parent: dict[str, float], child_columns: set[str],
                    masking_ratio: float) -> tuple[dict[str, str], dict[str, str]]:
    """Which child column each parent retention metric is checked against, and why the others
    are not: ({parent metric: child column}, {parent metric: reason}).

    Metric for metric, except when a dual-head parent (per-head masked-token accuracy) has a
    single-head child: the child's masked-token accuracy is checked against the parent's head
    it continued, and the parent's other heads (and its nearest-15% alias) against nothing,
    as the child does not carry them."""
    from embedlab.tasks.retention import MLM_ACCURACY, head_metric, nearest_head  # here: torch, which choosing a winner from the trial table does not need

    heads = {key: key.removeprefix(f"{MLM_ACCURACY}/") for key in parent if key.startswith(f"{MLM_ACCURACY}/")}
    if not heads or any(column.startswith(f"{MLM_ACCURACY}/") for column in child_columns):
        return {key: key for key in parent}, {}
    carried = nearest_head(list(heads.values()), masking_ratio)
    pairs = {key: key for key in parent if key not in heads and key != MLM_ACCURACY}
    pairs[head_metric(carried)] = MLM_ACCURACY
    reason = (f"this arm carries the parent's head {carried} alone (nearest its masking ratio {masking_ratio:g}), "
              f"checked as {head_metric(carried)}")
    skipped = {key: reason for key in parent if key not in pairs}
    return pairs, skipped


def arm_retention(rows: pd.DataFrame, arm: str, parent: dict[str, float],
                  pairs: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Per parent metric: the parent's score, the arm's mean over its seeds ("child"), the drop
    (parent minus mean; positive is forgetting, in metric points) and the worst seed. A
    metric missing at any seed raises `RetentionMetricMissing`."""
    drops = {}
    for key, column in pairs.items():
        values = rows.set_index("seed")[column].astype(float) if column in rows else pd.Series(math.nan, rows["seed"])
        lacking = [int(seed) for seed, value in values.items() if math.isnan(value)]
        if lacking:
            raise RetentionMetricMissing(arm, column, lacking, parent[key])
        worst_seed = values.idxmin()
        drops[key] = {"parent": parent[key], "child": float(values.mean()), "drop": parent[key] - float(values.mean()),
                      "seeds": len(values), "worst_seed": int(worst_seed), "worst_child": float(values[worst_seed]),
                      "worst_drop": parent[key] - float(values[worst_seed]),
                      **({"child_metric": column} if column != key else {})}
    return drops


def _previous_promotion(run_dir: str) -> dict[str, Any] | None:
    location = store.join(run_dir, PROMOTION_FILE)
    if not store.is_file(location):
        return None
    try:
        return json.loads(store.read_text(location))
    except json.JSONDecodeError as error:
        raise PromotionError(f"{location}: not a promotion record ({error}); move it away to promote again") from None


def breaks_margin(drop: dict[str, Any], max_drop: float) -> bool:
    return drop["drop"] > max_drop + MARGIN_TOLERANCE


@dataclass(frozen=True)
class Choice:
    """The study's winner (`choose`): the arm, its best seed's row, the ranking it won, its
    retention drops and the retention metrics it could not be checked on (and why)."""

    arm: str
    row: dict[str, Any]
    ranking: pd.DataFrame
    drops: dict[str, dict[str, Any]]
    not_compared: dict[str, str]


def promote(
    run_dir: str | Path,
    *,
    metric: str | None = None,
    max_retention_drop: float = DEFAULT_MAX_RETENTION_DROP,
    arm: str | None = None,
    next_study: str | Path | None = None,
    allow_missing_seeds: bool = False,
    replace: bool = False,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Choose, check and record the winner of a finished study; returns the promotion record.

    The final-eval split is read once per decision: a run that already has a promotion.json is
    refused (PromotionError) unless `replace`, and then the new record says what it replaces
    and how many times the run's final-eval split has now been read (`final_eval_reads`).

    Refused (PromotionError) when an (arm, seed) the study declared has no finished trial with
    the metric, unless `allow_missing_seeds` (then every arm still needs one seed, and the
    ranking records the seeds each arm had).

    Named stages: `check_request` (the metric, the margin, an earlier promotion), `ranked_trials`
    (every declared seed scored, compute matched), `choose` (best arm by its mean on recipe-dev
    within the retention margin), then the final-eval split read once for the winner
    (`final_eval`), the record (`promotion_record`) and the next step (`next_step`)."""
    run_dir = store.resolve(run_dir)
    record, metric, previous = check_request(run_dir, metric, max_retention_drop, replace)
    table = ranked_trials(run_dir, record, metric, allow_missing_seeds, progress)
    choice = choose(table, record, metric, arm, max_retention_drop)
    # Selection is over: the winner is fixed before its final-eval number exists.
    scored = final_eval(run_dir, record, choice.row, metric)
    promotion = promotion_record(run_dir, record, table, choice, scored, metric, max_retention_drop, previous)
    report_promotion(promotion, choice, metric, progress)
    next_step(run_dir, record, promotion, next_study, progress)
    store.write_text(store.join(run_dir, PROMOTION_FILE), json.dumps(promotion, indent=2, sort_keys=True, default=str))
    return promotion


def check_request(run_dir: str, metric: str | None, max_retention_drop: float,
                  replace: bool) -> tuple[dict[str, Any], str, dict[str, Any] | None]:
    """The run's study record, the metric promotion ranks by (a recipe-dev one: selection
    never reads final-eval) and an earlier promotion, which only `replace` may replace."""
    record = read_study_record(run_dir)
    metric = metric or record["study"]["metric"]
    if not dev_measure(metric).startswith("dev/"):
        raise PromotionError(f"--metric {metric}: promotion reads recipe-dev metrics only (dev/...); "
                             "final-eval numbers never take part in selection")
    if max_retention_drop < 0:
        raise PromotionError("--max-retention-drop must be >= 0")
    previous = _previous_promotion(run_dir)
    if previous is not None and not replace:
        winner = previous.get("winner") or {}
        raise PromotionError(
            f"{run_dir}: already promoted ({winner.get('arm')} seed {winner.get('seed')}, {PROMOTION_FILE}); "
            "promoting again would read the final-eval split again, which selection must never see twice: "
            "pass --replace to replace that decision (the new record says the split was read again)")
    return record, metric, previous


def ranked_trials(run_dir: str, record: dict[str, Any], metric: str, allow_missing_seeds: bool,
                  progress: Callable[[str], None]) -> pd.DataFrame:
    """The finished grid trials scored on `metric`, every declared (arm, seed) among them (or,
    with `allow_missing_seeds`, every arm), their compute shown equal."""
    study = record["study"]
    table = load_table(run_dir)
    if table.empty:
        raise PromotionError(f"{run_dir}: no finished trials to promote")
    # A stopped grid trial (a failed tuning trial is not why a grid trial is missing).
    stopped = table[table["status"].isin(["nonfinite", "failed"]) & (table["stage"] == "final")]
    table = final_trials(table)
    if metric not in table.columns:
        raise PromotionError(f"--metric {metric}: not a column of the trial table")
    # A seed without the metric is a seed the ranking does not have (load_table marks a
    # finished trial without the study metric failed; another --metric is checked here).
    unscored = table[pd.to_numeric(table[metric], errors="coerce").isna()]
    table = table.drop(index=unscored.index)
    missing = [(a, s) for a in record["arm_order"] for s in study["seeds"]
               if not ((table["arm"] == a) & (table["seed"] == s)).any()]
    if missing and (not allow_missing_seeds or any(a not in set(table["arm"]) for a, _ in missing)):
        why = "; ".join([*(f"{r['arm']} seed {r['seed']}: {r['status']} ({last_error_line(r.get('error'))})"
                           for _, r in stopped.iterrows()),
                         *(f"{r['arm']} seed {r['seed']}: {metric} is {r[metric]!r}" for _, r in unscored.iterrows())])
        allow = "" if allow_missing_seeds else "; or rank on the seeds present with --allow-missing-seeds"
        raise PromotionError(f"{run_dir}: trials missing for (arm, seed) {missing}; "
                             + (f"stopped: {why}" if why else
                                f"finish the study first (embedlab sweep STUDY --resume {run_dir})") + allow)
    if missing:
        progress(f"promote: --allow-missing-seeds: ranking on fewer seeds than the study declared "
                 f"({len(study['seeds'])}): missing (arm, seed) {missing}")
    check_equal_compute(table, budget_unit(record))
    return table


def choose(table: pd.DataFrame, record: dict[str, Any], metric: str, arm: str | None,
           max_retention_drop: float) -> Choice:
    """The best arm by its mean `metric` over seeds (or `arm`) whose retention stays within the
    margin of the parent's, and its best seed; RetentionMarginError naming the first that broke
    it when a better arm did."""
    ranking = rank_arms(table, metric, record["arm_order"])
    if arm is not None and arm not in ranking.index:
        raise PromotionError(f"--arm {arm}: not an arm of this study; arms: {list(ranking.index)}")
    parent = parent_retention(record.get("parent_scores") or {})
    chosen = refusal = None
    for candidate in [arm] if arm is not None else list(ranking.index):
        rows = table[table["arm"] == candidate]
        pairs, not_compared = retention_pairs(parent, {c for c in rows if rows[c].notna().any()},
                                              arm_masking_ratio(record, candidate))
        drops = arm_retention(rows, candidate, parent, pairs)
        broken = {k: v for k, v in drops.items() if breaks_margin(v, max_retention_drop)}
        if not broken:
            chosen = Choice(arm=candidate, row=rows.loc[rows[metric].idxmax()].to_dict(), ranking=ranking,
                            drops=drops, not_compared=not_compared)
            break
        if refusal is None:
            refusal = (candidate, broken)
    if refusal is not None:
        raise RetentionMarginError(*refusal, max_retention_drop, chosen.arm if chosen else None)
    return chosen


def promotion_record(run_dir: str, record: dict[str, Any], table: pd.DataFrame, choice: Choice,
                     scored: dict[str, Any], metric: str, max_retention_drop: float,
                     previous: dict[str, Any] | None) -> dict[str, Any]:
    """`promotion.json`: the decision, the final-eval number it read once, what compute the
    arms were matched on, the retention check, the winner's checkpoint and its lineage."""
    from embedlab.checkpoints.io import verify_checkpoint  # here: torch, which choosing a winner does not need

    row, ranking = choice.row, choice.ranking
    manifest = verify_checkpoint(row["checkpoint"])
    promotion = {
        "run_dir": str(run_dir),
        "study": record["study"]["name"],
        "study_hash": record["study_hash"],
        "phase": int(row["phase"]),
        "metric": metric,
        "selection": "best arm by mean over seeds on recipe-dev; its best seed's checkpoint",
        "ranking": [{"arm": a, "mean": float(r["mean"]), "seeds": int(r["count"])} for a, r in ranking.iterrows()],
        "winner": {"arm": choice.arm, "seed": int(row["seed"]), "trial_id": row["trial_id"], metric: float(row[metric])},
        "final_eval": scored,
        "compute_match": compute_match_line(table, budget_unit(record)),
        "retention": {"max_drop": max_retention_drop, "unit": MARGIN_UNIT, "over": "the arm's mean over its seeds",
                      "parent_scored": bool(record.get("parent_scores")), "drops": choice.drops,
                      "not_compared": choice.not_compared},
        "checkpoint": row["checkpoint"],
        "lineage": {k: manifest[k] for k in LINEAGE_FIELDS if k in manifest},
        "promoted": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "final_eval_reads": 1 + (int(previous.get("final_eval_reads", 1)) if previous else 0),
    }
    rungs = _ladder_rungs(run_dir)
    if rungs:
        promotion["ladder"] = _ladder_record(rungs, choice.arm)
    if previous is not None:
        promotion["replaces"] = {k: previous.get(k) for k in ("winner", "final_eval", "promoted")}
    return promotion


def report_promotion(promotion: dict[str, Any], choice: Choice, metric: str, progress: Callable[[str], None]) -> None:
    """The decision's lines: the ladder, a replaced promotion, the winner, the compute match,
    the final-eval number beside dev, and the retention check metric by metric."""
    row, scored, winner = choice.row, promotion["final_eval"], choice.arm
    if "ladder" in promotion:
        progress(f"promote: {promotion['ladder']['line']}")
    if "replaces" in promotion:
        progress(f"promote: --replace: this run's final-eval split has now been read "
                 f"{promotion['final_eval_reads']} times (recorded in {PROMOTION_FILE})")
    progress(f"promote: {winner} (seed {int(row['seed'])}) wins on {metric} "
             f"{choice.ranking.loc[winner, 'mean']:.4f} mean over {int(choice.ranking.loc[winner, 'count'])} seeds")
    progress(f"promote: {promotion['compute_match']}")
    if scored["value"] is not None:
        progress(f"promote: final eval {scored['metric']} {scored['value']:.4f} on {scored['task']} "
                 f"({scored['queries']} queries), beside dev {float(row[metric]):.4f}: {FINAL_EVAL_NOTE}")
    else:
        progress(f"promote: final eval not scored: {scored['reason']}")
    if not promotion["retention"]["parent_scored"]:
        progress("promote: no parent scores (phase 1 starts from scratch): retention margin not applicable")
    else:
        progress(f"promote: retention margin {promotion['retention']['max_drop']:g} ({MARGIN_UNIT}), "
                 f"on {winner}'s mean over its seeds")
    for key, value in choice.drops.items():
        progress(f"promote: {retention_line(key, value)}")
    for key, reason in choice.not_compared.items():
        progress(f"promote: {key} not checked: {reason}")


def next_step(run_dir: str, record: dict[str, Any], promotion: dict[str, Any], next_study: str | Path | None,
              progress: Callable[[str], None]) -> None:
    """The next phase's study, written beside the run with the winner as its parent; after the
    last phase, the command that releases the winner."""
    phase = promotion["phase"]
    if phase + 1 in PHASES:
        child = _write_next_study(run_dir, _resolve_next(record, phase, next_study), promotion,
                                  record["study"].get("profile") or None)
        promotion["next_study"] = str(child)
        progress(f"promote: next phase study {child}")
    else:
        promotion["release"] = f"embedlab export {promotion['checkpoint']} OUT_DIR"
        progress(f"promote: phase {phase} is the last; release with: {promotion['release']}")


def retention_line(metric: str, drop: dict[str, Any]) -> str:
    """One metric's check: parent, the arm's mean over seeds, the drop, and the worst seed."""
    child = f" (this arm's {drop['child_metric']})" if "child_metric" in drop else ""
    return (f"{metric}{child} parent {drop['parent']:.4f} -> mean {drop['child']:.4f} over {drop['seeds']} seeds "
            f"(drop {drop['drop']:+.4f}); worst seed {drop['worst_seed']}: {drop['worst_child']:.4f} "
            f"(drop {drop['worst_drop']:+.4f})")


def dev_measure(metric: str) -> str:
    """The per-task measure a study metric names: itself for "dev/<name>", "dev/<name>" for a
    panel's "<task>/dev/<name>" or "mean/dev/<name>" (`embedlab.evaluate.panel`)."""
    _, _, rest = metric.partition("/")
    return rest if rest.startswith("dev/") else metric


def final_eval(run_dir: str, record: dict[str, Any], row: dict[str, Any], metric: str) -> dict[str, Any]:
    """The checkpoint of trial `row` (the winner) scored on the final-eval split of the task its
    arm was scored on, for `metric`'s measure (dev/ndcg@10 -> test/ndcg@10).

    The task is resolved as the sweep resolves it: the arm's `eval.task` (a BEIR directory, or
    a built-in task inside the arm's prepared data, `prepared.json`), and must still hash as
    it did when the trial was scored (`eval/task_hash`). Returns {"split": "test", "metric":
    "test/<name>", "value", "note", "task", "task_hash", "queries", "checkpoint_hash"}; when
    the task cannot be found, has no test split or has changed, "value" is None and "reason"
    says why.

    A panel's metric scores the same task(s): "<task>/dev/<name>" that task (metric
    "<task>/test/<name>"), "mean/dev/<name>" every task of the panel and their unweighted mean
    ("mean/test/<name>", None unless every task has a number); "tasks" holds each task's entry,
    each checked against its own ``<task>/eval/task_hash``."""
    measure = dev_measure(metric)
    name = measure.split("/", 1)[1]
    panel_prefix = metric.split("/", 1)[0] if measure != metric else None
    label = f"{FINAL_EVAL_SPLIT}/{name}" if panel_prefix is None else f"{panel_prefix}/{FINAL_EVAL_SPLIT}/{name}"
    entry: dict[str, Any] = {"split": FINAL_EVAL_SPLIT, "metric": label, "value": None, "note": FINAL_EVAL_NOTE}
    arm = row["arm"]
    arm_config = record["study"]["arms"].get(arm) or {}
    if "eval" not in arm_config:
        return {**entry, "reason": f"the study record holds no eval config for arm {arm} (written before "
                                   "arms were recorded in full), so its task is unknown"}
    config = build_config(EvalConfig, arm_config["eval"], "eval")
    if config.split == FINAL_EVAL_SPLIT:
        return {**entry, "reason": f"arm {arm} was scored on the {FINAL_EVAL_SPLIT} split itself, so no "
                                   "held-out final-eval split is left"}
    prepared_location = store.join(run_dir, PREPARED_FILE)
    prepared = json.loads(store.read_text(prepared_location)) if store.is_file(prepared_location) else {}
    arm_prepared = prepared.get(arm, {})
    # This machine's copy of data published to object storage, fetched and verified.
    prepared_dir = str(local_directory(arm_prepared)) if arm_prepared.get("directory") else None
    if panel_prefix is None:
        return {**entry, **_score_final(config.task, lambda: config.task, prepared_dir, row, "eval/task_hash", name,
                                        config)}
    recorded = dict(arm_prepared.get("eval_tasks") or [])
    names = list(config.task_names) if panel_prefix == "mean" else [panel_prefix]
    hubs = {spec.name: spec for spec in config.hub_tasks}
    sources = dict(zip(config.task_names, (config.task, *config.tasks, *config.hub_tasks)))

    def locate(task: str):
        def where() -> str:
            if task in recorded:
                return recorded[task]
            if task in hubs:  # materialised again from the pinned revision (a cache hit on this machine)

                return str(materialise_hub_task(hubs[task]).directory)
            return sources[task]
        return where

    tasks = {task: {"metric": f"{FINAL_EVAL_SPLIT}/{name}",
                    **_score_final(task, locate(task), prepared_dir, row, f"{task}/eval/task_hash", name, config)}
             for task in names}
    values = [scored["value"] for scored in tasks.values()]
    missing = [task for task, scored in tasks.items() if scored["value"] is None]
    if missing:
        return {**entry, "tasks": tasks, "reason": "; ".join(f"{task}: {tasks[task]['reason']}" for task in missing)}
    return {**entry, "value": math.fsum(values) / len(values), "tasks": tasks, "task": ", ".join(names),
            "queries": sum(scored["queries"] for scored in tasks.values()),
            "checkpoint_hash": next(iter(tasks.values()))["checkpoint_hash"]}


def _score_final(task_label: str, locate: Callable[[], str], prepared_dir: str | None, row: dict[str, Any],
                 hash_column: str, name: str, config) -> dict[str, Any]:
    """One task's final-eval number for `final_eval`: {"value", "task", "task_hash", "queries",
    "checkpoint_hash"}, or {"value": None, "reason"}. `locate()` gives the task as `resolve_task`
    takes it (a BEIR directory or a built-in name); its hash must still be `row[hash_column]`."""
    # here: torch, which choosing a winner from the trial table does not need
    from embedlab.evaluate.checkpoint_eval import evaluate_checkpoint
    from embedlab.tasks.resolve import resolve_task

    try:  # every split, so the hash is the one the trial rows recorded
        task = beir.load_task(resolve_task(locate(), Path(prepared_dir) if prepared_dir else None))
    except (FileNotFoundError, ValueError) as error:  # TaskFormatError is a ValueError: e.g. no test qrels
        return {"value": None, "reason": f"task {task_label!r}: {error}"}
    scored_on = row.get(hash_column)
    if isinstance(scored_on, str) and scored_on != task.hash:
        return {"value": None, "reason": f"task {task_label!r} now hashes {task.hash[:12]}, but trial "
                                         f"{row['trial_id']} was scored on {scored_on[:12]}: its content changed "
                                         "since the study ran"}
    scores = evaluate_checkpoint(row["checkpoint"], task, FINAL_EVAL_SPLIT, batch_size=config.batch_size,
                                 max_length=config.max_length, index=config.index)
    if name not in scores:
        return {"value": None, "reason": f"the evaluator reports no {name} (it reports {', '.join(sorted(scores))})"}
    return {"value": float(scores[name]), "task": task.name, "task_hash": task.hash,
            "queries": int(scores["queries"]), "checkpoint_hash": scores["checkpoint_hash"]}


def packaged_ablations() -> Path:
    """The repository's `ablations/` beside `platform/`, found from the installed package (an
    editable install is the checkout itself), so it does not depend on the working directory."""
    return PACKAGE_DIR.resolve().parent.parent / ABLATIONS_DIR


def _resolve_next(record: dict[str, Any], phase: int, next_study: str | Path | None) -> Path:
    if next_study is not None:
        path = Path(next_study)
    else:
        name = NEXT_STUDY[phase]
        origin = Path(record.get("study_origin") or record["study_file"])
        # Beside the study that ran, else the installed checkout's ablations/, else the
        # working directory's (the only place looked at before).
        looked = [origin.parent / name, packaged_ablations() / name, Path.cwd() / "ablations" / name]
        path = next((candidate for candidate in looked if candidate.is_file()), looked[0])
        if not path.is_file():
            raise PromotionError(f"next study file {name} not found in {', '.join(str(c.parent) for c in looked)} "
                                 "(name one with --next)")
    if not path.is_file():
        raise PromotionError(f"next study file not found: {path} (name one with --next)")
    return path.resolve()


def _write_next_study(run_dir: str, next_path: Path, promotion: dict[str, Any], profile: str | None) -> str:
    child = load_study(next_path, profile)  # refuse now, not at launch, a study that does not fit
    if child.phase != promotion["phase"] + 1:
        raise PromotionError(f"{next_path}: a phase-{child.phase} study cannot follow phase {promotion['phase']}")
    winner = promotion["winner"]
    text = f'''"""Phase {child.phase} after promoting {winner["arm"]} (seed {winner["seed"]}) of study
{promotion["study"]}: {next_path.name} with that checkpoint as every arm's parent.

Written by `embedlab promote {run_dir}`.
Run:  embedlab sweep {store.join(run_dir, NEXT_STUDY_FILE)}
"""

from embedlab.studies.study import load_study

NEXT = {str(next_path)!r}
PARENT = {promotion["checkpoint"]!r}
PARENT_HASH = {promotion["lineage"]["content_hash"]!r}
PROFILE = {profile!r}
ORIGIN = NEXT  # promotion of this study's run looks for the phase after it beside NEXT


def study(profile=PROFILE):
    return load_study(NEXT, profile).with_parent(PARENT, expected_hash=PARENT_HASH)
'''
    path = store.join(run_dir, NEXT_STUDY_FILE)
    store.write_text(path, text)
    load_study(path)  # the written file loads and validates
    return path
