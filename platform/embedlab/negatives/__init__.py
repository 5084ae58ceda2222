"""Data: phase 3's hard negatives: the parent encoder's search of the pinned training corpus,
stored once, the rules that select a trial's negatives from it, given negatives, the
false-negative sample, and how a pair's negatives reach training."""
