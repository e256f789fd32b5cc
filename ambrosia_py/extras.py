"""The optional extras (``pyproject.toml``): which module comes with which, and the one
error raised where one is missing.

``pip install ambrosia-py`` brings only the core; ``spark`` (PySpark, PyArrow, pandas,
matplotlib, and NumPy with them) and ``bench`` (grpcio, DBOS) are extras. So no module
of a command, nor ``ambrosia_py``, ``ambrosia_py.client``, ``ambrosia_py.testing`` (a
pytest plugin every pytest run loads) or ``ambrosia_py.spark``, imports them at its
top: they are imported where they are used, after :func:`require` or through
:func:`optional_import`. (The Spark data source's own modules, ``spark/source.py``,
``arrow.py``, ``calls.py`` and ``bench/spark_ceiling.py``, do import them at their top:
they are loaded only once Spark runs.) Where one is missing, :class:`MissingExtraError` says in one
line which extra to install; it is a :class:`click.ClickException`, so a command that
raises it ends with that line and exit status 1, not a traceback, and an
:class:`ImportError`, so a program using the library catches it as one.

What runs without which extra (``tests/test_extras.py`` holds the help and the errors
to it):

- every command's ``--help``, and every command but these, without any (``log show``
  and ``verify`` decode the wire in pure Python);
- ``analyze`` needs the whole ``spark`` extra and checks it first, before Java or Spark
  start: a report is Spark, pandas and matplotlib all through;
- ``bench spark`` needs PySpark, PyArrow and NumPy (no charts, no pandas);
- ``bench compare`` measures the peers that are installed (grpcio, DBOS: the ``bench``
  extra) and names the others, with what to install: a comparison of what is here
  still says something. A run left with nothing to measure (``--only grpc`` without
  grpcio) fails instead, and so does ``--charts`` without matplotlib, before measuring
  rather than after;
- ``demo`` runs and checks the pipeline without the ``spark`` extra and says what to
  install for its last step, the Spark analytics;
- in the library, reading logs (``ambrosia_py.spark``) needs PyArrow and a Spark session
  PySpark too; each raises this error, naming what needed it.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import click

__all__ = [
    "EXTRAS",
    "MissingExtraError",
    "install_command",
    "missing",
    "optional_import",
    "require",
]

PROGRAM = "ambrosia-py"

# Each extra's modules (top-level import names), as shown in messages. NumPy is not
# named in pyproject.toml: pandas and matplotlib bring it, and the Spark reader uses it.
EXTRAS: dict[str, dict[str, str]] = {
    "spark": {
        "pyspark": "PySpark",
        "pyarrow": "PyArrow",
        "pandas": "pandas",
        "matplotlib": "matplotlib",
        "numpy": "NumPy",
    },
    "bench": {"grpc": "grpcio", "dbos": "DBOS"},
}
_EXTRA_OF = {module: extra for extra, modules in EXTRAS.items() for module in modules}


def install_command(*extras: str) -> str:
    """What to run to install ``extras``: ``pip install 'ambrosia-py[spark]'``."""
    return f"pip install '{PROGRAM}[{','.join(extras)}]'"


class MissingExtraError(click.ClickException, ImportError):
    """``what`` needs ``modules``, which are not installed: the one line that says which
    extra to install."""

    def __init__(self, what: str, modules: list[str]) -> None:
        extras = sorted({_extra_of(m) for m in modules})
        shown = ", ".join(EXTRAS[_extra_of(m)][_top(m)] for m in modules)
        which = f"the {' and '.join(extras)} extra{'s' if len(extras) > 1 else ''}"
        super().__init__(f"{what} needs {which} (no {shown} here): {install_command(*extras)}")
        self.what = what
        self.modules = modules
        self.extras = extras


def _top(module: str) -> str:
    return module.partition(".")[0]


def _extra_of(module: str) -> str:
    try:
        return _EXTRA_OF[_top(module)]
    except KeyError:
        raise ValueError(f"{module!r} is not a module of an extra ({sorted(_EXTRA_OF)})") from None


def missing(*modules: str) -> list[str]:
    """Those of ``modules`` (of the extras) that cannot be imported here, in order.

    Found without importing them: a command checks before its slow work starts, and
    ``bench compare`` keeps DBOS out of its own process."""
    absent = []
    for module in modules:
        _extra_of(module)
        try:  # the top-level name: a submodule's spec would import its package
            found = importlib.util.find_spec(_top(module)) is not None
        except (ImportError, ValueError):  # a parent missing, a None in sys.modules, ...
            found = False
        if not found:
            absent.append(module)
    return absent


def _who(what: str | None) -> str:
    """``what``, or else the running command (``ambrosia-py bench spark``), or "this"."""
    if what is not None:
        return what
    ctx = click.get_current_context(silent=True)
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    # The program's own name, not how it was started (python -m ..., a test's runner).
    return " ".join([PROGRAM, *reversed(names)]) if names else "this"


def require(*modules: str, what: str | None = None) -> None:
    """Raise :class:`MissingExtraError` unless every one of ``modules`` can be imported.

    ``what`` names what needs them in the message; by default the running command."""
    absent = missing(*modules)
    if absent:
        raise MissingExtraError(_who(what), absent)


def optional_import(module: str, *, what: str | None = None) -> ModuleType:
    """``module`` (of an extra), imported; or :class:`MissingExtraError` if it is not
    installed (``what`` as for :func:`require`)."""
    _extra_of(module)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        # Only a module of an extra (this one, or one it imports, such as NumPy): any
        # other missing module is a broken installation, and its traceback says more.
        if exc.name is None or _top(exc.name) not in _EXTRA_OF:
            raise
        raise MissingExtraError(_who(what), [_top(exc.name)]) from None
