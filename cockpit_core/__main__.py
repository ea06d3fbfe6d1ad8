"""``python -m cockpit_core`` is the ``cockpit`` command."""

from cockpit_core.cli import main

raise SystemExit(main())
