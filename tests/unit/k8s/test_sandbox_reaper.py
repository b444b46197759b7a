"""k8s/sandbox_reaper.py's hand-encoded CRI messages, checked against protobuf
itself: the same four messages of runtime/v1alpha2 api.proto, built from a
descriptor here, must read what the reaper writes and write what it reads."""
from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from k8s.sandbox_reaper import deleted, list_request, parse_sandboxes, remove_request

F = descriptor_pb2.FieldDescriptorProto


def _messages() -> dict[str, Any]:
    fd = descriptor_pb2.FileDescriptorProto(name="cri_test.proto", package="runtime.v1alpha2")

    def msg(name: str, *fields: tuple[str, int, int, str | None, bool]) -> None:
        m = fd.message_type.add(name=name)
        for fname, number, ftype, type_name, repeated in fields:
            f = m.field.add(name=fname, number=number, type=ftype,
                            label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
            if type_name:
                f.type_name = f".runtime.v1alpha2.{type_name}"

    msg("PodSandboxStateValue", ("state", 1, F.TYPE_INT32, None, False))
    msg("PodSandboxFilter", ("id", 1, F.TYPE_STRING, None, False),
        ("state", 2, F.TYPE_MESSAGE, "PodSandboxStateValue", False))
    msg("ListPodSandboxRequest", ("filter", 1, F.TYPE_MESSAGE, "PodSandboxFilter", False))
    msg("PodSandboxMetadata", ("name", 1, F.TYPE_STRING, None, False),
        ("uid", 2, F.TYPE_STRING, None, False), ("namespace", 3, F.TYPE_STRING, None, False),
        ("attempt", 4, F.TYPE_UINT32, None, False))
    msg("PodSandbox", ("id", 1, F.TYPE_STRING, None, False),
        ("metadata", 2, F.TYPE_MESSAGE, "PodSandboxMetadata", False),
        ("state", 3, F.TYPE_INT32, None, False), ("created_at", 4, F.TYPE_INT64, None, False),
        ("runtime_handler", 7, F.TYPE_STRING, None, False))
    msg("ListPodSandboxResponse", ("items", 1, F.TYPE_MESSAGE, "PodSandbox", True))
    msg("RemovePodSandboxRequest", ("pod_sandbox_id", 1, F.TYPE_STRING, None, False))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"runtime.v1alpha2.{name}"))
            for name in ("ListPodSandboxRequest", "ListPodSandboxResponse", "RemovePodSandboxRequest")}


def test_requests_decode_as_the_cri_messages() -> None:
    m = _messages()
    req = m["ListPodSandboxRequest"].FromString(list_request(1))
    assert req.filter.state.state == 1 and req.filter.id == ""
    rm = m["RemovePodSandboxRequest"].FromString(remove_request("ab" * 32))
    assert rm.pod_sandbox_id == "ab" * 32


def test_a_list_response_with_every_field_parses_to_id_name_uid_namespace() -> None:
    m = _messages()
    resp = m["ListPodSandboxResponse"]()
    for i in range(3):
        box = resp.items.add(id=f"{i:064x}", state=1, created_at=1_700_000_000_000_000_000 + i,
                             runtime_handler="runc")
        box.metadata.name, box.metadata.uid = f"mirrorq-{i}", f"uid-{i}"
        box.metadata.namespace, box.metadata.attempt = "mq", 300 + i
    got = parse_sandboxes(resp.SerializeToString())
    assert got == [{"id": f"{i:064x}", "name": f"mirrorq-{i}", "uid": f"uid-{i}", "namespace": "mq"}
                   for i in range(3)]
    assert parse_sandboxes(b"") == []


def test_only_a_sandbox_of_a_pod_gone_replaced_or_being_deleted_is_reaped() -> None:
    assert deleted(None, "u1")
    assert deleted({"metadata": {"uid": "u2"}}, "u1")  # the StatefulSet's new pod, same name
    assert deleted({"metadata": {"uid": "u1", "deletionTimestamp": "2026-12-02T07:12:20Z"}}, "u1")
    assert not deleted({"metadata": {"uid": "u1"}}, "u1")  # a live pod's sandbox restarting
