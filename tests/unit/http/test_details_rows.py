"""The pure parts of the certificate-expiration check (the period, the
decision; a PEM file's validity is node.app.pki's: tests/unit/app/test_pki.py)
and of the quorum queue status rows."""
from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from node.http import health_check as hc
from node.http.resources.quorum_status import member_rows
from node.replication.status import NodeStatus, PeerStatus

DAY = 86400


def test_period_is_rabbitmq_s_units_and_reasons() -> None:
    assert hc.period_seconds("2", "days") == 2 * DAY
    assert hc.period_seconds("+1", "WEEKS") == 7 * DAY
    assert hc.period_seconds("12", "months") == 365 * DAY
    assert hc.period_seconds("-1", "years") == -365 * DAY
    for within in ("x", "1.5", "", " 1", "1_0", "++1", "١"):
        with pytest.raises(ValueError, match="Invalid expiration value."):
            hc.period_seconds(within, "fortnights")
    with pytest.raises(ValueError, match="Time unit not recognised"):
        hc.period_seconds("1", "fortnights")


def test_expiry_text_is_erlang_s_format() -> None:
    when = datetime.datetime(2027, 1, 5, 7, 3, 9, tzinfo=datetime.UTC).timestamp()
    assert hc.expiry_text(when) == "2027-01-05 7:03:09"


def test_certificate_expiration_lists_the_listeners_with_expiring_entries() -> None:
    now = 1_000_000_000.0
    soon, late = now + 10 * DAY, now + 1000 * DAY
    listeners = [
        {"node": "n1", "protocol": "amqp/ssl", "ip_address": "::", "port": 5671,
         "certfile": "c.pem", "cacertfile": "ca.pem",
         "certfile_validity": [soon, late], "cacertfile_validity": [late]},
        {"node": "n1", "protocol": "https", "ip_address": "127.0.0.1", "port": 15671,
         "certfile": "h.pem", "cacertfile": None,
         "certfile_validity": [late], "cacertfile_validity": None}]
    assert hc.certificate_expiration(listeners, now, 5 * DAY) == hc.OK
    status, body = hc.certificate_expiration(listeners, now, 20 * DAY)
    assert status == 503 and body["reason"] == "Certificates expiring"
    assert body["expired"] == [{
        "node": "n1", "protocol": "amqp/ssl", "interface": "::", "port": 5671,
        "certfile": "c.pem", "cacertfile": "ca.pem",
        "certfile_expires_on": [hc.expiry_text(soon)], "cacertfile_expires_on": []}]
    # an unusable entry fails whatever the period
    listeners[1]["certfile_validity"] = ["Certificate is not yet valid"]
    _, body = hc.certificate_expiration(listeners, now, 0)
    assert [x["certfile_expires_on"] for x in body["expired"]] == [
        ["Certificate is not yet valid"]]


def _status(**kw: Any) -> NodeStatus:
    base: dict[str, Any] = {f.name: 0 for f in dataclasses.fields(NodeStatus)}
    base.update(node_id="n1", role="leader", leader="n1", term=3, commit_index=40,
                last_applied=39, log_len=10, members=["n1", "n2", "n3"], in_sync=[],
                draining=[], has_quorum=True, blocked=False, failed_batches={},
                confirm_latency={}, machine_version=5, peers=())
    base.update(kw)
    return NodeStatus(**base)


def test_member_rows_on_the_leader() -> None:
    peers = (PeerStatus("n2", "h:2", 38, True, False, 0.1, 5),
             PeerStatus("n3", "h:3", 0, False, True, None, 0))
    rows = member_rows(_status(peers=peers), (31, 41))
    assert rows == [
        {"Node Name": "n1", "Raft State": "leader", "Membership": "voter",
         "Last Log Index": 41, "Last Written": 41, "Last Applied": 39, "Commit Index": 40,
         "Snapshot Index": 31, "Term": 3, "Machine Version": 5},
        {"Node Name": "n2", "Raft State": "follower", "Membership": "voter",
         "Last Log Index": "", "Last Written": 38, "Last Applied": "", "Commit Index": "",
         "Snapshot Index": "", "Term": 3, "Machine Version": 5},
        {"Node Name": "n3", "Raft State": "noconnection", "Membership": "",
         "Last Log Index": "", "Last Written": "", "Last Applied": "", "Commit Index": "",
         "Snapshot Index": "", "Term": "", "Machine Version": ""}]


def test_member_rows_on_a_follower_and_before_a_snapshot() -> None:
    peers = (PeerStatus("n1", "h:1", 0, True, False, None, 0),
             PeerStatus("n3", "h:3", 0, True, False, None, 0))
    rows = member_rows(_status(node_id="n2", role="follower", peers=peers), (1, 41))
    assert [(r["Node Name"], r["Raft State"], r["Last Written"]) for r in rows] == [
        ("n1", "leader", ""), ("n2", "follower", 41), ("n3", "follower", "")]
    assert rows[1]["Snapshot Index"] == 0
