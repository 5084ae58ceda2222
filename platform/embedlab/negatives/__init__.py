"""Data: phase 3's hard negatives: mining from the pinned training corpus with the parent encoder,
given negatives, and how a pair's negatives reach training."""
