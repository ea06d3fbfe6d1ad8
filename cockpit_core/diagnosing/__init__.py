"""Running diagnoses: on a log, and while training."""
