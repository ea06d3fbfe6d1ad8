"""Example: a cockpit plugin (the largest per-sample gradient norm)."""

from cockpit_example.max_sample_grad_norm import MaxSampleGradNorm

__all__ = ["MaxSampleGradNorm"]
