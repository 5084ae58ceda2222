"""Phase 3: InfoNCE alone vs InfoNCE plus MarginMSE against all-MiniLM-L6-v2 vs MarginMSE
alone, at equal measured training FLOPs.

MarginMSE regresses the student's positive-minus-negative cosine margin on the teacher's,
for every mined negative of every query that both scores exist for. Teacher and student
margins are cosine differences on one [-2, 2] scale. The teacher's labels, their provenance
and their cost are handled as in `distillation.py`: computed once before training, reported
beside the budget, never presented as human judgments; the control names the teacher with
no weight.

Run:  embedlab sweep ablations/margin_mse.py --parent PHASE2_CHECKPOINT_DIR [--profile cpu]
"""

from embedlab import Study, recipes

TEACHER = "all-MiniLM-L6-v2"


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase3_baseline(profile)
    base = recipes.derive(base, {"contrastive.distillation.teacher": TEACHER})
    control = recipes.derive(base, {"contrastive.distillation.margin_mse_weight": 0.0})
    return Study(
        name="margin-mse",
        factor="contrastive.distillation.margin_mse_weight",
        arms={
            "infonce": control,
            "infonce-margin": recipes.derive(base, {"contrastive.distillation.margin_mse_weight": 0.5}),
            "margin-only": recipes.derive(base, {"contrastive.distillation.margin_mse_weight": 1.0}),
        },
        seeds=p.seeds,
        budget=recipes.budget_for(p, phase=3, control=control),
        metric="dev/ndcg@10",
        profile=p.name,
        disclosed_overlap=p.disclosed_overlap,  # what the audit finds in this profile's pairs, if anything
        description="Does regressing MiniLM's score margins beat InfoNCE alone?",
    )
