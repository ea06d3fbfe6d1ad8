"""The provider kit: :func:`check_provider` and the checks it runs (``docs/providers.md``)."""
