"""Phase 3: InfoNCE alone vs InfoNCE plus KL distillation from all-MiniLM-L6-v2 vs KL alone,
at equal measured training FLOPs.

The teacher scores each scheduled query against its own positive and mined negatives once,
before training (teacher labels: a model's judgments, not human ones, stored with the
prepared data and versioned by the teacher, its prefixes, the pairs and the negatives). The
KL term pulls the student's softmax over those candidates (student temperature 0.05) toward
the teacher's (teacher temperature 0.05). Every arm names the teacher; the control gives it
no weight, so it trains on nothing the teacher made.

Teacher-cost policy: as mining, the teacher's encoding is reported beside the training
budget, not inside it (`compute/teacher_flops`, `compute/teacher_seconds`), once per label
set: each seed schedules its own pairs, so each seed's set is scored (and charged) on its own. all-MiniLM-L6-v2's own training data (over a billion pairs, code search
among them) cannot be audited here; the audit covers every text it scored.

Run:  embedlab sweep ablations/distillation.py --parent PHASE2_CHECKPOINT_DIR [--profile cpu]
"""

from embedlab import Study, recipes

TEACHER = "all-MiniLM-L6-v2"


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase3_baseline(profile)
    base = recipes.derive(base, {"contrastive.distillation.teacher": TEACHER})
    control = recipes.derive(base, {"contrastive.distillation.kl_weight": 0.0})
    return Study(
        name="distillation",
        factor="contrastive.distillation.kl_weight",
        arms={
            "infonce": control,
            "infonce-kl": recipes.derive(base, {"contrastive.distillation.kl_weight": 0.5}),
            "kl-only": recipes.derive(base, {"contrastive.distillation.kl_weight": 1.0}),
        },
        seeds=p.seeds,
        budget=recipes.budget_for(p, phase=3, control=control),
        metric="dev/ndcg@10",
        profile=p.name,
        disclosed_overlap=p.disclosed_overlap,  # what the audit finds in this profile's pairs, if anything
        description="Does distilling MiniLM's scores over each query's candidates beat InfoNCE alone?",
    )
