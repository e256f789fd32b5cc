"""examples/bank: account immortals transferring money across three linked coordinators.

Each account runs under ``ambrosia-py run`` with its own data directory, a fixed link port,
``--link-to`` for the others and its own copy of one cluster secret. The soak is a short
run of ``examples/bank/soak.py`` (``python -m examples.bank.soak`` runs a long one):
thousands of transfers while random account processes -- service, coordinator or both --
are SIGKILLed and restarted; then every transfer id must be debited once and credited
once, with the same amount, and the total must be unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ambrosia_py import eventloop
from examples.bank.soak import Audit, Bank, Report, Settings, SoakResult, audit, run_soak
from tests.etcd_server import EtcdServer, etcd_server

__all__ = ["etcd_server"]


def _assert_exactly_once(result: SoakResult, transfers: int) -> None:
    a = result.audit
    assert (a.transfers, a.debited, a.credited) == (transfers, transfers, transfers)
    assert a.lost == [], f"debited, never credited: {a.lost[:20]}"
    assert a.duplicated == [], f"credited twice: {a.duplicated[:20]}"
    assert a.unexpected == [], f"credited, never debited (or elsewhere): {a.unexpected[:20]}"
    assert a.wrong_amount == [], f"credited with another amount: {a.wrong_amount[:20]}"
    assert a.unbalanced == [], f"balance is not opening + credits - debits: {a.unbalanced}"
    assert a.total_after == a.total_before == 3 * 10_000
    assert a.ok


def test_three_accounts_complete_their_transfers(tmp_path: Path) -> None:
    """No crashes: three coordinators, three data directories, a few hundred transfers."""
    settings = Settings(transfers=300, kills=0, final_restart=False)
    result = run_soak(tmp_path, settings, progress=print)
    _assert_exactly_once(result, 300)
    assert result.kills == [] and result.final_restarts == 0


@pytest.mark.parametrize("loop", eventloop.LOOPS)
@pytest.mark.parametrize("seed", [7])
def test_transfers_are_exactly_once_across_sigkills(
    tmp_path: Path, seed: int, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3,000 transfers; six SIGKILLs at random points while they run (every account and
    every kind -- service, coordinator, both -- twice), each account restarted at once;
    then each account killed and restarted once more, and its recovered state compared
    with what it reported before. Once on each event loop (every process of the run)."""
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    monkeypatch.setenv(eventloop.LOOP_ENV, loop)
    settings = Settings(transfers=3000, kills=6, seed=seed)
    result = run_soak(tmp_path, settings, progress=print)
    _assert_exactly_once(result, 3000)
    assert len(result.kills) == 6
    assert sorted(k.kind for k in result.kills) == sorted(["service", "coordinator", "both"] * 2)
    assert sorted(k.account for k in result.kills) == ["a", "a", "b", "b", "c", "c"]
    # Kills land while transfers run, not after (spaced by the credited count).
    assert all(k.credited < 3000 for k in result.kills), result.kills
    assert result.final_restarts == 3


def test_transfers_are_exactly_once_across_sigkills_with_the_registry_in_etcd(
    tmp_path: Path, etcd_server: EtcdServer
) -> None:
    """The soak with the accounts finding each other by name in etcd: no --link-to and
    no link port given anywhere. Fewer transfers and kills than above (each account and
    each kind once), as the same paths are exercised; the exactly-once check is the same."""
    settings = Settings(
        transfers=900,
        kills=3,
        seed=11,
        registry=f"{etcd_server.spec}?lease_ttl=1",
        cluster=f"bank{os.getpid()}",
    )
    (tmp_path / "shape").mkdir()
    shape = Bank(tmp_path / "shape", settings)
    for account in shape.accounts.values():
        assert "--registry" in account.args
        assert not {"--link-to", "--link-port"} & set(account.args), account.args
    result = run_soak(tmp_path / "soak", settings, progress=print)
    _assert_exactly_once(result, 900)
    assert sorted(k.kind for k in result.kills) == ["both", "coordinator", "service"]
    assert sorted(k.account for k in result.kills) == ["a", "b", "c"]
    assert all(k.credited < 900 for k in result.kills), result.kills
    assert result.final_restarts == 3


def _report(debits: list[tuple[str, int]], credits: dict[str, dict[str, int]]) -> Report:
    paid = sum(amount for _, amount in debits)
    received = sum(sum(c.values()) for c in credits.values())
    return {
        "opening": 100,
        "balance": 100 - paid + received,
        "debits": [list(d) for d in debits],
        "credits": credits,
        "credited": sum(len(c) for c in credits.values()),
        "duplicates": [],
    }


def test_the_audit_finds_lost_duplicated_and_wrong_transfers() -> None:
    """The soak's checker is not vacuous: each kind of mistake is named by transfer id."""
    good = {
        "a": _report([("b", 5), ("b", 7)], {}),
        "b": _report([], {"a": {"0": 5, "1": 7}}),
    }
    assert audit(good, {"a": 2, "b": 0}).ok
    lost = {"a": good["a"], "b": _report([], {"a": {"1": 7}})}
    found = audit(lost, {"a": 2, "b": 0})
    assert (found.lost, found.total_after, found.ok) == (["a:0"], 195, False)
    twice = {"a": good["a"], "b": {**good["b"], "duplicates": ["a:1"]}}
    assert audit(twice, {"a": 2, "b": 0}).duplicated == ["a:1"]
    wrong = {"a": good["a"], "b": _report([], {"a": {"0": 5, "1": 8}})}
    found = audit(wrong, {"a": 2, "b": 0})
    assert (found.wrong_amount, found.ok) == (["a:1"], False)
    elsewhere = {"a": {**good["a"], "credits": {"a": {"0": 5}}}, "b": good["b"]}
    found = audit(elsewhere, {"a": 2, "b": 0})
    assert (found.unexpected, found.unbalanced) == (["a:0"], ["a"])
    assert isinstance(found, Audit)
