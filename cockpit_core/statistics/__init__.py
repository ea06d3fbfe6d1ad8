"""Where statistics come from: kinds, typed per-sample gradients, providers, routing.

The core's open statistics layer (``docs/providers.md``): a statistic *kind* declares how its
values combine; a *provider* delivers kinds for the parameters it supports; the *router*
picks, per parameter, the cheapest provider that can deliver each requested kind.
"""
