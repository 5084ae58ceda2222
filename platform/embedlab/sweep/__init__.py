"""Orchestration: studies on Ray Tune + Optuna, one trial per (arm, seed); the cluster, the gate
before training, promotion and tours."""
