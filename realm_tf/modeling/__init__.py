"""REALM networks: `layers` (blocks), `networks` (encoders without heads), `models` (heads
and task models), `losses`, and `factory` (building them from an ExperimentConfig)."""
