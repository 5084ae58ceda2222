"""Data: a prepared data directory, built once per data config: corpus, frozen tokenizer, pieces,
tasks, retention panel, phase-1 audits and the data card."""
