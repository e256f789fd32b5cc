"""Builds the optional C accelerators: every ``ambrosia_py/**/_c*.c`` becomes the
extension module of the same name (``ambrosia_py/wire/_cdecode.c`` ->
``ambrosia_py.wire._cdecode``). Each has a pure-Python twin that stays the reference
(tests hold the two to the same results) and is used where the build could not compile
it; ``AMBROSIA_PURE_PYTHON=1`` uses the twins even where it could. Everything else about
the package is in pyproject.toml.

No accelerator hashes by itself: HMAC-SHA256 is OpenSSL's libcrypto and XXH64/XXH3 the
system's libxxhash (their headers are Debian's libssl-dev and libxxhash-dev, which the
Makefile installs where missing); without them those accelerators do not build."""

from pathlib import Path

from setuptools import Extension, setup

_HERE = Path(__file__).parent
# The system libraries each accelerator links, by its module's name.
_LIBRARIES = {"_clink": ["crypto", "xxhash"], "_crecords": ["xxhash"]}


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
                libraries=_LIBRARIES.get(source.stem, []),
                extra_compile_args=["-O2", "-std=c11"],
                optional=True,
            )
        )
    return found


setup(ext_modules=_extensions())
