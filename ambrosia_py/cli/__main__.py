"""``python -m ambrosia_py.cli``: the ``ambrosia-py`` program, as its console script runs it."""

from . import program

program()
