"""What service authors and their tests touch is pinned: changing it is a deliberate act.

``ambrosia_py`` (what a service imports), ``ambrosia_py.testing``, and the members of
:class:`Immortal` and of the testing helpers. (The wire and flow packages are pinned in
test_public_api.py, Spark in test_spark_api.py, and the binding, errors, ingress and client
against docs/api.md in test_public_names.py.)
"""

from __future__ import annotations

import pytest

import ambrosia_py
import ambrosia_py.binding as binding
import ambrosia_py.testing as testing
from ambrosia_py import Immortal
from ambrosia_py.testing import ImmortalRunner, RunningImmortal, ServiceProcess

TOP = ["Immortal", "background", "rpc"]
TESTING = [
    "Divergence",
    "ImmortalRunner",
    "ReplayResult",
    "RunningImmortal",
    "ServiceProcess",
    "free_port",
    "readline_within",
    "replay_instance",
    "wait_for",
]
MEMBERS = {
    Immortal: [
        "background_methods",
        "effect",
        "impulse",
        "instance_name",
        "local",
        "make_options",
        "me",
        "on_first_start",
        "option_fields",
        "options",
        "proxy",
        "rpc_methods",
        "rpc_methods_by_name",
        "upgrade_state",
        "version",
    ],
    ImmortalRunner: ["close", "start"],
    RunningImmortal: ["impulse", "kill", "state", "stop", "wait_logged", "wait_until"],
    ServiceProcess: [
        "alive",
        "argv",
        "check_alive",
        "coordinator_pid",
        "kill",
        "output",
        "running",
        "start",
        "stop",
        "tail",
        "wait_for_log",
    ],
}


@pytest.mark.parametrize(
    ("module", "pinned"),
    [(ambrosia_py, TOP), (testing, TESTING)],
    ids=["ambrosia_py", "testing"],
)
def test_all_is_pinned_and_importable(module: object, pinned: list[str]) -> None:
    names = module.__all__  # type: ignore[attr-defined]
    assert sorted(names) == pinned
    assert len(set(names)) == len(names), "duplicate names in __all__"
    for name in names:
        assert getattr(module, name) is not None


def test_the_top_level_is_what_a_service_needs_and_nothing_else() -> None:
    namespace: dict[str, object] = {}
    exec("from ambrosia_py import *", namespace)
    assert sorted(k for k in namespace if not k.startswith("__")) == TOP
    assert ambrosia_py.Immortal is binding.Immortal and ambrosia_py.rpc is binding.rpc


@pytest.mark.parametrize("cls", list(MEMBERS), ids=lambda c: c.__name__)
def test_public_members_are_pinned(cls: type) -> None:
    """A new public member is a new promise to users (and on Immortal, a name a service's
    own attributes or methods can no longer use)."""
    assert sorted(n for n in dir(cls) if not n.startswith("_")) == MEMBERS[cls]
