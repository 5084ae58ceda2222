"""Phase 3: InfoNCE alone vs InfoNCE plus embedding distillation from all-MiniLM-L6-v2, at
equal measured training FLOPs, both on in-batch negatives.

The embedding arm gives each scheduled pair one unlabelled training-split document, cut to
the pair length, and regresses the student's embedding of it onto the teacher's (projected
from 384 to the student's width by a fixed orthonormal map: `embedlab.teacher.embeddings`)
at weight 0.5 beside the InfoNCE. Unlike KL and MarginMSE it reads no labels over the
target task's candidates: it carries the teacher's geometry of plain text, the knowledge a
student trained from scratch on a small corpus lacks. A third text a pair costs FLOPs, so
at the equal budget this arm reads fewer pairs.

Since it scores no candidates, it needs no mined negatives, and both arms train on in-batch
negatives alone: the control is then the in-batch arm of `hard_negatives.py` (the cpu
tour's phase-3 winner), and the distilled arm is compared with the recipe a tour releases,
not with the mined one that `distillation.py` and `margin_mse.py` start from. The control
names the teacher with no weight, so it trains on nothing the teacher made.

Teacher-cost policy: as teacher labels, the teacher's encoding of the documents is reported
beside the training budget, not inside it (`compute/teacher_flops`), once per seed's set.

Run:  embedlab sweep ablations/embedding_distillation.py --parent PHASE2_CHECKPOINT_DIR [--profile cpu]
"""

from embedlab import Study, recipes

TEACHER = "all-MiniLM-L6-v2"


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase3_baseline(profile)
    base = recipes.derive(base, {"contrastive.distillation.teacher": TEACHER, "contrastive.negatives.count": 0})
    control = recipes.derive(base, {"contrastive.distillation.embedding_mse_weight": 0.0})
    return Study(
        name="embedding-distillation",
        factor="contrastive.distillation.embedding_mse_weight",
        arms={
            "infonce": control,
            "infonce-embedding": recipes.derive(base, {"contrastive.distillation.embedding_mse_weight": 0.5}),
        },
        seeds=p.seeds,
        budget=recipes.budget_for(p, phase=3, control=control),
        metric="dev/ndcg@10",
        profile=p.name,
        disclosed_overlap=p.disclosed_overlap,  # what the audit finds in this profile's pairs, if anything
        description="Does regressing MiniLM's embeddings of unlabelled training documents beat InfoNCE alone?",
    )
