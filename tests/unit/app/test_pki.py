"""node.app.pki's reading of certificates: the validity of each PEM entry of
a listener's files (the certificate-expiration health check), and the
management backend handing it to node/http."""
from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from node.app.management import NodeBackend
from node.app.pki import file_validity, make_ca, make_member, pem_validity

DAY = 86400


def test_pem_validity_reads_each_entry(tmp_path: Path) -> None:
    make_ca(tmp_path)
    cert, key = make_member(tmp_path, "s", ["127.0.0.1"], days=30)
    now = datetime.datetime.now(datetime.UTC).timestamp()
    [until] = pem_validity(cert.read_bytes(), now)
    assert isinstance(until, float) and 29 * DAY < until - now <= 30 * DAY
    both = pem_validity(cert.read_bytes() + (tmp_path / "ca.pem").read_bytes(), now)
    assert len(both) == 2 and all(isinstance(x, float) for x in both)
    assert pem_validity(key.read_bytes(), now) == [
        "The certificate file provided contains a PRIVATE KEY entry"]
    assert pem_validity(b"nothing", now) == [
        "The certificate file provided does not contain any PEM entry."]
    assert pem_validity(cert.read_bytes(), now - 3600) == ["Certificate is not yet valid"]
    assert file_validity(None, now) is None
    [missing] = file_validity(str(tmp_path / "gone.pem"), now) or []
    assert isinstance(missing, str) and missing.startswith("cannot read")


def test_the_backend_hands_http_each_listener_s_validity(tmp_path: Path) -> None:
    make_ca(tmp_path)
    cert, _ = make_member(tmp_path, "s", ["127.0.0.1"], days=30)
    now = datetime.datetime.now(datetime.UTC).timestamp()
    tls_files: list[dict[str, Any]] = [
        {"protocol": "amqp/ssl", "ip_address": "::", "port": 5671,
         "certfile": str(cert), "cacertfile": str(tmp_path / "ca.pem")},
        {"protocol": "https", "ip_address": "127.0.0.1", "port": 15671,
         "certfile": str(tmp_path / "gone.pem"), "cacertfile": None}]
    backend = NodeBackend("n1", None, None, None, None, {}, [], None, [],  # type: ignore[arg-type]
                          tls_files=tls_files)
    rows = backend.certificate_validity(now)
    assert rows == [dict(x, node="n1", certfile_validity=file_validity(x["certfile"], now),
                         cacertfile_validity=file_validity(x["cacertfile"], now))
                    for x in tls_files]
    assert rows[0]["certfile_validity"] == pem_validity(cert.read_bytes(), now)
    assert rows[1]["cacertfile_validity"] is None
