"""Data: the training streams on Ray Data: phase 1's packed rows and phases 2-3's pair batches,
each worker reading exactly its share."""
