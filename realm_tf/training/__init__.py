"""Training: strategies, optimizers, snapshots for the index builder, orbit trainers."""
