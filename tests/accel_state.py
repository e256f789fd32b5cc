"""Whether a C accelerator is turned off, required, or built: for the tests that hold
each accelerator to its Python twin (they must not pass by comparing the twin with
itself)."""

from __future__ import annotations

import os

import pytest

from ambrosia_py import accel

PURE = os.environ.get(accel.PURE_ENV, "") not in ("", "0")
REQUIRED = os.environ.get(accel.REQUIRE_ENV, "") not in ("", "0")


def built(name: str) -> bool:
    """Whether the accelerator module ``name`` imports."""
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def skip_unless_built(name: str) -> None:
    """Skip the calling test where ``name`` is not built and nothing requires it."""
    if not built(name) and not REQUIRED:
        pytest.skip(f"{name} is not built (and {accel.REQUIRE_ENV} is unset)")
