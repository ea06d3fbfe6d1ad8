"""Which TensorBoard tags a quantity's value becomes: cockpit's shared tag mapping.

The mapping lives in the core (:mod:`cockpit_core.log.scalars`), so the TensorBoard, W&B
and MLflow sinks name every value alike; this module re-exports it for the sink.
"""

from cockpit_core.log.scalars import Histogram, Scalar, TagMap, join

__all__ = ["Histogram", "Scalar", "TagMap", "join"]
