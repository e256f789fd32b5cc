"""The floors of docs/architecture.md (*Floors*) that a change could quietly break.

Every command lives in ``ambrosia_py/cli/`` (``bench`` and ``demo`` in their own
packages), nothing else imports it, and the coordinator imports nothing of the binding.
Read from the source, so nothing is imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ambrosia_py"
# Where click commands and options may be declared.
COMMANDS = {"cli", "bench", "demo"}
_DECLARING = {"command", "group", "option", "argument"}


def _modules() -> Iterator[tuple[Path, str]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield path, ".".join(("ambrosia_py", *parts))


def _imports(path: Path, name: str) -> set[str]:
    """Every module ``path`` imports, absolute, with each name it takes from one."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _floor(name: str) -> str:
    """The package of ``ambrosia_py`` a module is in ("" for the root's own modules)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else ""


def _within(imported: str, floor: str) -> bool:
    return imported == f"ambrosia_py.{floor}" or imported.startswith(f"ambrosia_py.{floor}.")


def test_nothing_below_the_commands_imports_them() -> None:
    for path, name in _modules():
        if _floor(name) != "cli":
            upward = sorted(i for i in _imports(path, name) if _within(i, "cli"))
            assert not upward, f"{name} imports the commands: {upward}"


def test_the_coordinator_imports_nothing_of_the_binding() -> None:
    for path, name in _modules():
        if _floor(name) == "coordinator":
            upward = sorted(i for i in _imports(path, name) if _within(i, "binding"))
            assert not upward, f"{name} imports the binding: {upward}"


def test_only_the_command_packages_declare_commands() -> None:
    for path, name in _modules():
        if _floor(name) in COMMANDS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in _DECLARING
                and isinstance(node.value, ast.Name)
                and node.value.id == "click"
            ):
                raise AssertionError(f"{name}:{node.lineno} declares a command: click.{node.attr}")
