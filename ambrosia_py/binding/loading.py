"""Finding the service a command names: ``FILE[:Class]`` or ``module[:Class]``.

A file is loaded as ``python FILE`` would run it: its folder first on the path, the file
a module named after it, so another process (a caller unpickling this service's
exception, a replay) finds its classes under the same name. A file with one Immortal
subclass needs no class name.

A service file that does not load (a syntax error, an exception at import) is one line
naming the file, the line and the error (:class:`~ambrosia_py.oneline.OneLineError`);
``--verbose`` shows the traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import traceback
from pathlib import Path
from types import ModuleType

import click

from ..oneline import OneLineError
from .immortal import Immortal

__all__ = ["load_service"]

_loaded_files: dict[str, Path] = {}  # module name -> the service file loaded under it


def load_service(spec: str) -> type[Immortal]:
    """The Immortal subclass named by ``spec`` (see the module docstring)."""
    target, _, class_name = spec.partition(":")
    if target.endswith(".py") or Path(target).is_file():
        module = _load_file(target)
    else:
        module = _import(target)
    found = {
        name: obj
        for name, obj in vars(module).items()
        if inspect.isclass(obj)
        and issubclass(obj, Immortal)
        and obj is not Immortal
        and obj.__module__ == module.__name__
    }
    if class_name:
        if class_name not in found:
            raise click.BadParameter(
                f"{target} has no Immortal subclass {class_name!r} (it has {sorted(found)})",
                param_hint="SERVICE",
            )
        return found[class_name]
    if len(found) != 1:
        raise click.BadParameter(
            f"{target} defines {len(found)} Immortal subclasses {sorted(found)}: name one as "
            f"{target}:Class",
            param_hint="SERVICE",
        )
    return next(iter(found.values()))


def _load_file(target: str) -> ModuleType:
    path = Path(target)
    if not path.is_file():
        raise click.BadParameter(f"no such file: {target}", param_hint="SERVICE")
    module_name = path.stem
    if not module_name.isidentifier():
        raise click.BadParameter(
            f"{target}: {module_name!r} is not a module name", param_hint="SERVICE"
        )
    existing = sys.modules.get(module_name)
    if existing is not None and module_name not in _loaded_files:
        raise click.BadParameter(
            f"{target}: a module {module_name!r} is already loaded from "
            f"{getattr(existing, '__file__', 'elsewhere')}; rename the file",
            param_hint="SERVICE",
        )
    if existing is not None and _loaded_files[module_name] == path.resolve():
        return existing
    mod_spec = importlib.util.spec_from_file_location(module_name, path)
    if mod_spec is None or mod_spec.loader is None:
        raise click.BadParameter(f"cannot load {target}", param_hint="SERVICE")
    folder = str(path.resolve().parent)
    _loaded_files[module_name] = path.resolve()
    sys.path.insert(0, folder)
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[module_name] = module
    try:
        mod_spec.loader.exec_module(module)
    except Exception as exc:
        # Forgotten again, so loading it a second time (``run`` loads the file for its
        # --help first) reports the same error instead of finding half a module.
        del sys.modules[module_name], _loaded_files[module_name]
        sys.path.remove(folder)
        raise OneLineError(
            f"the service file {target} does not load: {_where(exc, path)}", cause=exc
        ) from None
    return module


def _import(target: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        raise click.BadParameter(f"cannot import {target}: {exc}", param_hint="SERVICE") from None
    except Exception as exc:  # a syntax error, an exception in the module's body
        raise OneLineError(
            f"the service module {target} does not load: {_where(exc, None)}", cause=exc
        ) from None


def _where(exc: BaseException, path: Path | None) -> str:
    """The error and where it was raised: ``SyntaxError at foo.py line 3: expected ':'``."""
    if isinstance(exc, SyntaxError):
        where = f"{exc.filename} line {exc.lineno}" if exc.filename else "?"
        return f"{type(exc).__name__} at {where}: {exc.msg}"
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if path is None or Path(f.filename).resolve() == path.resolve()]
    where = f" at {mine[-1].filename} line {mine[-1].lineno}" if mine else ""
    return f"{type(exc).__name__}{where}: {exc}"
