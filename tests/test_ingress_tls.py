"""The ingress in TLS: ``run --ingress`` with the links' ``--tls-cert/--tls-key/--tls-ca``
takes calls only in TLS, from clients whose certificate chains to the CA
(``ambrosia_py.client.tls_context``); the secret's handshake still runs inside it. A
certificate either side refuses is an error at once, not retried until the timeout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ambrosia_py.binding.loading import load_service
from ambrosia_py.client import CallTimeoutError, Client, IngressError, tls_context

from .certs import mutual_tls, needs_openssl
from .ingress_process import DEADLINE, RunProcess, free_port

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "counter.py"


@needs_openssl
def test_the_ingress_takes_the_links_tls(tmp_path: Path) -> None:
    counter: Any = load_service(str(EXAMPLE))
    certs = tmp_path / "certs"
    certs.mkdir()
    options = mutual_tls(certs, ("service", "client"))
    strangers = certs / "other"
    strangers.mkdir()
    mutual_tls(strangers, ("stranger",), ca_name="other")
    ca = certs / "ca.pem"
    data = tmp_path / "data"
    port = free_port()
    address = f"127.0.0.1:{port}"
    svc = RunProcess(EXAMPLE, data, port, *options["service"])
    try:
        good = tls_context(certs / "client.pem", certs / "client.key", ca)
        with Client(address, data_dir=data, tls=good, timeout=DEADLINE) as client:
            assert [client.call(counter.add, n, key=f"k{n}") for n in (1, 2, 3)] == [1, 3, 6]
            assert client.call(counter.add, 1, key="k1") == 1  # stored: TLS changes nothing
            assert client.info is not None and client.info.instance == "counter"

        # A service certificate from another CA: refused at once, with the reason.
        wrong_ca = tls_context(certs / "client.pem", certs / "client.key", strangers / "other.pem")
        with (
            Client(address, data_dir=data, tls=wrong_ca, timeout=DEADLINE) as client,
            pytest.raises(IngressError, match=r"TLS with .* refused: .*certificate verify"),
        ):
            client.call(counter.get)

        # No client certificate (the service has a CA: it requires one), or one from
        # another CA: the service refuses it, and the client says so at once.
        for name, tls in [
            ("none", tls_context(ca=ca)),
            ("stranger's", tls_context(strangers / "stranger.pem", strangers / "stranger.key", ca)),
        ]:
            with (
                Client(address, data_dir=data, tls=tls, timeout=DEADLINE) as client,
                pytest.raises(IngressError, match=r"TLS with .* refused: .* certificate") as no,
            ):
                client.call(counter.get)
            assert not isinstance(no.value, CallTimeoutError), name

        # A client without TLS gets no HELLO: nothing is said in clear.
        with Client(address, data_dir=data, timeout=3) as client, pytest.raises(CallTimeoutError):
            client.call(counter.get)

        with Client(address, data_dir=data, tls=good, timeout=DEADLINE) as client:
            assert client.call(counter.get) == 6  # nothing the refused clients sent ran
    finally:
        svc.stop()


def test_unreadable_certificate_files_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(IngressError, match=r"TLS certificate .*missing\.pem"):
        tls_context(tmp_path / "missing.pem")
