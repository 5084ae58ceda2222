"""Train and evaluate: the loop every phase runs on Ray Train, its steps, budget, precision and
the `TorchTrainer` launch."""
