"""Builds the optional C accelerators: every ``ambrosia_py/**/_c*.c`` becomes the
extension module of the same name (``ambrosia_py/wire/_cdecode.c`` ->
``ambrosia_py.wire._cdecode``). Each has a pure-Python twin that stays the reference
(tests hold the two to the same results) and is used where the build could not compile
it; ``AMBROSIA_PURE_PYTHON=1`` uses the twins even where it could. Everything else about
the package is in pyproject.toml."""

from pathlib import Path

from setuptools import Extension, setup

_HERE = Path(__file__).parent


def _extensions() -> list[Extension]:
    found = []
    for source in sorted((_HERE / "ambrosia_py").rglob("_c*.c")):
        relative = source.relative_to(_HERE)
        name = ".".join(relative.with_suffix("").parts)
        headers = [str(h.relative_to(_HERE)) for h in sorted(source.parent.glob("*.h"))]
        found.append(
            Extension(
                name,
                [str(relative)],
                depends=headers,
                extra_compile_args=["-O2", "-std=c11"],
                optional=True,
            )
        )
    return found


setup(ext_modules=_extensions())
