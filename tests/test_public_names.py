"""The public names of the packages users import are the ones ``docs/api.md`` documents.

The expected sets are read from that page (a ``## `package``` heading, then one
``- `name` — ...`` line per name), never from the code: a name added to or dropped from
an ``__all__`` without the page, or the other way round, fails here. The errors are one
class each, whichever path a program imports them from.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

API_PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"
PACKAGES = [
    "ambrosia_py",
    "ambrosia_py.errors",
    "ambrosia_py.binding",
    "ambrosia_py.client",
    "ambrosia_py.ingress",
]
_HEADING = re.compile(r"^## `([a-z_.]+)`$")
_ITEM = re.compile(r"^- `([A-Za-z_][A-Za-z0-9_]*)` — ")


def documented() -> dict[str, list[str]]:
    """Each package's names as docs/api.md lists them, in the page's order."""
    names: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in API_PAGE.read_text().splitlines():
        heading = _HEADING.match(line)
        if heading:
            current = names.setdefault(heading.group(1), [])
        elif line.startswith("## "):
            current = None
        elif current is not None and (item := _ITEM.match(line)):
            current.append(item.group(1))
    return names


def test_the_page_documents_each_package_once_and_each_name_once() -> None:
    names = documented()
    assert sorted(names) == sorted(PACKAGES)
    for package, listed in names.items():
        assert listed, f"{package} lists no names"
        assert len(set(listed)) == len(listed), f"{package} lists a name twice"


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_what_the_page_documents(package: str) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(documented()[package])


@pytest.mark.parametrize("package", PACKAGES)
def test_star_import_yields_exactly_the_documented_names(package: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {package} import *", namespace)
    assert sorted(k for k in namespace if not k.startswith("__")) == sorted(documented()[package])


# Where programs imported errors from before ambrosia_py.errors: they keep working.
EARLIER_PATHS = {
    "ambrosia_py.binding": [
        "BindingError",
        "CheckpointFormatError",
        "DeterminismError",
        "ImpulseDuringRecoveryError",
        "MethodIdCollisionError",
        "RemoteError",
        "UnknownMethodError",
    ],
    "ambrosia_py.client": [
        "AuthenticationError",
        "CallRefusedError",
        "CallTimeoutError",
        "ClientClosedError",
        "IngressError",
        "IngressProtocolError",
        "KeyReusedError",
        "ServiceUnreachableError",
    ],
    "ambrosia_py.ingress": [
        "AuthenticationError",
        "CallRefusedError",
        "CallTimeoutError",
        "ClientClosedError",
        "IngressError",
        "IngressProtocolError",
        "KeyReusedError",
    ],
}


def test_each_error_is_defined_once_where_it_is_raised() -> None:
    errors = importlib.import_module("ambrosia_py.errors")
    for name in documented()["ambrosia_py.errors"]:
        cls = getattr(errors, name)
        assert isinstance(cls, type) and issubclass(cls, Exception), name
        # Pickled by this name when a handler's exception travels to its caller.
        assert cls.__module__ in ("ambrosia_py.binding.errors", "ambrosia_py.ingress.errors")
        home = importlib.import_module(cls.__module__)
        assert getattr(home, name) is cls


@pytest.mark.parametrize("package", sorted(EARLIER_PATHS))
def test_the_earlier_import_paths_give_the_same_classes(package: str) -> None:
    module = importlib.import_module(package)
    errors = importlib.import_module("ambrosia_py.errors")
    binding_errors = importlib.import_module("ambrosia_py.binding.errors")
    for name in EARLIER_PATHS[package]:
        same = getattr(errors, name, None) or getattr(binding_errors, name)
        assert getattr(module, name) is same, f"{package}.{name}"


def test_background_is_the_decorator_whatever_is_imported_first() -> None:
    """The background-task module is not named after the decorator, so importing it
    after the package leaves ``background`` the decorator."""
    code = (
        "import ambrosia_py.binding, ambrosia_py.binding.background_tasks, ambrosia_py\n"
        "from ambrosia_py.binding.immortal import background\n"
        "assert ambrosia_py.binding.background is background, ambrosia_py.binding.background\n"
        "assert ambrosia_py.background is background, ambrosia_py.background\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
