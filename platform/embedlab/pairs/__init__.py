"""Data: positive pairs for phases 2-3: the built-in builders, a user's own pair sources, and the
frozen pairs table a trial trains on."""
