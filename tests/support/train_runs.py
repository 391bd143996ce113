"""``bno-hvd train`` runs that save their model, for the tests that compare N ranks with one
process on the same global batches (no evaluation, no progress line, no latency probe)."""

import torch


def train_args(path, log_dir, *flags, updates=20, optimizer="sgd", momentum=0, dtype="float64", lr=0.01, seed=7):
    """The arguments after ``bno-hvd`` of a quiet ``train`` that saves its model to ``path``; ``flags``
    (the strategy and anything else) come last."""
    run = ["train", "--updates", str(updates), "--optimizer", optimizer, "--momentum", str(momentum)]
    run += ["--dtype", dtype, "--lr", str(lr), "--seed", str(seed)]
    run += ["--no-eval", "--no-progress", "--latency-interval", "0"]
    return [*run, "--save-model", str(path), "--log-dir", str(log_dir), *flags]


def saved_model(path):
    """The state dict a run saved (on the CPU)."""
    return torch.load(path, map_location="cpu", weights_only=True)
