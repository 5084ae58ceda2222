"""What a sweep refuses before any trial starts: training data holding final-eval items that
its study does not disclose, and a pair schedule that the frozen pairs cannot fill."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from embedlab.data.contamination import check_training_data
from embedlab.data.mixture import MixtureError
from embedlab.data.pairs_table import PAIR_TABLES, pair_table_name, pair_table_path
from embedlab.data.prepared import PreparedData
from embedlab.errors import UsageError
from embedlab.evaluate.checkpoint_eval import arm_eval_tasks
from embedlab.sweep.study import Study
from embedlab.train.contrastive import trial_pair_schedule


def check_contamination(study: Study, prepared: dict[str, dict], progress: Callable[[str], None]) -> list[dict]:
    """Refuse training data holding final-eval items unless the study discloses its policy.

    Before any trial starts, each arm's stages against its evaluation task: the phase-1
    stages of its data (pretraining text of its sources, the tokenizer sample) and, in phases
    2-3, the frozen pairs table of its builders (built here if no trial built it yet). Phase
    3's mined negatives exist only once a trial has mined them: `run_contrastive` checks them
    there, before it trains."""
    findings: dict[str, dict] = {}
    checked: set[tuple[str, str, str | None]] = set()
    for arm, config in study.arms.items():
        record = prepared[arm]
        data = PreparedData(Path(record["directory"]), record)
        builders = sorted(dict(config.contrastive.pairs)) if config.phase > 1 else []
        # A user's pair sources (config.data.pair_files ...) join the table: their queries,
        # positives and given negatives are checked with the built-in pairs.
        pairs_path = pair_table_path(data, builders, progress, data=config.data) if builders else None
        for _, task_dir in arm_eval_tasks(config.eval, record):  # every task of a panel
            if (record["directory"], task_dir, str(pairs_path)) in checked:
                continue
            checked.add((record["directory"], task_dir, str(pairs_path)))
            for finding in check_training_data(data, Path(task_dir), study.disclosed_overlap, progress,
                                               pairs_path=pairs_path):
                findings.setdefault(json.dumps(finding, sort_keys=True), finding)  # arms sharing data find it once
    if findings:
        progress(f"audit: {len(findings)} final-eval item(s) overlap the training data; "
                 f"disclosed-overlap policy: {study.disclosed_overlap}")
    else:
        progress("audit: no final-eval item found in the training data")
    return list(findings.values())


def check_pair_schedules(study: Study, prepared: dict[str, dict], parent: str | None) -> None:
    """Refuse, before any trial starts, a phase-2/3 arm whose pair schedule the frozen pairs
    cannot fill within the repetition cap (`data.mixture.max_epochs`): otherwise every trial
    of that arm fails inside Ray, one after the other, and the study ranks the arms that ran."""
    if study.phase == 1:
        return
    for arm in study.arms:
        trial = study.trial_config(arm, study.seeds[0], parent)
        data = PreparedData(Path(prepared[arm]["directory"]), prepared[arm])
        builders = list(dict(trial.contrastive.pairs))
        path = pair_table_path(data, builders, lambda _: None, data=trial.data)
        # Recorded for the trials: they read this table (on any node, a copy of it) instead of
        # hashing the user's pair files again, which live on this machine only.
        prepared[arm].setdefault(PAIR_TABLES, {})[pair_table_name(builders)] = path.relative_to(data.directory).as_posix()
        try:
            trial_pair_schedule(trial, path)
        except MixtureError as error:
            raise UsageError(f"study {study.name}, arm {arm}: its budget schedules more pairs than the frozen pairs "
                             f"hold: {error}; lower the budget or the profile's pairs") from None
