"""Data: a frozen teacher's work for phase 3: its scores of (query, candidate) rows and its
embeddings of training-split documents, made before a trial trains on them."""
