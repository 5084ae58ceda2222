"""The study report: one self-contained HTML page whose every figure renders in a real browser
(headless Chromium), each with its four-part caption, for a phase-1 run (trained in this
process by the loop Ray Train runs) and the phase-2 run started from its winner."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image  # installed with matplotlib

from conftest import tiny_trial
from embedlab.core.beir import load_task
from embedlab.core.config import Budget, ContrastiveConfig, DEFAULT_BUDGET, MaskingConfig
from embedlab.evaluate.checkpoint_eval import evaluate_checkpoint
from embedlab.tasks.resolve import resolve_task
from embedlab.model.encoder import MLMModel
from embedlab.model.heads import MultiHeadMLMModel
from embedlab.objectives.dual_mlm import head_names
from embedlab.report import html as html_page, write_report
from embedlab.report.collect import read_run
from embedlab.report.model_figures import source_curves
from embedlab.streams.packed import pack_window, schedule_windows
from embedlab.records.scores import _score_columns  # the exact columns the sweep writes
from embedlab.checkpoints.io import save_checkpoint
from embedlab.studies.study import Study
from embedlab.train.loop import run as run_loop
from embedlab.train.metrics_log import FILE_NAME as METRICS_LOG, MetricsLog
from embedlab.train.phase1 import Phase1Loop, phase1_worker_config, trial_schedule
from embedlab.train.session import LocalSession

FIGURES = ("mixture", "lengths-0", "masks", "mlm", "similarity", "spectrum", "phases", "runtime")
CAPTION_PARTS = ("units", "observed", "mechanism", "limitation")
WINDOW = (1200, 9000)  # the screenshot's CSS pixels: wide as the page, tall enough for all of it
SEEDS = (0, 1)
PAIR_FAMILIES = (("title-body", 0.6), ("same-source-spans", 0.4))


def _chromium() -> str | None:
    return next((path for name in ("chromium", "chromium-browser", "google-chrome")
                 if (path := shutil.which(name))), None)


def _checkpoint(directory: Path, config, tokenizer, seed: int, *, phase: int, head: bool) -> str:
    """An untrained checkpoint of `config`'s model, saved as the trainers save theirs."""
    torch.manual_seed(seed)
    masking = config.masking
    if masking.mixed_ratios and masking.head_per_ratio:
        model = MultiHeadMLMModel(config.model, head_names(masking))
        weights = model.heads
    else:
        model = MLMModel(config.model)
        weights = model.mlm_head
    objective = {"name": "mlm" if phase == 1 else "contrastive", "masking_ratio": masking.ratio,
                 "mixed_ratios": masking.mixed_ratios,
                 "heads": list(model.head_names) if isinstance(model, MultiHeadMLMModel) else ["mlm"]}
    save_checkpoint(directory, model.encoder, head=weights if head else None, tokenizer=tokenizer,
                    fields={"phase": phase, "seed": seed, "config": config.to_dict(), "objective": objective,
                            "data_revision": "test", "precision": "fp32"})
    return str(directory)


class _LoggedSession(LocalSession):
    """An in-process session whose reports also go through Ray Train's MetricsLog callback,
    so the trial's metrics.jsonl is written as a sweep writes it."""

    def __init__(self, rows, root: Path) -> None:
        super().__init__(rows, root)
        self.log = MetricsLog(str(root / METRICS_LOG))

    def report(self, metrics, checkpoint) -> None:
        super().report(metrics, checkpoint)
        self.log.after_report(None, [metrics], checkpoint)


def _train_phase1(directory: Path, trial, prepared) -> tuple[str, dict]:
    """Train `trial` in this process with the phase-1 loop Ray Train runs, on its own mixture
    schedule packed as the Ray Data stream packs it; (last checkpoint, last report)."""
    schedule, offsets = trial_schedule(trial, prepared)
    packed = [pack_window({"rows": [window["rows"]], "source_index": [window["source_index"]]},
                          pieces_path=str(prepared.pieces_path), sequence_length=trial.data.sequence_length,
                          pad_id=prepared.tokenizer.pad_id, cls_id=prepared.tokenizer.cls_id)
              for window in schedule_windows(schedule, offsets)]
    rows = {key: np.concatenate([part[key] for part in packed]) for key in packed[0]}
    session = _LoggedSession(rows, directory)
    loop = Phase1Loop(phase1_worker_config(trial, prepared, schedule), rank=0, world=1, device=torch.device("cpu"))
    run_loop(loop, session)
    return str(session.checkpoints[-1]), session.reports[-1]


def _write_run(root: Path, study: Study, prepared, *, parent: str | None = None) -> Path:
    """A finished run directory as `embedlab sweep` writes it (no Ray Tune): phase-1 trials
    trained in this process, phase-2 trials as untrained checkpoints, all scored by the real
    evaluator."""
    run_dir = root / f"{study.name}-20260101-000000"
    (run_dir / "trials").mkdir(parents=True)
    task = load_task(resolve_task("python-docstrings", prepared.directory))
    retention = prepared.directory / "retention"
    record = {"study": study.to_dict(), "arm_order": list(study.arms), "study_hash": study.hash,
              "started": f"2026-01-01T00:0{study.phase}:00+0000", "parent": parent, "final_eval_overlap": []}
    if parent:
        record["parent_scores"] = _score_columns(evaluate_checkpoint(Path(parent), task, "dev",
                                                                     retention_dir=retention), "dev")
    (run_dir / "study.json").write_text(json.dumps(record))
    (run_dir / "prepared.json").write_text(json.dumps(
        {arm: {**prepared.record, "directory": str(prepared.directory)} for arm in study.arms}))
    for index, (arm, config) in enumerate(study.arms.items()):
        for seed in SEEDS:
            trial_id = f"{index:05d}_{seed}"
            name = f"final-{arm}-seed{seed}-{trial_id}"
            head = study.phase == 1 or config.contrastive.mlm_weight > 0
            if study.phase == 1:
                checkpoint, train = _train_phase1(run_dir / "train" / name, study.trial_config(arm, seed), prepared)
            else:
                checkpoint = _checkpoint(run_dir / "train" / name / "checkpoint_0", config, prepared.tokenizer,
                                         100 * study.phase + 10 * index + seed, phase=study.phase, head=head)
                tokens = 5_000 + 700 * index
                train = {"budget/tokens": tokens, "budget/pairs": study.budget.pairs, "budget/flops": 6.0 * 1e5 * tokens,
                         "compute/wall_seconds": 3.0 + index + 0.5 * seed, "train/loss": 6.9 - 0.1 * seed}
            scores = evaluate_checkpoint(Path(checkpoint), task, "dev", retention_dir=retention)
            row = {"study": study.name, "trial_id": trial_id, "arm": arm, "seed": seed, "stage": "final",
                   "status": "finished", "phase": study.phase, "factor": study.factor, "parent": parent,
                   **{k: v for k, v in train.items() if k.startswith(("budget/", "compute/", "train/loss"))},
                   "checkpoint": checkpoint, "checkpoint_hash": scores["checkpoint_hash"],
                   **_score_columns(scores, "dev")}
            row.update(_shares(study, prepared, config, train))
            (run_dir / "trials" / f"{trial_id}.json").write_text(json.dumps(row))
            if head and study.phase > 1:
                log = [{"budget/tokens": step * 1000, "train/mlm_loss": 7.0 - 0.05 * step} for step in range(1, 6)]
                (run_dir / "train" / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    return run_dir


def _shares(study: Study, prepared, config, train: dict) -> dict[str, float]:
    """Intended shares and observed ones: the trainer's (phase 1), or a little off (phase 2)."""
    if study.phase == 1:
        intended = prepared.record["mixture"]["shares"]
        return {**{f"data/intended_share/{s}": v for s, v in intended.items()},
                **{k: v for k, v in train.items() if k.startswith("data/observed_share/")}}
    intended = dict(config.contrastive.pairs)
    return {**{f"data/intended_share/{s}": v for s, v in intended.items()},
            **{f"data/observed_pair_share/{s}": v for s, v in intended.items()},
            **{f"data/observed_token_share/{s}": 1 - v for s, v in intended.items()}}


@pytest.fixture(scope="module")
def tour(tmp_path_factory, prepared) -> list[Path]:
    """A phase-1 masking study (single head vs dual heads) promoted into a phase-2 study
    (contrastive only vs joint MLM) that starts from its winner."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: a second thread only busy-waits on a shared 2-core box
    try:
        return _tour(tmp_path_factory.mktemp("runs"), prepared)
    finally:
        torch.set_num_threads(threads)


def _tour(root: Path, prepared) -> list[Path]:
    base = tiny_trial()
    dual = dataclasses.replace(base, masking=MaskingConfig(mixed_ratios=((0.05, 4), (0.5, 1)), head_per_ratio=True))
    phase1 = Study(name="dual-heads", factor="masking", arms={"single-15": base, "dual-heads": dual}, seeds=SEEDS,
                   budget=dataclasses.replace(DEFAULT_BUDGET, tokens=6_000), description="Do dual MLM heads help?")
    first = _write_run(root, phase1, prepared)
    rows = [json.loads(p.read_text()) for p in (first / "trials").glob("*.json")]
    winner = max(rows, key=lambda r: r["dev/ndcg@10"])
    (first / "promotion.json").write_text(json.dumps({"winner": winner, "checkpoint": winner["checkpoint"]}))
    contrastive = dataclasses.replace(base, phase=2, parent=winner["checkpoint"],
                                      contrastive=ContrastiveConfig(pairs=PAIR_FAMILIES))
    joint = dataclasses.replace(contrastive, contrastive=dataclasses.replace(contrastive.contrastive, mlm_weight=0.3))
    phase2 = Study(name="joint-vs-contrastive", factor="contrastive.mlm_weight", seeds=SEEDS,
                   budget=Budget(tokens=6_000, pairs=64), arms={"contrastive-only": contrastive, "joint-mlm-30": joint})
    return [first, _write_run(root, phase2, prepared, parent=winner["checkpoint"])]


@pytest.fixture(scope="module")
def report(tour, tmp_path_factory) -> Path:
    return write_report(tour, tmp_path_factory.mktemp("report") / "report.html", progress=lambda message: None)


class _Page(HTMLParser):
    """Figures (id -> caption part texts, image attributes) and every src/href of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[str, dict] = {}
        self.links: list[str] = []
        self.status: dict[str, str] = {}
        self._figure = self._part = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.links += [attrs[k] for k in ("src", "href") if k in attrs]
        if tag == "figure":
            self._figure = attrs.get("id", "")
            self.figures[self._figure] = {"class": attrs.get("class", ""), "parts": {}, "images": []}
        elif tag == "img" and self._figure is not None:
            self.figures[self._figure]["images"].append(attrs)
        elif tag == "p" and self._figure is not None and attrs.get("class", "").startswith("caption-"):
            self._part = attrs["class"].removeprefix("caption-")
            self.figures[self._figure]["parts"][self._part] = ""
        elif attrs.get("id") == "render-status":
            self.status = attrs

    def handle_endtag(self, tag):
        if tag == "figure":
            self._figure = None
        elif tag == "p":
            self._part = None

    def handle_data(self, data):
        if self._figure is not None and self._part is not None:
            self.figures[self._figure]["parts"][self._part] += data


def _parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    return page


def test_report_is_self_contained_with_every_figure_and_four_part_captions(report):
    """Every required figure is drawn (none replaced by a 'not drawn' note), inline, with units,
    an observed number, a mechanism and a limitation; nothing on the page points elsewhere."""
    page = _parse(report.read_text())
    assert [key.removeprefix("figure-") for key in page.figures] == list(FIGURES)
    assert all(link.startswith(("data:image/png;base64,", "#")) for link in page.links), page.links
    assert not re.search(r"<link|@import|url\(", report.read_text())
    for key, figure in page.figures.items():
        assert figure["class"] == "report-figure", key
        assert len(figure["images"]) == 1, key
        assert list(figure["parts"]) == list(CAPTION_PARTS), key
        assert all(len(text.split()) >= 8 for text in figure["parts"].values()), (key, figure["parts"])
        assert re.search(r"\d", figure["parts"]["observed"]), (key, figure["parts"]["observed"])


def test_figure_numbers_agree_with_their_sources(report):
    """The similarity figure re-encodes the dev task itself and its means equal the evaluator's
    trial rows; the corruption figure's shares (over 100k positions) are each arm's ratio and
    the 80/10/10 replacement split."""
    figures = _parse(report.read_text()).figures
    observed = figures["figure-similarity"]["parts"]["observed"]
    drift = float(re.search(r"match the trial rows within ([0-9.e+-]+)", observed).group(1).rstrip("."))
    assert drift < 1e-6
    shares = re.findall(r"@ (\d+)%: ([\d.]+)% of ([\d,]+) eligible tokens selected, of which (\d+)% \[MASK\] / "
                        r"(\d+)% random / (\d+)% kept", figures["figure-masks"]["parts"]["observed"])
    assert [int(ratio) for ratio, *_ in shares] == [15, 5, 50]
    for ratio, selected, eligible, masked, random, kept in shares:
        assert int(eligible.replace(",", "")) > 90_000
        assert abs(float(selected) - int(ratio)) < 1.0
        assert max(abs(int(masked) - 80), abs(int(random) - 10), abs(int(kept) - 10)) <= 2


def test_a_run_whose_prepared_data_is_gone_still_gets_the_rest_of_its_report(tour, tmp_path):
    """Figures that need the prepared data say why they are missing; the rest still draw (the
    per-source curves come from the training logs, without their held-out markers)."""
    moved = tmp_path / tour[0].name
    shutil.copytree(tour[0], moved, ignore=shutil.ignore_patterns("train"))
    prepared = json.loads((moved / "prepared.json").read_text())
    (moved / "prepared.json").write_text(json.dumps({arm: {**record, "directory": str(tmp_path / "gone")}
                                                     for arm, record in prepared.items()}))
    page = _parse(write_report([moved], tmp_path / "report.html", progress=lambda message: None).read_text())
    drawn = {key.removeprefix("figure-") for key, figure in page.figures.items() if figure["images"]}
    assert drawn == {"mixture", "mlm", "phases", "runtime"}
    missing = [figure for figure in page.figures.values() if figure["class"] == "missing"]
    assert len(missing) == len(FIGURES) - len(drawn) == 4
    assert "Not measured: no checkpoint could be measured" in page.figures["figure-mlm"]["parts"]["limitation"]


def _logged(path: Path, source: str) -> dict[int, tuple[float, float]]:
    """step -> (budget/tokens, train/loss/source/<source>) straight from a metrics.jsonl, finite values only."""
    points = {}
    for line in path.read_text().splitlines():
        report = json.loads(line)
        value = report.get(f"train/loss/source/{source}")
        if value is not None and np.isfinite(value):
            points[report["train/step"]] = (report["budget/tokens"], value)
    return points


def test_per_source_curves_are_the_logged_training_losses(tour, report):
    """Each arm's per-source curve is the mean over seeds of the loss its metrics.jsonl files
    hold at each step (tokens too); the logged per-source losses, weighted by their selected
    counts, give the pooled train/loss; the caption quotes the curves and names the arms that
    log no per-source loss."""
    run = read_run(tour[0])
    curves, unlogged = source_curves(run)
    sources = set(json.loads((tour[0] / "prepared.json").read_text())["single-15"]["mixture"]["shares"])
    assert {c.source for c in curves if c.arm == "single-15"} == sources
    assert {c.arm for c in curves} | set(unlogged) == set(run.arms)
    for curve in curves:
        logs = {seed: next((tour[0] / "train").glob(f"final-{curve.arm}-seed{seed}-*/{METRICS_LOG}"))
                for seed in SEEDS}
        points = {seed: _logged(path, curve.source) for seed, path in logs.items()}
        steps = sorted(set(points[SEEDS[0]]).intersection(*map(set, points.values())))
        assert curve.seeds == SEEDS and list(curve.steps) == steps and len(steps) >= 2
        np.testing.assert_allclose(curve.loss, [np.mean([points[s][step][1] for s in SEEDS]) for step in steps])
        np.testing.assert_allclose(curve.tokens, [np.mean([points[s][step][0] for s in SEEDS]) for step in steps])
        for seed in SEEDS:
            np.testing.assert_allclose(curve.per_seed[seed][1], [points[seed][k][1] for k in sorted(points[seed])])
    for path in (tour[0] / "train").glob(f"final-single-15-*/{METRICS_LOG}"):
        for line in path.read_text().splitlines():
            logged = json.loads(line)
            parts = [(logged[f"train/loss/source/{s}"], logged[f"train/selected/source/{s}"]) for s in sources]
            weighted = sum(loss * count for loss, count in parts if count) / sum(count for _, count in parts)
            assert weighted == pytest.approx(logged["train/loss"], rel=1e-6)  # NLL recomputed in fp32
    caption = _parse(report.read_text()).figures["figure-mlm"]["parts"]
    for arm in {curve.arm for curve in curves}:
        mine = [curve for curve in curves if curve.arm == arm]
        quoted = re.search(rf"{re.escape(arm)}, {len(mine)} sources: mean ([\d.]+) -> ([\d.]+) nats.*?ending lowest "
                           r"on (\S+) \(([\d.]+)\) and highest on (\S+) \(([\d.]+)\)", caption["observed"])
        assert float(quoted.group(1)) == round(float(np.mean([c.loss[0] for c in mine])), 2)
        assert float(quoted.group(2)) == round(float(np.mean([c.loss[-1] for c in mine])), 2)
        low, high = min(mine, key=lambda c: c.loss[-1]), max(mine, key=lambda c: c.loss[-1])
        assert quoted.group(3, 5) == (low.source, high.source)
        assert (float(quoted.group(4)), float(quoted.group(6))) == (round(low.loss[-1], 2), round(high.loss[-1], 2))
    assert re.search(r"held-out [\d.]+-[\d.]+ nats \(standard errors up to [\d.]+\)", caption["observed"])
    phase2 = read_run(tour[1])
    assert source_curves(phase2) == ([], phase2.arms)  # contrastive phase: MLM loss pooled, if logged at all
    assert f"{phase2.label} / {', '.join(phase2.arms)} (a contrastive phase" in caption["limitation"]
    for arm in unlogged:
        assert re.search(rf"{re.escape(run.label)} / [^(]*\b{re.escape(arm)}\b", caption["limitation"])


def test_seeds_that_trained_the_same_checkpoint_are_flagged(tour, tmp_path):
    """An arm whose seeds produced one checkpoint gets a warning beside its (zero-width) interval."""
    copy = tmp_path / tour[1].name
    shutil.copytree(tour[1], copy, ignore=shutil.ignore_patterns("train"))
    rows = {p: json.loads(p.read_text()) for p in (copy / "trials").glob("*.json")}
    first = next(r for r in rows.values() if r["arm"] == "contrastive-only" and r["seed"] == 0)
    for path, row in rows.items():
        if row["arm"] == "contrastive-only":
            path.write_text(json.dumps({**row, "checkpoint_hash": first["checkpoint_hash"]}))
    tables = html_page._trial_tables(read_run(copy))
    assert "arm contrastive-only: seeds 0, 1 produced the same checkpoint" in tables
    assert tables.count('class="warning"') == 1
    assert "same checkpoint" not in html_page._trial_tables(read_run(tour[1]))


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def _browser(report: Path, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    chromium = _chromium()
    if chromium is None:
        pytest.skip("headless Chromium not found: install the Debian package `chromium` (apt-get install chromium)")
    command = [chromium, "--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
               "--hide-scrollbars", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
               "--virtual-time-budget=10000", *flags, report.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=True)


def test_every_figure_renders_in_headless_chromium(report, tmp_path):
    """After load, the page's own script finds every figure image decoded (natural size > 0)."""
    dom = _browser(report, tmp_path, "--dump-dom").stdout
    page = _parse(dom)
    assert page.status.get("data-figures") == str(len(FIGURES)), page.status
    assert page.status.get("data-rendered") == str(len(FIGURES)), page.status
    for key, figure in page.figures.items():
        image = figure["images"][0]
        assert image.get("data-rendered") == "true", key
        width, height = map(int, image["data-natural-size"].split("x"))
        assert (width, height) == (int(image["width"]), int(image["height"])) and width > 500, key


def test_an_image_that_does_not_decode_is_caught(report, tmp_path):
    """The render check can fail: a figure whose PNG is corrupt is marked and counted as not rendered."""
    broken = tmp_path / "broken.html"
    broken.write_text(re.sub(r"base64,[^\"]{64}", "base64,notapng", report.read_text(), count=1))
    page = _parse(_browser(broken, tmp_path, "--dump-dom").stdout)
    assert page.status.get("data-rendered") == str(len(FIGURES) - 1), page.status
    assert page.figures["figure-mixture"]["images"][0].get("data-rendered") == "false"


def test_screenshot_is_a_non_blank_page_of_the_window_size(report, tmp_path):
    """Chromium's screenshot of the page is the window's size and shows figures, not a blank page."""
    screenshot = tmp_path / "report.png"
    _browser(report, tmp_path, f"--screenshot={screenshot}", f"--window-size={WINDOW[0]},{WINDOW[1]}")
    assert _png_size(screenshot.read_bytes()) == WINDOW
    with Image.open(screenshot) as image:
        pixels = np.asarray(image.convert("RGB"))
    inked = (pixels < 200).any(axis=2)  # anything darker than a light background
    assert inked.mean() > 0.02
    rows_with_ink = inked.any(axis=1)
    assert rows_with_ink[: WINDOW[1] // 2].mean() > 0.3  # content fills the page, not one strip
    colours = np.unique(pixels[::7, ::7].reshape(-1, 3), axis=0)
    assert len(colours) > 50  # plots, not text alone
