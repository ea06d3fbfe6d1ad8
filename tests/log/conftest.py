"""Fixtures of the log tests."""

from __future__ import annotations

import base64
import functools
import zlib
from collections.abc import Callable
from typing import Any

import pytest

from cockpit_core import Quantity, Registry, hookimpl


def registry_with(value_at_step: Callable[[int], Any], name: str = "odd") -> Registry:
    """A registry with one quantity ``name`` whose ``compute`` returns ``value_at_step(step)``."""

    class Returns(Quantity):
        def compute(self, ctx):
            return value_at_step(ctx.step)

    Returns.name = name

    class plugin:  # noqa: N801 - a plugin namespace
        @staticmethod
        @hookimpl
        def register_quantities(register):
            register(Returns)

    registry = Registry()
    registry.add_plugin(plugin, name=f"{name}_plugin")
    return registry


@pytest.fixture
def returning():
    """``returning(fn, name="odd")``: a registry whose quantity returns ``fn(step)``."""
    return registry_with


@functools.cache
def bomb_base64(inflated_mib: int, header: str = "gzip") -> str:
    """Base64 of a deflate stream of ``inflated_mib`` MiB of zeros, built without inflating.

    Fully flushed deflate blocks of the same input are identical, so one block repeated
    makes the stream; the trailer is left off (a reader that stops early never needs it).
    ``header`` is ``"gzip"`` or ``"zlib"``.
    """
    packer = zlib.compressobj(9, zlib.DEFLATED, {"gzip": 31, "zlib": 15}[header])
    head = packer.compress(b"")
    block = packer.compress(bytes(1 << 20)) + packer.flush(zlib.Z_FULL_FLUSH)
    return base64.b64encode(head + block * inflated_mib).decode()


@pytest.fixture
def bomb():
    """``bomb(inflated_mib, header="gzip")``: base64 of a compressed run of zeros."""
    return bomb_base64
