"""cockpit's tags as MLflow metric and tag keys, and the header as bounded tag values.

MLflow accepts a key only if it is at most 250 characters of letters, digits, ``_``, ``-``,
``.``, `` ``, ``/`` (and ``:`` except on Windows), and if it names a clean relative path
(the file store keeps each key as a file): no empty, ``.`` or ``..`` parts, no leading or
trailing ``/``. :func:`metric_key` maps any tag onto such a key:

* every other character becomes ``_`` (``:`` too, so a key is the same on every system):
  ``cockpit/grad_norm/layers[0].weight`` -> ``cockpit/grad_norm/layers_0_.weight``;
* empty parts disappear (``a//b/`` -> ``a/b``), ``.`` and ``..`` parts become ``_``/``__``,
  and a key starting with ``..`` gets a leading ``_``;
* a key longer than 250 characters keeps its first 241 and ends in ``-`` and 8 hex digits
  of its SHA-1, so long keys stay distinct.

Keys that already follow the rules (every tag of cockpit's own quantities on a model with
ordinary parameter names) are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

MAX_KEY_LENGTH = 250  # MLflow's limit for metric, param and tag keys
MAX_TAG_VALUE_LENGTH = 5000  # below MLflow's 8000; longer header values are cut
TRUNCATED = " ...(truncated)"
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_\-. /]")


def metric_key(tag: str) -> str:
    """The MLflow key of a cockpit tag, following the rules above."""
    parts = [_NOT_ALLOWED.sub("_", part) for part in str(tag).split("/") if part]
    parts = [part.replace(".", "_") if part in (".", "..") else part for part in parts]
    key = "/".join(parts) or "_"
    if key.startswith(".."):
        key = "_" + key
    if len(key) > MAX_KEY_LENGTH:
        digest = hashlib.sha1(key.encode()).hexdigest()[:8]
        key = f"{key[: MAX_KEY_LENGTH - 9]}-{digest}"
    return key


def tag_value(value: Any) -> str:
    """A header value as an MLflow tag value: strings as they are, the rest as JSON; cut."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if len(text) > MAX_TAG_VALUE_LENGTH:
        text = text[: MAX_TAG_VALUE_LENGTH - len(TRUNCATED)] + TRUNCATED
    return text


def header_tags(prefix: str, summary: Mapping[str, Any]) -> dict[str, str]:
    """``{<prefix>.<field>: value}`` of a header summary (``params``, ``quantities``, ...)."""
    return {metric_key(f"{prefix}.{field}"): tag_value(v) for field, v in summary.items()}
