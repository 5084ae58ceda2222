"""`embedlab tour --dry-run`: every stage's study plan, starting nothing; a stage that does not
load is named."""

import sys
from pathlib import Path

from embedlab.cli import main

ABLATIONS = Path(__file__).parent.parent / "ablations"


def test_tour_dry_run_prints_every_stage_and_starts_nothing(tmp_path, capsys):
    """Each stage's plan under the demo profile, later stages' parents named as the previous
    stage's promoted winner; no run directory is made and Ray is not started."""
    storage = tmp_path / "runs"
    ray_before = "ray" in sys.modules and sys.modules["ray"].is_initialized()  # the suite may hold one
    assert main(["tour", str(ABLATIONS / "recipe.py"), "--profile", "demo", "--dry-run",
                 "--storage", str(storage)]) == 0
    out = capsys.readouterr().out
    for number, (stage, phase) in enumerate((("dual-heads", 1), ("joint-vs-contrastive", 2),
                                             ("hard-negatives", 3)), start=1):
        assert f"== stage {number}/3" in out and f"study {stage} (" in out and f"profile demo, phase {phase}" in out
    assert "parent: the winner promoted from stage 1 (dual_heads.py)" in out
    assert "parent: the winner promoted from stage 2 (joint_vs_contrastive.py)" in out
    assert "more than 0.1 (absolute, metric points) below the parent's" in out
    assert not storage.exists()
    assert ("ray" in sys.modules and sys.modules["ray"].is_initialized()) == ray_before
    assert "ray: " not in out  # `connect` announces every cluster it starts or joins


def test_a_stage_that_fails_to_load_is_named(tmp_path, capsys):
    """A tour whose second stage's study file does not load: one error line naming the stage."""
    (tmp_path / "broken.py").write_text("def study(profile=None):\n    return Study(\n")
    tour = tmp_path / "tour.py"
    tour.write_text(
        "from embedlab import Stage, Tour\n"
        "def tour(profile='demo'):\n"
        f"    return Tour(name='t', profile=profile, stages=(Stage({str(ABLATIONS / 'dual_heads.py')!r}),\n"
        "                                                  Stage('broken.py', max_retention_drop=0.1)))\n"
    )
    assert main(["tour", str(tour), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tour}: stage 2/2 (broken.py): ") and "syntax error" in err
    assert err.count("\n") == 1
