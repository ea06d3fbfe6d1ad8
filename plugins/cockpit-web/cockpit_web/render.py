"""The ``.html`` renderer: the web view of runs as one self-contained file.

``cockpit plot RUN... -o dash.html`` and ``cp.plot("dash.html")`` reach it through the
``register_renderers`` hook (:mod:`cockpit_web.plugin`); it writes the page of
:func:`~cockpit_web.page.write_page`.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cockpit_core.engine.cockpit import Cockpit
from cockpit_core.errors import escape_controls
from cockpit_web.feed import Feed
from cockpit_web.page import standalone_page, write_page

Source = str | os.PathLike[str] | Cockpit
"""One run: a log or run folder (see :func:`~cockpit_web.feed.find_logs`), or a Cockpit."""


def render_html(
    source: Source | Sequence[Source],
    path: str | os.PathLike[str] | None = None,
    title: str | None = None,
    labels: Sequence[str] | None = None,
    diagnose: bool = True,
    **options: Any,
) -> Path | str:
    """Draw the web view of ``source`` into ``path``, an HTML file that needs no server.

    A run whose log has problems (records skipped, a damaged line) is drawn as far as it
    goes and named on standard error: ``warning: LABEL: PROBLEM``.

    Args:
        source: A run: a log, a run folder or a :class:`~cockpit_core.Cockpit` (what it
            tracked so far); or a list of runs, overlaid in a colour each.
        path: The file to write; ``None``: return the page's text instead.
        title: Page title (default: the runs' labels).
        labels: The runs' names, one per log (default: see
            :func:`~cockpit_web.feed.find_logs`; a Cockpit is ``run``, or ``run K`` among
            several runs).
        diagnose: Run the installed diagnoses over each log (default); ``False``: show only
            the findings recorded while training.
        **options: Options of other renderers (``rows``, ``dpi``): ignored.

    Returns:
        ``path``, or the page's text when ``path`` is ``None``.

    Raises:
        RunNotFoundError: A path is neither a log nor a run folder.
        ValueError: ``labels`` does not name every log.
        OSError: ``path`` cannot be written.

    """
    del options  # the matplotlib dashboard's; the page has no use for them
    sources = [source] if isinstance(source, str | os.PathLike | Cockpit) else list(source)
    with tempfile.TemporaryDirectory(prefix="cockpit-web-") as folder:
        logs = [_log(s, Path(folder), k, len(sources)) for k, s in enumerate(sources, 1)]
        cockpits = [s for s in sources if isinstance(s, Cockpit)]
        registry = cockpits[0].registry if cockpits else None  # its instruments' panels
        feed = Feed(logs, title=title, labels=labels, diagnose=diagnose, registry=registry)
        drawn: Path | str = standalone_page(feed) if path is None else write_page(feed, path)
    for run in feed.runs:
        if run.error:
            print(f"warning: {escape_controls(f'{run.label}: {run.error}')}", file=sys.stderr)
    return drawn


def _log(source: Source, folder: Path, number: int, count: int) -> str | os.PathLike[str]:
    """The log of one run; a Cockpit's is written into ``folder`` (its label: the folder)."""
    if not isinstance(source, Cockpit):
        return source
    run = folder / ("run" if count == 1 else f"run {number}")
    run.mkdir()
    return source.write(run / "output.json")
