"""The optional C accelerators (``setup.py`` builds every ``ambrosia_py/**/_c*.c``).

Each accelerates one hot loop whose pure-Python twin stays beside it as the reference:
tests hold the two to the same results on the same bytes, and the twin runs wherever the
accelerator was not built (no compiler when installing). ``AMBROSIA_PURE_PYTHON=1``
runs the twins even where the accelerators are built; ``AMBROSIA_REQUIRE_ACCEL=1``
makes a missing accelerator an error instead (``make test`` sets it, so CI cannot pass
on the twins alone without saying so).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["PURE_ENV", "REQUIRE_ENV", "load"]

PURE_ENV = "AMBROSIA_PURE_PYTHON"
REQUIRE_ENV = "AMBROSIA_REQUIRE_ACCEL"


def load(name: str) -> ModuleType | None:
    """The accelerator module ``name`` (``"ambrosia_py.wire._cdecode"``), or None: not
    built, or turned off by ``AMBROSIA_PURE_PYTHON``."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
            raise ImportError(
                f"{name} is not built ({exc}); {REQUIRE_ENV} asks for it: install with a C "
                "compiler, the Python headers, and OpenSSL's and xxHash's (Debian: "
                "libssl-dev, libxxhash-dev; `make` installs them; pip install -e . builds it)"
            ) from exc
        return None
