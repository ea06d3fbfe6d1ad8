"""``python -m cockpit_core`` is the ``cockpit`` command."""

from cockpit_core.cli.main import main

if __name__ == "__main__":  # importing this module (documentation tools) runs nothing
    raise SystemExit(main())
