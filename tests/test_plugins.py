"""The framework never imports the services built on it; they plug in by entry point.

``ambrosia_py`` holds no import of ``immortals`` (read from the source with ``ast``, so
nothing is imported); the report plug-ins and the bench commands ``pyproject.toml``
registers are the ones installed; and the report's decoder reads calls only as the
plug-ins say, unpickling no global but the classes they list. No Spark here.
"""

from __future__ import annotations

import ast
import pickle
import tomllib
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ambrosia_py.bench import PLUGIN_GROUP
from ambrosia_py.cli import main
from ambrosia_py.spark.report_plugins import (
    ENTRY_POINT_GROUP,
    CallReader,
    Frame,
    ServiceReport,
    Undecodable,
    registered,
)
from ambrosia_py.spark.report_services import (
    ServiceDecoder,
    service_method_ids,
    start_method_ids,
    starts_logged,
)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ambrosia_py"
SERVICES = "immortals"
_IMPORTERS = {"__import__", "import_module"}
REINSTALL = "the installed metadata is stale: reinstall (make, or pip install -e .)"


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in ``tree``, and of every
    ``import_module``/``__import__`` of a literal name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and _IMPORTERS & {getattr(node.func, "id", None), getattr(node.func, "attr", None)}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def test_the_framework_never_imports_the_services_built_on_it() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 100
    offending = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in modules
        for line, module in _imported(ast.parse(path.read_text(), str(path)))
        if module == SERVICES or module.startswith(f"{SERVICES}.")
    ]
    assert not offending, "the framework imports immortals:\n" + "\n".join(offending)


def test_the_check_sees_every_kind_of_import() -> None:
    code = (
        "import immortals.ockam\nfrom immortals.wallaroo import codec\n"
        "importlib.import_module('immortals.x')\nfrom . import immortals\n"
    )
    assert [m for _, m in _imported(ast.parse(code))] == [
        "immortals.ockam",
        "immortals.wallaroo",
        "immortals.x",
    ]


def _declared(group: str) -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(project["entry-points"][group])


def test_the_installed_plugins_are_the_ones_pyproject_declares() -> None:
    for group in (ENTRY_POINT_GROUP, PLUGIN_GROUP):
        installed = {p.name: p.value for p in entry_points(group=group)}
        assert installed == _declared(group), f"{group}: {REINSTALL}"


def test_the_report_plugins_load_and_list_only_classes() -> None:
    plugins = registered()
    assert [p.name for p in plugins] == ["ockam", "wallaroo"]
    for plugin in plugins:
        assert isinstance(plugin, ServiceReport)
        assert isinstance(plugin.reader(), CallReader)
        for module, name in plugin.allowed_globals:
            assert module.startswith(f"{SERVICES}."), (plugin.name, module)
            found = getattr(__import__(module, fromlist=[name]), name)
            assert isinstance(found, type), f"{plugin.name}: {module}.{name} is not a class"
    assert set(service_method_ids()) == {"frames", "configure", "start"}
    assert starts_logged() == ("connector", "worker")
    assert start_method_ids() == [service_method_ids()["start"]]


def test_the_bench_lists_its_plugins_and_runs_them() -> None:
    listing = CliRunner().invoke(main, ["bench", "--help"])
    assert listing.exit_code == 0, listing.output
    assert "ockam" in listing.output and "compare" in listing.output
    helped = CliRunner().invoke(main, ["bench", "ockam", "--help"])
    assert helped.exit_code == 0, helped.output
    assert "The Ockam hub over TCP" in helped.output


# --- the report's decoder, with plug-ins of the test's own ---------------------------------


class _Reader:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.role: str | None = None

    def claims(self, method: str, args: tuple[Any, ...]) -> bool:
        if method == "start" and args == (self.kind,):
            self.role = "server"
            return True
        return False

    def read(self, method: str, args: tuple[Any, ...]) -> Sequence[Frame | Undecodable]:
        if method != "frames" or len(args) != 1:
            return [Undecodable(f"{method}: not {self.kind}'s")]
        return [
            Frame("Word", "s", 7, None, len(f)) if f.startswith(self.kind.encode())
            else Undecodable(f"not {self.kind}", i)
            for i, f in enumerate(args[0])
        ]  # fmt: skip


class _Plugin:
    def __init__(self, kind: str, allowed: frozenset[tuple[str, str]] = frozenset()) -> None:
        self.name = self.title = self.about = kind
        self.charted = "Word"
        self.restarts_logged = frozenset({"server"})
        self.start_method: str | None = "start"
        self.allowed_globals = allowed

    def methods(self) -> Mapping[str, int]:
        return {"frames": 1, "start": 2}

    def reader(self) -> _Reader:
        return _Reader(self.name)


def _call(*args: Any) -> bytes:
    return pickle.dumps((args, {}))


def _rows(decoder: ServiceDecoder) -> list[tuple[Any, ...]]:
    return list(decoder.rows("i", 0))


def test_a_claimed_instance_is_read_by_its_plugin_alone() -> None:
    decoder = ServiceDecoder([_Plugin("ab"), _Plugin("a")])
    decoder.feed(2, _call("a"), "w0")
    decoder.feed(1, _call([b"ab", b"x"]), "w1")
    assert _rows(decoder) == [
        ("i", 0, "a", "server", "s", "7", None, "Word", 1, 2, None),
        ("i", 0, "a", "server", None, None, None, "undecodable", 1, 0, "w1, frame 1: not a"),
    ]


def test_before_a_claim_only_a_call_one_plugin_reads_whole_decides() -> None:
    decoder = ServiceDecoder([_Plugin("ab"), _Plugin("a")])
    decoder.feed(1, _call([b"ab"]), "w0")  # both read it whole: not guessed at
    decoder.feed(1, _call([b"c"]), "w1")  # neither
    decoder.feed(1, _call([b"a"]), "w2")  # only "a"
    decoder.feed(1, _call([b"ab"]), "w3")  # now "a"'s
    [(unknown, n, problem), *rest] = [(r[2], r[8], r[10]) for r in _rows(decoder)]
    assert (unknown, n) == ("unknown", 2)
    assert problem == "w0: frames: decodes whole for several (ab, a)"
    assert rest == [("a", 2, None)]
    assert decoder.readers["a"].role is None  # a guess gives no role


def test_an_unlisted_global_is_refused_and_a_listed_function_never_called(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "called"
    decoder = ServiceDecoder([_Plugin("a", frozenset({(__name__, "_touch")}))])
    decoder.feed(1, _call([_Calls(_touch, marker)]), "w0")
    decoder.feed(1, _call([_Calls(_touch_too, marker)]), "w1")
    assert not marker.exists()
    [row] = _rows(decoder)
    assert row[2] == "unknown" and row[8] == 2
    assert row[10] == f"w0: arguments not decoded (the global {__name__}._touch is not a class)"
    refused = ServiceDecoder([_Plugin("a")])
    refused.feed(1, _call([_Calls(_touch, marker)]), "w2")
    assert not marker.exists()
    assert f"the global {__name__}._touch is not allowed here" in _rows(refused)[0][10]


def _touch(path: str) -> None:
    Path(path).touch()


def _touch_too(path: str) -> None:
    Path(path).touch()


class _Calls:
    """Pickles as a call of ``function(marker)``."""

    def __init__(self, function: Any, marker: Path) -> None:
        self.function, self.marker = function, marker

    def __reduce__(self) -> Any:
        return (self.function, (str(self.marker),))


def test_the_registered_plugins_read_their_services_frames() -> None:
    from immortals.ockam import codec as ockam_codec
    from immortals.ockam.routing import Address, TransportMessage, encode_message
    from immortals.wallaroo.codec import LENGTH_PREFIX_BYTES, Dialect, encode
    from immortals.wallaroo.connector_actions import ConnectorConfig
    from immortals.wallaroo.frames import Message

    ids = service_method_ids()
    push = ockam_codec.encode(ockam_codec.PushRequest(1, b"data"))
    hop = (Address.local("stream_service.0.alpha"),)
    frame = encode_message(TransportMessage(1, hop, (Address.tcp("127.0.0.1", 9),), push))
    hub = ServiceDecoder()
    hub.feed(ids["frames"], _call("peer", 0, [frame]), "w0")  # no configure: found
    assert _rows(hub) == [("i", 0, "ockam", None, "alpha", None, 0, "PushRequest", 1, 4, None)]

    config = ConnectorConfig("127.0.0.1:1", ("words",), dialect=Dialect.V3)
    message = encode(Message(0x5EED, 1, b"hello", event_time=0), Dialect.V3)[LENGTH_PREFIX_BYTES:]
    connector = ServiceDecoder()
    connector.feed(ids["start"], _call("incarnation", config), "w0")
    connector.feed(ids["frames"], _call("conn", 0, [message]), "w1")
    [row] = _rows(connector)
    assert row[2:4] == ("wallaroo", "connector")
    assert row[5:] == (str(0x5EED), None, "Message", 1, 5, None)


@pytest.mark.parametrize("name", ["Ockam", "a b", ""])
def test_a_plugin_with_an_unusable_name_is_refused(name: str) -> None:
    from ambrosia_py.spark.report_plugins import PluginError, _check

    plugin = _Plugin("a")
    plugin.name = name
    with pytest.raises(PluginError, match="is not lower case"):
        _check("x", plugin)


@pytest.mark.parametrize(("start", "roles"), [("configure", {"server"}), (None, {"server"})])
def test_a_plugin_whose_start_call_is_not_its_own_is_refused(
    start: str | None, roles: set[str]
) -> None:
    from ambrosia_py.spark.report_plugins import PluginError, _check

    plugin = _Plugin("a")
    plugin.start_method, plugin.restarts_logged = start, frozenset(roles)
    with pytest.raises(PluginError, match="start_method"):
        _check("x", plugin)
