"""Quantities of the global batch under ``torch.distributed``."""
