"""What ``cockpit plugins`` lists, cached between runs so that listing needs no plugin import.

Listing the plugins means loading them, and loading a plugin imports torch (about a second).
:func:`plugin_listing` therefore stores the listing of a full load in a file per environment
(named after a hash of ``sys.prefix``) in the user cache folder (``$XDG_CACHE_HOME/cockpit``,
default ``~/.cache/cockpit``), which keeps the :data:`MAX_ENTRIES` newest listings, and serves
one while the *fingerprint* of everything that could change it is unchanged:

- the Python executable, version, ``sys.prefix``, ``sys.path`` and ``-W`` options;
- the cockpit-core version and the (name, version) of every installed distribution, so any
  ``pip install`` or ``pip uninstall`` invalidates the cache;
- every entry point of group ``cockpit`` (name, value, distribution);
- ``COCKPIT_PLUGINS_DIR`` and the ``*.py`` files of its folders (path, mtime, size);
- the files (path, mtime, size) of the top-level package of each entry point and of
  ``cockpit_core`` itself, found with :func:`importlib.util.find_spec` (which runs no
  package; editable installs resolve through their finder).

Computing it imports neither torch nor any plugin. A fingerprint that cannot be computed, a
cache file that cannot be read or parsed, an entry of the wrong shape (a key missing, a value
of the wrong type), or a cache folder that cannot be written means a full load, silently
(and the entry is rewritten). A listing whose files changed in the last :data:`RACY_SECONDS` is not
stored: a later edit within the file system's timestamp granularity would go unnoticed.
Not covered: modules outside the plugin packages that a plugin imports from a source folder
(an edit there needs ``--refresh``; installing a new version of them changes the fingerprint),
and output a plugin prints while it is imported (it is not replayed; warnings are).

``cockpit plugins --refresh`` loads the plugins and rewrites the cache;
``COCKPIT_NO_CACHE=1`` neither reads nor writes it. Everything else that needs plugins
(:class:`~cockpit_core.Cockpit`, ``cockpit quantities``, ``check``, ...) loads them for real.
Only the standard library is imported at module level.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple

NO_CACHE_VARIABLE = "COCKPIT_NO_CACHE"
"""Environment variable: set (and not ``0``), ``cockpit plugins`` neither reads nor writes its cache."""

PLUGINS_DIR_VARIABLE = "COCKPIT_PLUGINS_DIR"
"""Same as :data:`cockpit_core.plugin.discovery.PLUGINS_DIR_VARIABLE` (that module imports pluggy)."""

GROUP = "cockpit"
"""The entry-point group of plugins (:data:`cockpit_core.hookspecs.PROJECT_NAME`)."""

FORMAT = 1
"""Version of the cache file's layout; a file of another version is ignored."""

MAX_ENTRIES = 4
"""How many listings (of different fingerprints) the cache file of an environment keeps."""

RACY_SECONDS = 2.0
"""A listing is not stored while a fingerprinted file is younger than this."""

CORE_PACKAGE = Path(__file__).resolve().parents[1]
"""The folder of ``cockpit_core``, whose files are part of the fingerprint."""


class Listing(NamedTuple):
    """What ``cockpit plugins`` prints, as plain data (what the cache file stores).

    Attributes:
        rows: One dict per plugin, in load order: what ``cockpit plugins --json`` prints.
        conflicts: ``[name, message]`` of every name registered by two plugins.
        extension_errors: Messages of plugins whose panels, sinks or diagnoses were skipped.
        warnings: The warnings the load emitted, formatted as Python prints them.
        cached_at: When the cache was written (seconds since the epoch); ``None`` for a
            listing that was just loaded.

    """

    rows: list[dict[str, Any]]
    conflicts: list[list[str]]
    extension_errors: list[str]
    warnings: list[str]
    cached_at: float | None = None


class Fingerprint(NamedTuple):
    """A digest of the fingerprint inputs, and whether they are old enough to cache."""

    digest: str
    settled: bool


def plugin_listing(refresh: bool = False) -> Listing:
    """The listing of the installed plugins, from the cache if it is still valid.

    On a cache hit the warnings of the original load are written to standard error again, so
    the output is that of a full load. Otherwise the plugins are loaded (their warnings are
    shown as they would be) and the listing is stored for the next call.

    Args:
        refresh: Load the plugins even if the cache is valid (and rewrite it).

    Returns:
        The listing; ``cached_at`` tells whether it came from the cache.

    """
    if _disabled():
        return load_listing()
    current = fingerprint()  # before the load: an edit during it invalidates the cache
    path = cache_path()
    if not refresh and current is not None and path is not None:
        cached = read_cache(path, current.digest)
        if cached is not None:
            sys.stderr.write("".join(cached.warnings))
            return cached
    listing = load_listing()
    if current is not None and current.settled and path is not None:
        write_cache(path, current.digest, listing)
    return listing


def load_listing() -> Listing:
    """Load every plugin (the default registry) and collect what ``cockpit plugins`` shows."""
    from cockpit_core.plugin.registry import default_registry

    with warnings.catch_warnings(record=True) as caught:
        registry = default_registry()
    for w in caught:  # shown as usual, and kept to be shown again from the cache
        warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)
    conflicts = [[name, str(err)] for name, err in registry.conflicts.items()]
    extension_errors = getattr(registry, "extension_errors", {})
    rows = [
        {
            "name": p.name,
            "distribution": p.distribution,
            "version": p.version,
            "module": p.module,
            "ok": p.ok,
            "error": p.error,
            "hooks": p.hooks,
            **{key: p.registered.get(key, []) for key in registry.sort_keys},
            "extension_error": extension_errors.get(p.name),
            "conflicts": [m for _, m in conflicts if f"'{p.distribution}'" in m],
        }
        for p in registry.plugins
    ]
    formatted = [
        warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught
    ]
    return Listing(rows, conflicts, list(extension_errors.values()), formatted)


# -- the fingerprint ------------------------------------------------------------------------


def fingerprint() -> Fingerprint | None:
    """The :class:`Fingerprint` of the environment, or ``None`` if any part of it fails."""
    try:
        inputs = fingerprint_inputs()
    except Exception:  # whatever goes wrong here only costs the cache
        return None
    newest = max((entry[1] for entry in inputs["files"]), default=0)
    settled = newest < time.time_ns() - int(RACY_SECONDS * 1e9)
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return Fingerprint(hashlib.sha256(text.encode()).hexdigest(), settled)


def fingerprint_inputs() -> dict[str, Any]:
    """Everything the listing depends on, as JSON-able data (see the module docstring).

    ``files`` holds ``[path, mtime_ns, size]`` of every file of the plugin packages, of
    ``cockpit_core`` and of the local plugin folders; a name that cannot be found is recorded
    as missing. Imports no plugin.

    Raises:
        Exception: Whatever fails; the caller then does without the cache.

    """
    from importlib import metadata
    from importlib.util import find_spec

    entry_points = []
    packages = set()
    for ep in metadata.entry_points(group=GROUP):
        dist = ep.dist.metadata["Name"] if ep.dist is not None else None
        entry_points.append([ep.name, ep.value, dist])
        packages.add(ep.value.split(":")[0].split(".")[0].strip())
    files: list[list[Any]] = []
    missing = []
    _add_tree(CORE_PACKAGE, files)
    for name in sorted(packages):
        spec = find_spec(name)  # a top-level name: finds it without running it
        if spec is None:
            missing.append(name)
        elif spec.submodule_search_locations:
            for location in spec.submodule_search_locations:
                _add_tree(Path(location), files)
        elif spec.origin and os.path.isfile(spec.origin):
            _add_file(Path(spec.origin), files)
        else:
            missing.append(f"{name}: {spec.origin}")
    folders = []
    dirs_value = os.environ.get(PLUGINS_DIR_VARIABLE)
    for entry in (dirs_value or "").split(os.pathsep):
        if entry.strip():
            folder = Path(entry).absolute()
            folders.append([str(folder), folder.is_dir()])
            if folder.is_dir():
                for path in sorted(folder.glob("*.py")):
                    _add_file(path, files)
    return {
        "format": FORMAT,
        "python": [sys.executable, sys.version, sys.prefix, list(sys.warnoptions)],
        "sys_path": [os.path.abspath(entry or os.curdir) for entry in sys.path],
        "core": _core_version(metadata),
        "distributions": sorted(_distributions(metadata)),
        "entry_points": sorted(entry_points, key=lambda e: [str(part) for part in e]),
        "plugins_dir": [dirs_value, folders],
        "missing": sorted(missing),
        "files": sorted(files),
    }


def _core_version(metadata: Any) -> str:
    try:
        return str(metadata.version("cockpit-core"))
    except metadata.PackageNotFoundError:  # a source tree: its files are fingerprinted
        return "0+unknown"


def _distributions(metadata: Any) -> list[list[str]]:
    """``[name, version]`` of every installed distribution.

    Reads the two header lines itself: parsing each file with the ``email`` package, as
    ``Distribution.metadata`` does, takes about ten times as long.
    """
    out = []
    for dist in metadata.distributions():
        text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
        fields: dict[str, str] = {}
        for line in text.splitlines():
            if not line.strip():  # the end of the headers
                break
            key, _, value = line.partition(":")
            if key in ("Name", "Version") and key not in fields:
                fields[key] = value.strip()
        if len(fields) < 2:  # unusual metadata: let the standard parser read it
            fields = {"Name": dist.metadata["Name"], "Version": dist.version}
        out.append([str(fields["Name"]), str(fields["Version"])])
    return out


def _add_tree(root: Path, files: list[list[Any]]) -> None:
    """Add every file under ``root`` (``__pycache__`` folders aside) to ``files``."""
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [name for name in subfolders if name != "__pycache__"]
        for name in names:
            _add_file(Path(folder, name), files)


def _add_file(path: Path, files: list[list[Any]]) -> None:
    stat = path.stat()
    files.append([str(path), stat.st_mtime_ns, stat.st_size])


# -- the cache file -------------------------------------------------------------------------


def _disabled() -> bool:
    return os.environ.get(NO_CACHE_VARIABLE, "").strip() not in ("", "0")


def cache_path() -> Path | None:
    """The cache file of this environment (keyed by ``sys.prefix``), or ``None`` if no home."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    try:
        folder = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    except RuntimeError:  # no home folder
        return None
    key = hashlib.sha256(sys.prefix.encode()).hexdigest()[:16]
    return folder / "cockpit" / f"plugins-{key}.json"


def _entries(path: Path) -> list[dict[str, Any]]:
    """The entries of the cache file, newest first; none if it is missing or corrupt."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data["format"] == FORMAT and isinstance(data["entries"], list):
            return [entry for entry in data["entries"] if isinstance(entry, dict)]
    except Exception:  # missing, unreadable or corrupt: as if there were none
        pass
    return []


_ROW_TEXT = ("name", "distribution", "version", "module")
"""Keys of a cached row whose value is a string."""

_ROW_OPTIONAL_TEXT = ("error", "extension_error")
"""Keys of a cached row whose value is a string or ``None``."""

_ROW_NAMES = ("hooks", "conflicts")
"""Keys of a cached row whose value is a list of strings; so is every key not named above
(what the plugin registered, by sort)."""


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _valid_row(row: Any) -> bool:
    """Whether ``row`` has every key ``cockpit plugins`` reads, each of the right type."""
    return (
        isinstance(row, dict)
        and all(isinstance(row.get(key), str) for key in _ROW_TEXT)
        and all(
            key in row and isinstance(row[key], (str, type(None))) for key in _ROW_OPTIONAL_TEXT
        )
        and isinstance(row.get("ok"), bool)
        and all(_strings(row.get(key)) for key in _ROW_NAMES)
        and all(
            _strings(value)
            for key, value in row.items()
            if key not in (*_ROW_TEXT, *_ROW_OPTIONAL_TEXT, "ok")
        )
    )


def _valid_listing(stored: Any) -> bool:
    """Whether a cached listing has the shape :func:`load_listing` gives (so it prints)."""
    return (
        isinstance(stored, dict)
        and isinstance(stored.get("rows"), list)
        and all(_valid_row(row) for row in stored["rows"])
        and isinstance(stored.get("conflicts"), list)
        and all(_strings(pair) and len(pair) == 2 for pair in stored["conflicts"])
        and _strings(stored.get("extension_errors"))
        and _strings(stored.get("warnings"))
    )


def read_cache(path: Path, digest: str) -> Listing | None:
    """The listing stored in ``path`` for fingerprint ``digest``; ``None`` if none is usable.

    An entry of the wrong shape (a key missing, a value of the wrong type: a file edited by
    hand or by another program) is not usable: the caller then loads the plugins and
    rewrites the cache.
    """
    for entry in _entries(path):
        if entry.get("fingerprint") != digest:
            continue
        try:
            stored: Any = entry.get("listing")
            created: Any = entry.get("created")
            if not _valid_listing(stored) or isinstance(created, bool):
                return None
            return Listing(
                rows=stored["rows"],
                conflicts=stored["conflicts"],
                extension_errors=stored["extension_errors"],
                warnings=stored["warnings"],
                cached_at=float(created),
            )
        except Exception:  # a corrupt entry
            return None
    return None


def write_cache(path: Path, digest: str, listing: Listing) -> bool:
    """Store ``listing`` for fingerprint ``digest`` in ``path``, atomically.

    The file keeps the :data:`MAX_ENTRIES` newest listings, so that switching between two
    settings (``cockpit`` and ``python -m cockpit_core``, two plugin folders) keeps both.

    Returns:
        Whether it was written; a folder that cannot be written is no error.

    """
    from cockpit_core.log.atomic_file import write_text_atomic

    stored = listing._asdict()
    del stored["cached_at"]
    entry = {"fingerprint": digest, "created": time.time(), "listing": stored}
    others = [e for e in _entries(path) if e.get("fingerprint") != digest]
    entries = [entry, *others][:MAX_ENTRIES]
    text = json.dumps({"format": FORMAT, "prefix": sys.prefix, "entries": entries})
    try:
        write_text_atomic(path, text)  # readers see the old file or the new one, whole
    except OSError:
        return False
    return True


def cache_note(listing: Listing) -> str:
    """The line ``cockpit plugins -v`` adds on standard error for a listing from the cache."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(listing.cached_at or 0))
    return f"(listed from cache of {when}; --refresh re-imports the plugins)"
