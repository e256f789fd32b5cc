"""Throwaway TLS certificates for tests, made with the ``openssl`` command: a CA and a
certificate from it per name (EC P-256), as ``--tls-cert/--tls-key/--tls-ca`` options."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["mutual_tls", "needs_openssl"]

_DEADLINE = 60.0

needs_openssl = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="the openssl command makes the test certificates"
)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=_DEADLINE)


def mutual_tls(
    directory: Path, names: tuple[str, ...], ca_name: str = "ca"
) -> dict[str, tuple[str, ...]]:
    """A CA (``directory/<ca_name>.pem``) and a certificate from it per name: the
    options of mutual TLS, by name."""
    key_options = ("-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")
    ca, ca_key = directory / f"{ca_name}.pem", directory / f"{ca_name}.key"
    _openssl(
        *("req", "-x509", "-days", "2", *key_options, "-subj", f"/CN=test-{ca_name}"),
        *("-keyout", str(ca_key), "-out", str(ca)),
    )
    options: dict[str, tuple[str, ...]] = {}
    for name in names:
        key, csr, cert = (directory / f"{name}{ext}" for ext in (".key", ".csr", ".pem"))
        _openssl(
            *("req", *key_options, "-subj", f"/CN={name}"),
            *("-keyout", str(key), "-out", str(csr)),
        )
        _openssl(
            *("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key)),
            *("-CAcreateserial", "-out", str(cert), "-days", "2"),
        )
        options[name] = ("--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(ca))
    return options
