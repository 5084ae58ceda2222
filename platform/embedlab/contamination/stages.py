"""The training stages the contamination audit reads, by name.

    pretraining        training-split documents of the mixture's sources (phase 1)
    tokenizer-sample   the documents the tokenizer was trained on
    contrastive-pairs  query and positive texts of the phase 2-3 pairs built from the training split
                       by every built-in builder, and, given the data config, the train split of its
                       user pair sources (`embedlab.pairs.user`): every row's query and positive (a row
                       per positive) and given negatives
    mined-negatives    hard negatives of every mined set saved with the data (`mined/*/`)
    teacher-labels     every query and candidate a teacher scored, of every teacher-labels set
                       saved with the data (`teacher-labels/*/`, `embedlab.teacher.labels`),
                       and every document a teacher encoded for embedding distillation
                       (`teacher-embeddings/*/`, `embedlab.teacher.embeddings`)

Each stage's (item id, text) items are read where its data is made: the phase-1 stages by
`embedlab.prepared.audits`, a pairs table's by `embedlab.pairs.table`, a mined set's by
`embedlab.negatives.reading`, a teacher set's by `embedlab.teacher`; the sweep's gate reads them
all together (`embedlab.sweep.gate`).
"""

PAIRS_STAGE = "contrastive-pairs"
MINED_STAGE = "mined-negatives"
TEACHER_STAGE = "teacher-labels"
PHASE1_STAGES = ("pretraining", "tokenizer-sample")
ALL_STAGES = (*PHASE1_STAGES, PAIRS_STAGE, MINED_STAGE, TEACHER_STAGE)
