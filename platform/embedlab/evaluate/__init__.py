"""Train and evaluate: scoring a checkpoint on its tasks and panel, in this process or in the
shared Faiss-backed evaluation actor."""
