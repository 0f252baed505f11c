"""Training: the generic driver (strategies, optimizers, checkpoints, preemption, orbit
trainers). Tasks never import it; it drives any registered task."""
