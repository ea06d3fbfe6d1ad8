"""``cp.check``: what cockpit can compute for a model, and one real step to prove it."""
