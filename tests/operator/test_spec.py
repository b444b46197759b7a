"""Spec.from_cr: what the operator refuses, with a one-line reason naming the field."""
from __future__ import annotations

import kopf
import pytest
from mirrorq_operator.model import Spec, SpecError


def test_raft_tls_is_off_unless_named():
    assert Spec.from_cr({}).raft_tls_secret is None
    assert Spec.from_cr({"raftTls": None}).raft_tls_secret is None
    assert Spec.from_cr({"raftTls": {"secretName": "orders-raft-tls"}}).raft_tls_secret == "orders-raft-tls"
    assert Spec.from_cr({"raftTls": {"secretName": "a.b-c.d"}}).raft_tls_secret == "a.b-c.d"


@pytest.mark.parametrize(("spec", "words"), [
    ({"raftTls": "orders-raft-tls"}, "spec.raftTls must be an object"),
    ({"raftTls": {}}, "spec.raftTls.secretName is required"),
    ({"raftTls": {"secretName": ""}}, "spec.raftTls.secretName is required"),
    ({"raftTls": {"secretName": 7}}, "spec.raftTls.secretName is required"),
    ({"raftTls": {"secretName": "Orders_TLS"}}, "is not a Secret name"),
    ({"raftTls": {"secretName": "-orders"}}, "is not a Secret name"),
    ({"raftTls": {"secretName": "a" * 254}}, "is not a Secret name"),
    ({"raftTls": {"secretName": "ok", "caKey": "x"}}, "unknown field(s) caKey"),
    ({"config": {"raft.tls_cert": "/etc/x.pem"}}, "raft.tls_cert cannot be set in config"),
    ({"raftTls": {"secretName": "ok"}, "config": {"raft.tls_ca": "/x", "raft.tls_key": "/y"}},
     "raft.tls_ca, raft.tls_key cannot be set in config"),
])
def test_bad_raft_tls_is_refused_with_a_clear_error(spec, words):
    with pytest.raises(SpecError) as err:
        Spec.from_cr(spec)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, ValueError)


def test_auth_and_grace_period():
    assert Spec.from_cr({}).auth_secret is None and Spec.from_cr({"auth": None}).auth_secret is None
    assert Spec.from_cr({"auth": {"secretName": "orders-creds"}}).auth_secret == "orders-creds"
    assert Spec.from_cr({}).grace_seconds == 120
    assert Spec.from_cr({"terminationGracePeriodSeconds": None}).grace_seconds == 120
    assert Spec.from_cr({"terminationGracePeriodSeconds": 1}).grace_seconds == 1
    assert Spec.from_cr({"terminationGracePeriodSeconds": 600}).grace_seconds == 600


def test_amqps_keys_are_set_by_spec_tls_only():
    # other [tls] keys stay the user's (client certificate verification, say)
    spec = Spec.from_cr({"tls": {"secretName": "mq-tls"}, "config": {"tls.verify": "none"}})
    assert spec.tls_secret == "mq-tls" and spec.config == {"tls.verify": "none"}


@pytest.mark.parametrize(("spec", "words"), [
    ({"auth": "orders-creds"}, "spec.auth must be an object"),
    ({"auth": {}}, "spec.auth.secretName is required"),
    ({"auth": {"secretName": ""}}, "spec.auth.secretName is required"),
    ({"auth": {"secretName": 7}}, "spec.auth.secretName is required"),
    ({"auth": {"secretName": "Orders_Creds"}}, "spec.auth.secretName 'Orders_Creds' is not a Secret name"),
    ({"auth": {"secretName": "a" * 254}}, "is not a Secret name"),
    ({"auth": {"secretName": "ok", "username": "x"}}, "spec.auth: unknown field(s) username"),
    ({"terminationGracePeriodSeconds": 0}, "spec.terminationGracePeriodSeconds must be an integer >= 1"),
    ({"terminationGracePeriodSeconds": "120"}, "spec.terminationGracePeriodSeconds must be"),
    ({"terminationGracePeriodSeconds": True}, "spec.terminationGracePeriodSeconds must be"),
    ({"terminationGracePeriodSeconds": 1.5}, "spec.terminationGracePeriodSeconds must be"),
    ({"config": {"tls.port": "5671"}}, "tls.port cannot be set in config"),
    ({"tls": {"secretName": "mq-tls"}, "config": {"tls.key": "/k", "tls.cert": "/c"}},
     "tls.cert, tls.key cannot be set in config; name a kubernetes.io/tls Secret in spec.tls.secretName"),
    ({"imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy must be Always, IfNotPresent or Never"),
    ({"imagePullSecrets": ["regcred"]}, "spec.imagePullSecrets must be a list of {name: SECRET}"),
    ({"imagePullSecrets": [{"name": ""}]}, "spec.imagePullSecrets must be a list of {name: SECRET}"),
])
def test_bad_auth_grace_or_amqps_config_is_refused_with_a_clear_error(spec, words):
    with pytest.raises(SpecError) as err:
        Spec.from_cr(spec)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_image_pull_policy_and_secrets_reach_the_pods_only_when_set():
    """Absent: the pod template an older operator built (no roll on an operator upgrade)."""
    from mirrorq_operator.builders import build_statefulset

    plain = build_statefulset(Spec.from_cr({}), "mq", "ns1")["spec"]["template"]["spec"]
    assert "imagePullSecrets" not in plain and "imagePullPolicy" not in plain["containers"][0]
    spec = Spec.from_cr({"imagePullPolicy": "Never", "imagePullSecrets": [{"name": "a"}, {"name": "b"}]})
    pod = build_statefulset(spec, "mq", "ns1")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "a"}, {"name": "b"}]
    assert pod["containers"][0]["imagePullPolicy"] == "Never"


def test_handler_refuses_an_invalid_spec_permanently_and_says_why():
    """No resources from a spec it refuses (before observing anything); no retry
    until the spec changes; the reason lands in status.lastError."""
    from mirrorq_operator import handlers

    patch = kopf.Patch()
    with pytest.raises(kopf.PermanentError, match="spec.raftTls.secretName"):
        handlers.reconcile({"replicas": 3, "raftTls": {"secretName": "Bad_Name"}}, "mq", "ns1",
                           {"generation": 1}, {}, patch)
    assert patch["status"]["lastError"].startswith("invalid spec: spec.raftTls.secretName")
