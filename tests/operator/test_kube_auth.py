"""kube.py and the cluster's credentials: the admin token read from the auth
Secret once per pass and carried by every admin call; NAME-default-user created
only without spec.auth; with spec.adminTls, NAME-admin-tls made once before the
StatefulSet and its CA and client certificate carried by every admin call, and
no call in clear without it. The Kubernetes and admin clients are stubbed (the
real ones: tests/operator/test_admin_tls_node.py, tests/k8s)."""
from __future__ import annotations

import base64
import string
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from mirrorq_operator import kube
from mirrorq_operator.model import (
    AddMember,
    CreateResources,
    DrainMember,
    NodeStatus,
    Observed,
    PodObs,
    RemoveMember,
    ReviveMember,
    ScaleStatefulSet,
    Spec,
    TransferLeadership,
)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class FakeCore:
    def __init__(self, secrets: dict[str, dict[str, str] | None]) -> None:
        self.secrets = secrets
        self.read: list[str] = []

    def read_namespaced_secret(self, name: str, namespace: str) -> Any:
        self.read.append(name)
        if name not in self.secrets:
            raise ApiException(status=404)
        return SimpleNamespace(data=self.secrets[name])

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
        return SimpleNamespace(data={"formed": "true"})

    def read_namespaced_pod(self, name: str, namespace: str) -> Any:
        return SimpleNamespace(status=SimpleNamespace(conditions=[
            SimpleNamespace(type="Ready", status="True")]))

    def read_namespaced_persistent_volume_claim(self, name: str, namespace: str) -> Any:
        return SimpleNamespace(metadata=SimpleNamespace(uid=f"uid-{name}"))

    def patch_namespaced_config_map(self, *args: Any) -> None:
        pass

    def patch_namespaced_service(self, *args: Any, **kw: Any) -> None:
        pass


class FakeNet:
    def patch_namespaced_network_policy(self, *args: Any, **kw: Any) -> None:
        pass


class FakeApps:
    def read_namespaced_stateful_set(self, name: str, namespace: str) -> Any:
        return SimpleNamespace(spec=SimpleNamespace(replicas=2,
                                                    template=SimpleNamespace(metadata=None)),
                               status=SimpleNamespace(ready_replicas=2))

    def patch_namespaced_stateful_set(self, *args: Any) -> None:
        pass


@pytest.fixture
def core(monkeypatch: pytest.MonkeyPatch) -> FakeCore:
    fake = FakeCore({"mq-default-user": {"username": b64("mirrorq"), "password": b64("pw"),
                                         "admin-token": b64("0123abcd")},
                     "no-token": {"username": b64("u"), "password": b64("p")},
                     "empty": None,
                     "garbage": {"admin-token": "not base64!"}})
    monkeypatch.setattr(kube.client, "CoreV1Api", lambda: fake)
    monkeypatch.setattr(kube.client, "AppsV1Api", FakeApps)
    monkeypatch.setattr(kube.client, "NetworkingV1Api", FakeNet)
    return fake


def test_admin_token_from_the_auth_secret(core: FakeCore) -> None:
    assert kube.read_admin_token("ns1", "mq-default-user") == "0123abcd"
    assert kube.read_admin_token("ns1", "no-token") is None  # optional key
    assert kube.read_admin_token("ns1", "missing") is None  # no Secret (yet)
    assert kube.read_admin_token("ns1", "empty") is None
    assert kube.read_admin_token("ns1", "garbage") is None


def test_observe_reads_the_token_once_and_status_calls_carry_it(
        core: FakeCore, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens: list[Any] = []

    def status(host: str, port: int, timeout: float, *, token: Any = None,
               **tls: Any) -> dict[str, Any]:
        tokens.append(token)
        return {"role": "leader", "leader": "mq-0", "members": ["mq-0", "mq-1"],
                "in_sync": ["mq-0", "mq-1"], "has_quorum": True}

    monkeypatch.setattr(kube, "call_status", status)
    plain = Spec(admin_tls=False)
    obs = kube.observe("mq", "ns1", 1, {}, auth_secret="mq-default-user", spec=plain)
    assert obs.admin_token == "0123abcd" and tokens == ["0123abcd", "0123abcd"]
    assert core.read == ["mq-default-user"]  # once per pass
    assert "0123abcd" not in repr(obs)  # never in a log line
    tokens.clear()
    obs = kube.observe("mq", "ns1", 1, {}, auth_secret="missing", spec=plain)
    # no token: none sent (not the operator's own $MIRRORQ_ADMIN_TOKEN either)
    assert obs.admin_token is None and tokens == ["", ""]


def _obs(token: str | None, tls: tuple[bytes, bytes, bytes] | None = None) -> Observed:
    leader = NodeStatus(role="leader", leader="mq-0", members=("mq-0", "mq-1"),
                        in_sync=("mq-0", "mq-1"), has_quorum=True)
    return Observed(name="mq", namespace="ns1", exists=True, sts_replicas=2, sts_ready=2,
                    pods=(PodObs(0, True, "u0", leader), PodObs(1, True, "u1", None)),
                    admin_token=token, admin_tls=tls)


@pytest.mark.parametrize(("token", "sent"), [("0123abcd", "0123abcd"), (None, "")])
def test_every_admin_call_carries_the_token(core: FakeCore, monkeypatch: pytest.MonkeyPatch,
                                            token: str | None, sent: str) -> None:
    seen: dict[str, Any] = {}

    def stub(call: str) -> Any:
        def fn(*args: Any, token: Any = "UNSET", **kw: Any) -> dict[str, Any]:
            seen[call] = token
            return {"status": {"members": ["mq-0", "mq-1"]}}
        return fn

    for call in ("call_add_member", "call_remove_member", "call_drain", "call_revive",
                 "call_transfer_leadership"):
        monkeypatch.setattr(kube, call, stub(call))
    spec, obs = Spec(replicas=2, admin_tls=False), _obs(token)
    for action in (AddMember("mq-1", "mq-1.mq-headless.ns1.svc:25672"), RemoveMember("mq-1"),
                   DrainMember("mq-1"), ReviveMember("mq-1"), TransferLeadership("mq-0")):
        kube.execute(action, spec, obs, {})
    assert seen == dict.fromkeys(("call_add_member", "call_remove_member", "call_drain",
                                  "call_revive", "call_transfer_leadership"), sent)


def test_default_user_secret_only_without_spec_auth(core: FakeCore,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []
    monkeypatch.setattr(kube, "_create", made.append)
    monkeypatch.setattr(kube, "pdb_version", lambda: "policy/v1")
    kube.execute(CreateResources(), Spec(admin_tls=False), _obs(None), {})
    secrets = {m["metadata"]["name"]: m for m in made if m["kind"] == "Secret"}
    assert list(secrets) == ["mq-raft", "mq-default-user"]  # before everything else
    assert [m["kind"] for m in made[:2]] == ["Secret", "Secret"]
    data = {k: base64.b64decode(v).decode() for k, v in secrets["mq-default-user"]["data"].items()}
    assert data["username"] == "mirrorq"
    assert len(data["password"]) == 24 and set(data["password"]) <= set(
        string.ascii_letters + string.digits)
    assert len(data["admin-token"]) == 32 and set(data["admin-token"]) <= set(string.hexdigits)
    made.clear()
    kube.execute(CreateResources(), Spec(auth_secret="orders-creds", admin_tls=False),
                 _obs(None), {})
    assert [m["metadata"]["name"] for m in made if m["kind"] == "Secret"] == ["mq-raft"]
    # a rebuilt StatefulSet may name NAME-default-user for the first time: made (409 = kept)
    made.clear()
    kube.execute(ScaleStatefulSet(2), Spec(admin_tls=False), _obs(None), {})
    # (the rolled-out template brings the exposure along: NAME-metrics, made if missing)
    assert [m["metadata"]["name"] for m in made if m["kind"] == "Secret"] == ["mq-default-user"]
    made.clear()
    kube.execute(ScaleStatefulSet(2), Spec(auth_secret="orders-creds", admin_tls=False),
                 _obs(None), {})
    assert [m["kind"] for m in made] == ["Service"]


ADMIN_CALLS = ("call_add_member", "call_remove_member", "call_drain", "call_revive",
               "call_transfer_leadership")
ACTIONS = (AddMember("mq-1", "mq-1.mq-headless.ns1.svc:25672"), RemoveMember("mq-1"),
           DrainMember("mq-1"), ReviveMember("mq-1"), TransferLeadership("mq-0"))


def test_admin_tls_secret_made_once_before_the_statefulset(
        core: FakeCore, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []
    monkeypatch.setattr(kube, "_create", made.append)
    monkeypatch.setattr(kube, "pdb_version", lambda: "policy/v1")
    kube.execute(CreateResources(), Spec(), _obs(None), {})
    names = [m["metadata"]["name"] for m in made]
    assert names.index("mq-admin-tls") < [m["kind"] for m in made].index("StatefulSet")
    (secret,) = [m for m in made if m["metadata"]["name"] == "mq-admin-tls"]
    core.secrets["mq-admin-tls"] = secret["data"]
    # it exists: no new CA on later passes (nor any key generation)
    made.clear()
    monkeypatch.setattr(kube.pki, "generate", lambda *a: pytest.fail("generated again"))
    kube.execute(CreateResources(), Spec(), _obs(None), {})
    kube.execute(ScaleStatefulSet(2), Spec(), _obs(None), {})
    assert "mq-admin-tls" not in [m["metadata"]["name"] for m in made]
    # spec.adminTls false: none made
    del core.secrets["mq-admin-tls"]
    made.clear()
    kube.execute(CreateResources(), Spec(admin_tls=False), _obs(None), {})
    assert "mq-admin-tls" not in [m["metadata"]["name"] for m in made]


def test_admin_calls_carry_the_ca_and_client_certificate_and_none_go_in_clear(
        core: FakeCore, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def stub(call: str) -> Any:
        def fn(*args: Any, **kw: Any) -> dict[str, Any]:
            seen[call] = {k: kw.get(k) for k in ("tls_ca", "tls_cert", "tls_key")}
            return {"status": {"members": ["mq-0", "mq-1"]}}
        return fn

    for call in ADMIN_CALLS:
        monkeypatch.setattr(kube, call, stub(call))
    tls = (b"CA", b"CERT", b"KEY")
    for action in ACTIONS:
        kube.execute(action, Spec(replicas=2), _obs("0123abcd", tls), {})
    assert seen == dict.fromkeys(ADMIN_CALLS, {"tls_ca": b"CA", "tls_cert": b"CERT",
                                               "tls_key": b"KEY"})
    seen.clear()
    for action in ACTIONS:  # adminTls on, the Secret missing: refused, nothing sent
        with pytest.raises(RuntimeError, match="mq-admin-tls"):
            kube.execute(action, Spec(replicas=2), _obs("0123abcd"), {})
    assert seen == {}
    # observe: the Secret read once, its CA and client certificate on every Status
    calls: list[dict[str, Any]] = []

    def status(host: str, port: int, timeout: float, **kw: Any) -> dict[str, Any]:
        calls.append(kw)
        return {"role": "leader", "leader": "mq-0", "members": ["mq-0", "mq-1"],
                "in_sync": ["mq-0", "mq-1"], "has_quorum": True}

    monkeypatch.setattr(kube, "call_status", status)
    obs = kube.observe("mq", "ns1", 1, {}, auth_secret="mq-default-user", spec=Spec())
    assert obs.admin_tls is None and calls == []  # no Secret: no call at all
    core.secrets["mq-admin-tls"] = {"ca.crt": b64("CA"), "client.crt": b64("CERT"),
                                    "client.key": b64("KEY")}
    obs = kube.observe("mq", "ns1", 1, {}, auth_secret="mq-default-user", spec=Spec())
    assert obs.admin_tls == tls and "KEY" not in repr(obs)  # never in a log line
    assert [c["tls_ca"] for c in calls] == [b"CA", b"CA"]
    assert all(c["tls_cert"] == b"CERT" and c["tls_key"] == b"KEY" for c in calls)
