"""Data: documents and the frozen corpus: built-in, local and Hub sources, provenance, deduplication,
splits by group, and mixture sampling over sources."""
