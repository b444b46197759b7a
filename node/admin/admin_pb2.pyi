from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node_id", "role", "leader", "term", "commit_index", "last_applied", "log_len", "members", "in_sync", "draining", "has_quorum", "mirrored_index", "blocked", "pending_batches", "resends", "nacked_publishes", "journal_flushes", "snapshots", "last_snapshot_seconds", "last_snapshot_bytes", "applied_batches", "message_bytes", "connections", "amqp_port", "queues", "amqps_port", "machine_version", "runs_machine_version", "extra")
    class ExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_APPLIED_FIELD_NUMBER: _ClassVar[int]
    LOG_LEN_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    HAS_QUORUM_FIELD_NUMBER: _ClassVar[int]
    MIRRORED_INDEX_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_FIELD_NUMBER: _ClassVar[int]
    PENDING_BATCHES_FIELD_NUMBER: _ClassVar[int]
    RESENDS_FIELD_NUMBER: _ClassVar[int]
    NACKED_PUBLISHES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_FLUSHES_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_BYTES_FIELD_NUMBER: _ClassVar[int]
    APPLIED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    AMQP_PORT_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    AMQPS_PORT_FIELD_NUMBER: _ClassVar[int]
    MACHINE_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNS_MACHINE_VERSION_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    role: str
    leader: str
    term: int
    commit_index: int
    last_applied: int
    log_len: int
    members: _containers.RepeatedScalarFieldContainer[str]
    in_sync: _containers.RepeatedScalarFieldContainer[str]
    draining: _containers.RepeatedScalarFieldContainer[str]
    has_quorum: bool
    mirrored_index: int
    blocked: bool
    pending_batches: int
    resends: int
    nacked_publishes: int
    journal_flushes: int
    snapshots: int
    last_snapshot_seconds: float
    last_snapshot_bytes: int
    applied_batches: int
    message_bytes: int
    connections: int
    amqp_port: int
    queues: int
    amqps_port: int
    machine_version: int
    runs_machine_version: int
    extra: _containers.ScalarMap[str, str]
    def __init__(self, node_id: _Optional[str] = ..., role: _Optional[str] = ..., leader: _Optional[str] = ..., term: _Optional[int] = ..., commit_index: _Optional[int] = ..., last_applied: _Optional[int] = ..., log_len: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ..., in_sync: _Optional[_Iterable[str]] = ..., draining: _Optional[_Iterable[str]] = ..., has_quorum: _Optional[bool] = ..., mirrored_index: _Optional[int] = ..., blocked: _Optional[bool] = ..., pending_batches: _Optional[int] = ..., resends: _Optional[int] = ..., nacked_publishes: _Optional[int] = ..., journal_flushes: _Optional[int] = ..., snapshots: _Optional[int] = ..., last_snapshot_seconds: _Optional[float] = ..., last_snapshot_bytes: _Optional[int] = ..., applied_batches: _Optional[int] = ..., message_bytes: _Optional[int] = ..., connections: _Optional[int] = ..., amqp_port: _Optional[int] = ..., queues: _Optional[int] = ..., amqps_port: _Optional[int] = ..., machine_version: _Optional[int] = ..., runs_machine_version: _Optional[int] = ..., extra: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ("vhost",)
    VHOST_FIELD_NUMBER: _ClassVar[int]
    vhost: str
    def __init__(self, vhost: _Optional[str] = ...) -> None: ...

class QueueInfo(_message.Message):
    __slots__ = ("name", "vhost", "ready", "unacked", "consumers", "durable")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VHOST_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    UNACKED_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    DURABLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    vhost: str
    ready: int
    unacked: int
    consumers: int
    durable: bool
    def __init__(self, name: _Optional[str] = ..., vhost: _Optional[str] = ..., ready: _Optional[int] = ..., unacked: _Optional[int] = ..., consumers: _Optional[int] = ..., durable: _Optional[bool] = ...) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueInfo]
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueInfo, _Mapping]]] = ...) -> None: ...

class ChangeResponse(_message.Message):
    __slots__ = ("ok", "status")
    OK_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    status: NodeStatus
    def __init__(self, ok: _Optional[bool] = ..., status: _Optional[_Union[NodeStatus, _Mapping]] = ...) -> None: ...

class AddMemberRequest(_message.Message):
    __slots__ = ("node_id", "address")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class RemoveMemberRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class TransferLeadershipRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class TransferLeadershipResponse(_message.Message):
    __slots__ = ("ok", "status", "new_leader")
    OK_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NEW_LEADER_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    status: NodeStatus
    new_leader: str
    def __init__(self, ok: _Optional[bool] = ..., status: _Optional[_Union[NodeStatus, _Mapping]] = ..., new_leader: _Optional[str] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class ReviveRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class UserPutRequest(_message.Message):
    __slots__ = ("name", "password", "tags")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    password: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., password: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ...) -> None: ...

class UserDeleteRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UserListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class User(_message.Message):
    __slots__ = ("name", "tags")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ...) -> None: ...

class UserListResponse(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[User]
    def __init__(self, users: _Optional[_Iterable[_Union[User, _Mapping]]] = ...) -> None: ...

class VhostPutRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class VhostDeleteRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class VhostListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Vhost(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class VhostListResponse(_message.Message):
    __slots__ = ("vhosts",)
    VHOSTS_FIELD_NUMBER: _ClassVar[int]
    vhosts: _containers.RepeatedCompositeFieldContainer[Vhost]
    def __init__(self, vhosts: _Optional[_Iterable[_Union[Vhost, _Mapping]]] = ...) -> None: ...

class PermissionSetRequest(_message.Message):
    __slots__ = ("user", "vhost", "configure", "write", "read")
    USER_FIELD_NUMBER: _ClassVar[int]
    VHOST_FIELD_NUMBER: _ClassVar[int]
    CONFIGURE_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    user: str
    vhost: str
    configure: str
    write: str
    read: str
    def __init__(self, user: _Optional[str] = ..., vhost: _Optional[str] = ..., configure: _Optional[str] = ..., write: _Optional[str] = ..., read: _Optional[str] = ...) -> None: ...

class PermissionClearRequest(_message.Message):
    __slots__ = ("user", "vhost")
    USER_FIELD_NUMBER: _ClassVar[int]
    VHOST_FIELD_NUMBER: _ClassVar[int]
    user: str
    vhost: str
    def __init__(self, user: _Optional[str] = ..., vhost: _Optional[str] = ...) -> None: ...

class PermissionListRequest(_message.Message):
    __slots__ = ("vhost", "user")
    VHOST_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    vhost: str
    user: str
    def __init__(self, vhost: _Optional[str] = ..., user: _Optional[str] = ...) -> None: ...

class Permission(_message.Message):
    __slots__ = ("user", "vhost", "configure", "write", "read")
    USER_FIELD_NUMBER: _ClassVar[int]
    VHOST_FIELD_NUMBER: _ClassVar[int]
    CONFIGURE_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    user: str
    vhost: str
    configure: str
    write: str
    read: str
    def __init__(self, user: _Optional[str] = ..., vhost: _Optional[str] = ..., configure: _Optional[str] = ..., write: _Optional[str] = ..., read: _Optional[str] = ...) -> None: ...

class PermissionListResponse(_message.Message):
    __slots__ = ("permissions",)
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    permissions: _containers.RepeatedCompositeFieldContainer[Permission]
    def __init__(self, permissions: _Optional[_Iterable[_Union[Permission, _Mapping]]] = ...) -> None: ...

class PolicySetRequest(_message.Message):
    __slots__ = ("vhost", "name", "pattern", "definition_json", "priority", "apply_to", "operator")
    VHOST_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_JSON_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    APPLY_TO_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    vhost: str
    name: str
    pattern: str
    definition_json: str
    priority: int
    apply_to: str
    operator: bool
    def __init__(self, vhost: _Optional[str] = ..., name: _Optional[str] = ..., pattern: _Optional[str] = ..., definition_json: _Optional[str] = ..., priority: _Optional[int] = ..., apply_to: _Optional[str] = ..., operator: _Optional[bool] = ...) -> None: ...

class PolicyClearRequest(_message.Message):
    __slots__ = ("vhost", "name", "operator")
    VHOST_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    vhost: str
    name: str
    operator: bool
    def __init__(self, vhost: _Optional[str] = ..., name: _Optional[str] = ..., operator: _Optional[bool] = ...) -> None: ...

class PolicyListRequest(_message.Message):
    __slots__ = ("vhost", "operator")
    VHOST_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    vhost: str
    operator: bool
    def __init__(self, vhost: _Optional[str] = ..., operator: _Optional[bool] = ...) -> None: ...

class Policy(_message.Message):
    __slots__ = ("vhost", "name", "pattern", "apply_to", "definition_json", "priority")
    VHOST_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    APPLY_TO_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_JSON_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    vhost: str
    name: str
    pattern: str
    apply_to: str
    definition_json: str
    priority: float
    def __init__(self, vhost: _Optional[str] = ..., name: _Optional[str] = ..., pattern: _Optional[str] = ..., apply_to: _Optional[str] = ..., definition_json: _Optional[str] = ..., priority: _Optional[float] = ...) -> None: ...

class PolicyListResponse(_message.Message):
    __slots__ = ("policies",)
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    policies: _containers.RepeatedCompositeFieldContainer[Policy]
    def __init__(self, policies: _Optional[_Iterable[_Union[Policy, _Mapping]]] = ...) -> None: ...

class LimitSetRequest(_message.Message):
    __slots__ = ("scope", "owner", "name", "value")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    scope: str
    owner: str
    name: str
    value: int
    def __init__(self, scope: _Optional[str] = ..., owner: _Optional[str] = ..., name: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...

class LimitClearRequest(_message.Message):
    __slots__ = ("scope", "owner", "name")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    scope: str
    owner: str
    name: str
    def __init__(self, scope: _Optional[str] = ..., owner: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class LimitListRequest(_message.Message):
    __slots__ = ("scope",)
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    scope: str
    def __init__(self, scope: _Optional[str] = ...) -> None: ...

class Limit(_message.Message):
    __slots__ = ("scope", "owner", "name", "value")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    scope: str
    owner: str
    name: str
    value: int
    def __init__(self, scope: _Optional[str] = ..., owner: _Optional[str] = ..., name: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...

class LimitListResponse(_message.Message):
    __slots__ = ("limits",)
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    limits: _containers.RepeatedCompositeFieldContainer[Limit]
    def __init__(self, limits: _Optional[_Iterable[_Union[Limit, _Mapping]]] = ...) -> None: ...
