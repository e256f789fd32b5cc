"""The help text of a service's options, from where its author already wrote it.

A service declares its options as the annotated fields of a nested ``Options`` class,
and the natural place to say what one means is beside it: a comment on the same line
(``listen: str = "127.0.0.1:4000"  # where Ockam TCP clients connect``) or, as Sphinx
reads attribute docstrings, a string on the line after. ``run --help`` shows that text;
a field with neither is "<Service> option." as before. Read from the class's source, so
nothing runs; a class whose source cannot be found (defined in a REPL) has no help.
"""

from __future__ import annotations

import ast
import inspect
import io
import textwrap
import tokenize

__all__ = ["option_help"]


def option_help(options: type) -> dict[str, str]:
    """Each documented field of an ``Options`` class and its help text."""
    try:
        source = textwrap.dedent(inspect.getsource(options))
    except (OSError, TypeError):
        return {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    if not tree.body or not isinstance(tree.body[0], ast.ClassDef):
        return {}
    comments = _line_comments(source)
    found: dict[str, str] = {}
    body = tree.body[0].body
    for i, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        after = body[i + 1] if i + 1 < len(body) else None
        if (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[name] = " ".join(after.value.value.split())
        elif node.end_lineno is not None and node.end_lineno in comments:
            found[name] = comments[node.end_lineno]
    return found


def _line_comments(source: str) -> dict[int, str]:
    """The comment that ends each line that has one, by line number."""
    comments: dict[int, str] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                text = token.string.lstrip("#").strip()
                if text:
                    comments[token.start[0]] = text
    except (tokenize.TokenError, IndentationError):
        return {}
    return comments
