"""Limits on what a config file (or a ``--set`` value) may hold, checked while it is parsed.

A config needs a few levels of nesting and a few hundred values; a file far beyond that is
a mistake or an attack, and without limits it ends in a ``RecursionError``, a
``ValueError`` of Python's integer conversion, or (YAML aliases that repeat what they point
to, the "billion laughs") in gigabytes of memory. Each limit is refused with a message that
names it:

- :data:`MAX_DEPTH`: levels of nested tables and lists;
- :data:`MAX_VALUES`: values of a YAML document once its aliases are expanded;
- Python's limit on the digits of an integer (:func:`sys.get_int_max_str_digits`).

The parsers raise :class:`LimitError` (a ``ValueError``); :func:`cockpit_core.config.files.load_config_file`
turns it into a :class:`~cockpit_core.errors.ConfigError` that names the file.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import yaml

MAX_DEPTH = 100
"""Most levels of nested tables and lists a config (or a ``--set`` value) may have."""

MAX_VALUES = 100_000
"""Most values (scalars, lists, tables) a YAML config may expand to, aliases included."""

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


class LimitError(ValueError):
    """A config exceeds one of the limits of this module (the message names it)."""


def too_deep() -> LimitError:
    """The error of a config nested deeper than :data:`MAX_DEPTH`."""
    return LimitError(
        f"nested deeper than {MAX_DEPTH} levels of tables and lists (the limit); "
        "a cockpit config needs a few"
    )


def _digits_limit() -> int:
    get = getattr(sys, "get_int_max_str_digits", None)
    return int(get()) if get is not None else 0


def number_error(err: ValueError) -> LimitError | None:
    """The :class:`LimitError` of Python's integer-digits limit, if ``err`` is one."""
    if "integer string conversion" not in str(err):
        return None
    return LimitError(
        f"a number has more than {_digits_limit()} digits (the limit of Python's "
        "integer conversion); a cockpit option needs far fewer"
    )


def json_depth(text: str) -> int:
    """How deeply the brackets of the JSON ``text`` nest (strings skipped); no parsing."""
    depth = deepest = 0
    for match in _BRACKET.finditer(_JSON_STRING.sub("", text)):
        if match.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def check_depth(data: Any) -> None:
    """Raise :class:`LimitError` if ``data`` nests deeper than :data:`MAX_DEPTH` (iterative)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list, tuple)):
            if depth > MAX_DEPTH:
                raise too_deep()
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)


def loads_json(text: str) -> Any:
    """``json.loads`` within the limits.

    Raises:
        LimitError: Nested deeper than :data:`MAX_DEPTH`, or a number too long.
        json.JSONDecodeError: Not JSON.

    """
    if json_depth(text) > MAX_DEPTH:
        raise too_deep()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except ValueError as err:
        limit = number_error(err)
        if limit is None:
            raise
        raise limit from None
    except RecursionError:  # pragma: no cover - the scan above refuses it first
        raise too_deep() from None


def _too_many() -> LimitError:
    return LimitError(
        f"expands to more than {MAX_VALUES} values (the limit), aliases (*name) repeating "
        "what their anchor (&name) holds; a cockpit config needs far fewer"
    )


def _measure(node: yaml.Node, level: int, memo: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """``(values, height)`` of a composed YAML node at ``level``, aliases expanded (memoized).

    An alias is the same node object as its anchor, so each distinct node is measured once
    and a document of a few lines that expands to millions of values is measured in a few
    steps. Raises :class:`LimitError` as soon as a limit is passed.
    """
    if not isinstance(node, (yaml.SequenceNode, yaml.MappingNode)):
        return 1, 0
    if level > MAX_DEPTH:
        raise too_deep()
    known = memo.get(id(node))
    if known is None:
        children: list[yaml.Node] = (
            list(node.value)
            if isinstance(node, yaml.SequenceNode)
            else [part for pair in node.value for part in pair]
        )
        values, height = 1, 1
        for child in children:
            child_values, child_height = _measure(child, level + 1, memo)
            values += child_values
            height = max(height, child_height + 1)
            if values > MAX_VALUES:
                raise _too_many()
        known = memo[id(node)] = (values, height)
    if level + known[1] - 1 > MAX_DEPTH:
        raise too_deep()
    return known


def loads_yaml(text: str) -> Any:
    """``yaml.safe_load`` within the limits: the document is measured before it is built.

    Raises:
        LimitError: Nested deeper than :data:`MAX_DEPTH`, more than :data:`MAX_VALUES`
            values with aliases expanded, or a number too long.
        yaml.YAMLError: Not YAML.

    """
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise too_deep() from None
        if node is None:
            return None
        _measure(node, 1, {})
        try:
            return loader.construct_document(node)
        except ValueError as err:
            limit = number_error(err)
            if limit is None:
                raise
            raise limit from None
    finally:
        loader.dispose()


def loads_toml(text: str, parser: Any) -> Any:
    """``parser.loads(text)`` (``tomllib``) within the limits.

    Raises:
        LimitError: Nested deeper than :data:`MAX_DEPTH`, or a number too long.

    """
    try:
        data = parser.loads(text)
    except RecursionError:
        raise too_deep() from None
    except ValueError as err:
        limit = number_error(err)
        if limit is None:
            raise
        raise limit from None
    check_depth(data)
    return data
