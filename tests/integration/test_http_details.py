"""RabbitMQ 4.3 management routes mirrorq lacked (docs/management-api.md, "not
yet" before): GET /api/channels/{channel}, GET
/api/queues/quorum/{vhost}/{queue}/status and the certificate-expiration
health check, against one real node over HTTP. The node serves amqps and
HTTPS with a certificate valid for 30 days (its CA: 10 years), so the check
passes for a week and fails for two months. Before: each answered 404."""
from __future__ import annotations

import datetime
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from cryptography import x509

from node.app.pki import make_ca, make_member
from tests.broker_proc import NodeProcess, free_port, uniq, wait_for
from tests.support.http_api import T, amqp, api, user

CERT_DAYS = 30


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    tmp = tmp_path_factory.mktemp("http-details")
    make_ca(tmp / "tls")
    cert, key = make_member(tmp / "tls", "server", ["127.0.0.1"], days=CERT_DAYS)
    http_port, https_port = free_port(), free_port()
    n = NodeProcess(tmp / "n1", amqps=True,
                    extra_args=("--http-port", str(http_port), "--https-port", str(https_port)),
                    config=f'[tls]\ncert = "{cert}"\nkey = "{key}"\n')
    n.http_port = http_port  # type: ignore[attr-defined]
    n.https_port = https_port  # type: ignore[attr-defined]
    n.cert_path = cert  # type: ignore[attr-defined]
    n.start()
    try:
        def answers() -> bool:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/overview", timeout=2)
            except urllib.error.HTTPError:
                return True
            except OSError:
                return False
            return True
        wait_for(answers, timeout=20, what="the HTTP API")
        yield n
    finally:
        n.stop()


# ------------------------------------------------------------ /api/channels/{channel}

def test_one_channel_is_its_list_row_with_consumer_details(node: NodeProcess) -> None:
    who = user(node, "management")
    conn = amqp(node, who)
    try:
        ch = conn.channel()
        q = uniq("q")
        ch.queue_declare(q, durable=True)
        ch.basic_qos(prefetch_count=7)
        tag = ch.basic_consume(q, lambda *a: None)

        def listed() -> Any:
            rows = [r for r in api(node, "GET", "/api/channels").json()
                    if r["user"] == who[0] and r["consumer_count"] == 1]
            return rows[0] if rows else None
        row = wait_for(listed, timeout=T, what="the channel listed with its consumer")
        path = f"/api/channels/{quote(row['name'], safe='')}"
        r = api(node, "GET", path)
        assert r.status_code == 200, r.text
        one = r.json()
        extra = {"consumer_details", "publishes", "deliveries"}
        assert set(one) == set(row) | extra
        assert {k: v for k, v in one.items() if k not in extra} == row
        assert one["prefetch_count"] == 7
        assert one["publishes"] == [] and one["deliveries"] == []
        [c] = one["consumer_details"]
        assert c["consumer_tag"] == tag and c["queue"] == {"name": q, "vhost": "/"}
        assert c["channel_details"]["name"] == row["name"]
        assert c["prefetch_count"] == 7 and c["ack_required"] is True

        # is_authorized_user: its own user and monitoring users see it; another
        # non-monitoring user gets RabbitMQ's 401
        assert api(node, "GET", path, auth=who).status_code == 200
        assert api(node, "GET", path, auth=user(node, "monitoring")).status_code == 200
        other = api(node, "GET", path, auth=user(node, "management"))
        assert other.status_code == 401
        assert other.json() == {"error": "not_authorised",
                                "reason": "User not authorised to access object"}
        assert api(node, "GET", path, auth=None).status_code == 401
        assert api(node, "GET", path, auth=("guest", "wrong")).status_code == 401
        # only GET (and HEAD/OPTIONS) is routed
        assert api(node, "DELETE", path).status_code == 405
    finally:
        conn.close()


def test_missing_channel_is_404(node: NodeProcess) -> None:
    for name in ("nope", "n1.999999 (1)", "127.0.0.1:5672 -> 127.0.0.1:40000 (1)"):
        r = api(node, "GET", f"/api/channels/{quote(name, safe='')}")
        assert r.status_code == 404, name
        assert r.json() == {"error": "Object Not Found", "reason": "Not Found"}


# ------------------------------------------------ /api/queues/quorum/{vhost}/{queue}/status

STATUS_KEYS = ["Node Name", "Raft State", "Membership", "Last Log Index", "Last Written",
               "Last Applied", "Commit Index", "Snapshot Index", "Term", "Machine Version"]


def test_quorum_queue_status_lists_the_members(node: NodeProcess) -> None:
    q = uniq("qq")
    assert api(node, "PUT", f"/api/queues/%2F/{q}", json={
        "durable": True, "arguments": {"x-queue-type": "quorum"}}).status_code == 201
    r = api(node, "GET", f"/api/queues/quorum/%2F/{q}/status")
    assert r.status_code == 200, r.text
    [me] = r.json()
    assert list(me) == STATUS_KEYS
    assert me["Node Name"] == "n1" and me["Raft State"] == "leader"
    assert me["Membership"] == "voter"
    for key in ("Last Log Index", "Last Written", "Last Applied", "Commit Index",
                "Snapshot Index", "Term", "Machine Version"):
        assert isinstance(me[key], int), key
    assert me["Commit Index"] >= me["Last Applied"] > 0
    assert me["Last Log Index"] >= me["Commit Index"]
    assert me["Term"] >= 1 and me["Machine Version"] >= 1
    # a monitoring user (every vhost) may ask; without credentials: 401
    assert api(node, "GET", f"/api/queues/quorum/%2F/{q}/status",
               auth=user(node, "monitoring")).status_code == 200
    assert api(node, "GET", f"/api/queues/quorum/%2F/{q}/status", auth=None).status_code == 401


def test_quorum_status_of_a_classic_queue_is_503_and_missing_ones_404(node: NodeProcess) -> None:
    q = uniq("cq")
    assert api(node, "PUT", f"/api/queues/%2F/{q}", json={"durable": True}).status_code == 201
    r = api(node, "GET", f"/api/queues/quorum/%2F/{q}/status")
    assert r.status_code == 503
    assert r.json() == {"status": "failed", "reason": "classic_queue_not_supported"}
    r = api(node, "GET", "/api/queues/quorum/%2F/no-such-queue/status")
    assert r.status_code == 404
    assert r.json() == {"error": "Object Not Found", "reason": "Not Found"}
    assert api(node, "GET", f"/api/queues/quorum/no-such-vhost/{q}/status").status_code == 404
    # a user without access to the vhost
    name = uniq("u")
    assert api(node, "PUT", f"/api/users/{name}",
               json={"password": "pw", "tags": "management"}).status_code == 201
    assert api(node, "GET", f"/api/queues/quorum/%2F/{q}/status",
               auth=(name, "pw")).status_code == 403
    assert api(node, "POST", f"/api/queues/quorum/%2F/{q}/status").status_code == 405


# --------------------------------- /api/health/checks/certificate-expiration/{within}/{unit}

def expiry_text(when: datetime.datetime) -> str:
    return (f"{when.year}-{when.month:02}-{when.day:02} "
            f"{when.hour}:{when.minute:02}:{when.second:02}")


def test_certificate_expiration_ok_within_the_validity(node: NodeProcess) -> None:
    for within, unit in (("1", "days"), ("3", "weeks"), ("0", "months"), ("0", "years"),
                         ("2", "DAYS"), ("-5", "years")):
        r = api(node, "GET", f"/api/health/checks/certificate-expiration/{within}/{unit}")
        assert r.status_code == 200, (within, unit, r.text)
        assert r.json() == {"status": "ok"}


def test_certificate_expiration_fails_for_a_longer_period(node: NodeProcess) -> None:
    cert = x509.load_pem_x509_certificate(node.cert_path.read_bytes())  # type: ignore[attr-defined]
    expires = expiry_text(cert.not_valid_after_utc)
    for within, unit in (("2", "months"), ("5", "weeks"), ("31", "days"), ("1", "years")):
        r = api(node, "GET", f"/api/health/checks/certificate-expiration/{within}/{unit}")
        assert r.status_code == 503, (within, unit, r.text)
        body = r.json()
        assert body["status"] == "failed" and body["reason"] == "Certificates expiring"
        # the amqps listeners (one per address) and the HTTPS port, which serves
        # [tls]'s certificate
        assert {(x["protocol"], x["port"]) for x in body["expired"]} == {
            ("amqp/ssl", node.amqps_port), ("https", node.https_port)}  # type: ignore[attr-defined]
        for x in body["expired"]:
            assert x["node"] == "n1" and isinstance(x["interface"], str)
            assert x["certfile"] == str(node.cert_path)  # type: ignore[attr-defined]
            assert x["certfile_expires_on"] == [expires]
            assert x["cacertfile"] is None and x["cacertfile_expires_on"] == []
    # the CA (10 years) is not served: only the listener's certificate counts
    assert time.time() < cert.not_valid_after_utc.timestamp()


def test_certificate_expiration_bad_input(node: NodeProcess) -> None:
    base = "/api/health/checks/certificate-expiration"
    reason: str
    for within, unit, reason in (
            ("x", "days", "Invalid expiration value."),
            ("1.5", "days", "Invalid expiration value."),
            ("x", "fortnights", "Invalid expiration value."),  # the value is read first
            ("1", "fortnights", "Time unit not recognised. Supported units: days, weeks, "
                                "months, years."),
            ("1", "day", "Time unit not recognised. Supported units: days, weeks, "
                         "months, years.")):
        r = api(node, "GET", f"{base}/{within}/{unit}")
        assert r.status_code == 400, (within, unit)
        assert r.json() == {"error": "bad_request", "reason": reason}
    assert api(node, "GET", f"{base}/1/days", auth=None).status_code == 401
    assert api(node, "GET", f"{base}/1/days", auth=("guest", "wrong")).status_code == 401
    assert api(node, "GET", f"{base}/1").status_code == 404

