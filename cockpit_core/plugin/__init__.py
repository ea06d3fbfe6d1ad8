"""Plugins: discovery through entry points, the registry, and the listing cache."""
