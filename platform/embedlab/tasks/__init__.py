"""Data: retrieval tasks and their search: metrics (trec_eval's definitions), Faiss search, the
reference retrievers, the built-in, held-out and Hub tasks, the retention panel, and where a
trial's tasks live."""
