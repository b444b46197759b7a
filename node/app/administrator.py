"""The admin operations on a cluster: users, vhosts, permissions, policies,
limits, topic permissions, global parameters (the cluster name), vhost
deletion protection, drain, membership.

Each is validated against the node's read model (the replicated state as of
its last Raft tick) and carried out as commands through the log (the raft
node's `commit`), plus, for membership, the Raft configuration change. This
is the admin layer's; raft_node only offers the primitives.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from node.broker.definition_limit import (
    DefinitionLimits,
    parameter_error,
    policy_count_error,
    policy_size_error,
)
from node.broker.limit import VHOST, limit_error, topic_pattern_error
from node.broker.loopback import is_loopback
from node.broker.parameter import CLUSTER_NAME, global_parameter_error
from node.broker.password import hash_password, password_hash_ok
from node.broker.permission import check_patterns
from node.broker.policy import policy_error
from node.broker.vhost import ProtectedFromDeletion, vhost_name_error
from node.replication.command import (
    Command,
    DropMember,
    GlobalParameterClear,
    GlobalParameterSet,
    LimitClear,
    LimitSet,
    PermissionClear,
    PermissionSet,
    PolicyClear,
    PolicySet,
    SetDraining,
    SetMember,
    TopicPermissionClear,
    TopicPermissionSet,
    UserDelete,
    UserPut,
    VhostDelete,
    VhostProtection,
    VhostPut,
)
from node.replication.machine.version import CLUSTER_METADATA, LIMITS
from node.replication.read_model import ReadModel
from node.replication.status import NodeStatus


class Replica(Protocol):
    """What the administrator needs of node.replication.raft_node.RaftNode."""

    @property
    def node_id(self) -> str: ...

    def read_model(self) -> ReadModel: ...
    async def commit(self, cmds: list[Command], timeout: float = 30.0) -> None: ...
    async def change_member(self, address: str, add: bool, timeout: float = 30.0) -> None: ...
    async def request_transfer(self, address: str | None, timeout: float) -> tuple[bool, str]: ...
    def peer_address(self, node_id: str) -> str | None: ...
    def add_member_refusal(self) -> str | None: ...
    async def wait_heard_from(self, address: str, timeout: float) -> None: ...
    def status(self) -> NodeStatus: ...


def member_address_refusal(address: str, links_authenticated: bool) -> str | None:
    """Why a member at `address` (HOST:PORT) cannot be added, or None."""
    host = address.rpartition(":")[0]
    if links_authenticated or is_loopback(host, peer=False):
        return None
    return (f"refusing to add a member at {address}: this cluster's Raft links are not "
            "authenticated (no [raft] password and no TLS), so anyone could claim that "
            "address; set a Raft password or TLS on every member first")


class Administrator:
    """Implements node.admin.service.Membership."""

    def __init__(self, replica: Replica, links_authenticated: bool = True,
                 limits: DefinitionLimits | None = None) -> None:
        self.replica = replica
        # policies per vhost, policy and global parameter sizes (checked before proposing)
        self.limits = limits or DefinitionLimits()
        # no Raft password and no TLS: a member elsewhere than loopback could be
        # impersonated by anyone who claims its address (issue 26)
        self.links_authenticated = links_authenticated
        # one change at a time, whichever API it came from (pysyncobj's own guard of
        # membership changes is dead code): a node has exactly one Administrator
        self._changing = asyncio.Lock()

    def read_model(self) -> ReadModel:
        return self.replica.read_model()

    # ------------------------------------------------------------ membership
    async def add_member(self, node_id: str, address: str, timeout: float = 30.0) -> None:
        """Record the member (out of sync), then change the Raft config."""
        refused = member_address_refusal(address, self.links_authenticated)
        if refused:
            raise ValueError(refused)
        async with self._changing:
            # before SetMember: a refused change must leave no member record behind
            short = self.replica.add_member_refusal()
            if short:
                raise RuntimeError(f"membership change refused: {short}")
            await self.replica.commit([SetMember(node_id, address, False)], timeout)
            await self.replica.change_member(address, add=True, timeout=timeout)

    async def remove_member(self, node_id: str, timeout: float = 30.0) -> None:
        """Replicate DropMember first, while the node still receives the log,
        so that it learns it was removed and stops serving; then change the
        Raft configuration (pysyncobj stops replicating to it at once)."""
        async with self._changing:
            r = self.replica
            address = r.peer_address(node_id)
            if address is None:
                raise KeyError(f"no member {node_id!r}")
            if node_id == r.node_id:
                raise RuntimeError("a node cannot remove itself; ask another member")
            await r.commit([DropMember(node_id)], timeout)
            # best effort: a dead node never answers
            await r.wait_heard_from(address, min(timeout, 5.0))
            await r.change_member(address, add=False, timeout=timeout)

    async def transfer_leadership(self, node_id: str | None = None, timeout: float = 10.0) -> str:
        """Hand leadership to `node_id` (or the most caught-up follower) with
        Raft's TimeoutNow, e.g. before this node is removed; returns the new
        leader's id. Must be asked of the leader."""
        async with self._changing:
            r = self.replica
            address = None
            if node_id is not None:
                address = r.peer_address(node_id)
                if address is None:
                    raise KeyError(f"no member {node_id!r}")
            deadline = time.monotonic() + timeout
            ok, why = False, "request_denied"
            # pysyncobj sends TimeoutNow only when the target's matchIndex equals
            # the leader's last index: under load, retry until a moment it does
            while not ok and why == "request_denied" and time.monotonic() < deadline:
                ok, why = await r.request_transfer(address, max(0.1, deadline - time.monotonic()))
                if not ok and why == "request_denied":
                    await asyncio.sleep(0.02)
            if not ok:
                raise RuntimeError(f"leadership transfer refused ({why}): ask the leader, "
                                   "and the target must be caught up")
            deadline = max(deadline, time.monotonic() + 5.0)
            while time.monotonic() < deadline:  # the request was sent; wait for the outcome
                leader = r.status().leader
                if leader not in (None, r.node_id) and (node_id is None or leader == node_id):
                    return str(leader)
                await asyncio.sleep(0.05)
            raise TimeoutError("no new leader after the transfer request")

    async def set_draining(self, node_id: str | None = None, draining: bool = True,
                           timeout: float = 30.0) -> None:
        """Maintenance mode on (drain) or off (revive) for a member, this node
        by default; returns once the command is applied here. The leader then
        keeps the member out of the in-sync set (while a majority remains)."""
        async with self._changing:
            node = node_id or self.replica.node_id
            if node not in self.read_model().members:
                raise KeyError(f"no member {node!r}")
            await self.replica.commit([SetDraining(node, draining)], timeout)

    # ------------------------------------------------- users, vhosts, permissions
    async def put_user(self, name: str, password: str, tags: tuple[str, ...] = (),
                       timeout: float = 30.0) -> None:
        async with self._changing:
            if not name:
                raise KeyError("a user needs a name")
            await self.replica.commit([UserPut(name, hash_password(password), tags)], timeout)

    async def put_user_hash(self, name: str, password_hash: str, tags: tuple[str, ...] = (),
                            timeout: float = 30.0) -> None:
        """A user with a stored hash as RabbitMQ exports it
        (rabbit_password_hashing_sha256: base64(salt + SHA-256(salt + password)))."""
        async with self._changing:
            if not name:
                raise KeyError("a user needs a name")
            if not password_hash_ok(password_hash):
                raise ValueError("password_hash is not a base64 salted SHA-256 hash")
            await self.replica.commit([UserPut(name, password_hash, tags)], timeout)

    async def delete_user(self, name: str, timeout: float = 30.0) -> None:
        async with self._changing:
            if name not in self.read_model().users:
                raise KeyError(f"no user {name!r}")
            await self.replica.commit([UserDelete(name)], timeout)

    async def put_vhost(self, name: str, timeout: float = 30.0, creator: str | None = None) -> None:
        """creator: the user creating it through the management API gets full
        permissions on a new vhost, in the same batch (RabbitMQ's
        rabbit_vhost:maybe_grant_full_permissions; none for a user it does not know)."""
        async with self._changing:
            why = vhost_name_error(name)
            if why is not None:
                raise ValueError(why)
            model = self.read_model()
            commands: list[Any] = [VhostPut(name)]
            if creator is not None and creator in model.users and name not in model.vhosts:
                commands.append(PermissionSet(creator, name, ".*", ".*", ".*"))
            await self.replica.commit(commands, timeout)

    async def delete_vhost(self, name: str, timeout: float = 30.0) -> None:
        """KeyError for an unknown vhost; ProtectedFromDeletion for one
        protected from deletion (apply keeps it too: a protection committed
        between the check and the delete wins)."""
        async with self._changing:
            model = self.read_model()
            if name not in model.vhosts:
                raise KeyError(f"no vhost {name!r}")
            if name in model.protected_vhosts:
                raise ProtectedFromDeletion(name)
            await self.replica.commit([VhostDelete(name)], timeout)
            if name in self.read_model().protected_vhosts:
                raise ProtectedFromDeletion(name)

    async def set_vhost_protection(self, name: str, protected: bool,
                                   timeout: float = 30.0) -> None:
        """Protect a vhost from deletion or lift it (RabbitMQ 4.x's
        enable/disable_protection_from_deletion); KeyError for an unknown
        vhost. Setting what is already set is no error."""
        async with self._changing:
            model = self.read_model()
            if name not in model.vhosts:
                raise KeyError(f"no vhost {name!r}")
            if (name in model.protected_vhosts) != protected:
                self._metadata_on()
                await self.replica.commit([VhostProtection(name, protected)], timeout)

    # -------------------------------------------------------- global parameters
    def _metadata_on(self) -> None:
        if not self.read_model().cluster_metadata_on:
            raise RuntimeError(f"global parameters and vhost deletion protection need machine "
                               f"version {CLUSTER_METADATA}: a member of this cluster runs an "
                               "older build")

    async def set_global_parameter(self, name: str, value: Any, timeout: float = 30.0) -> bool:
        """Create or replace a global runtime parameter (RabbitMQ's
        set_global); True when it is new. ValueError for a name or value the
        log cannot carry (node/broker/parameter.py)."""
        async with self._changing:
            why = global_parameter_error(name, value)
            if why is not None:
                raise ValueError(why)
            self._metadata_on()
            params = self.read_model().global_parameters
            new = name not in params
            why = parameter_error(name, value, len(params), new, self.limits)
            if why is not None:
                raise ValueError(why)
            await self.replica.commit([GlobalParameterSet(name, value)], timeout)
            return new

    async def clear_global_parameter(self, name: str, timeout: float = 30.0) -> None:
        """KeyError when it is not set (RabbitMQ's "Parameter does not exist")."""
        async with self._changing:
            if name not in self.read_model().global_parameters:
                raise KeyError(f"no global parameter {name!r}")
            await self.replica.commit([GlobalParameterClear(name)], timeout)

    async def set_cluster_name(self, name: str, timeout: float = 30.0) -> None:
        """RabbitMQ's rabbit_nodes:set_cluster_name: the global parameter
        "cluster_name"."""
        if not isinstance(name, str):
            raise ValueError("the cluster name must be a string")
        await self.set_global_parameter(CLUSTER_NAME, name, timeout)

    async def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str,
                              timeout: float = 30.0) -> None:
        async with self._changing:
            why = check_patterns(configure, write, read)
            if why is not None:
                raise ValueError(why)
            model = self.read_model()
            if user not in model.users:
                raise KeyError(f"no user {user!r}")
            if vhost not in model.vhosts:
                raise KeyError(f"no vhost {vhost!r}")
            await self.replica.commit([PermissionSet(user, vhost, configure, write, read)], timeout)

    async def clear_permissions(self, user: str, vhost: str, timeout: float = 30.0) -> None:
        async with self._changing:
            if (user, vhost) not in self.read_model().permissions:
                raise KeyError(f"user {user!r} has no permissions on vhost {vhost!r}")
            await self.replica.commit([PermissionClear(user, vhost)], timeout)

    # ------------------------------------------------------------- policies
    async def set_policy(self, vhost: str, name: str, pattern: Any, definition: Any,
                         priority: Any = 0, apply_to: Any = "all", operator: bool = False,
                         timeout: float = 30.0) -> bool:
        """Create or replace a policy (operator: an operator policy); True
        when it is new. KeyError for an unknown vhost, ValueError with
        RabbitMQ's "Validation failed" text for a policy it refuses."""
        async with self._changing:
            if not name:
                raise ValueError("a policy needs a name")
            why = (policy_size_error(name, pattern, definition, self.limits)
                   or policy_error(pattern, definition, priority, apply_to, operator))
            if why is not None:
                raise ValueError(f"Validation failed\n\n{why}\n")
            model = self.read_model()
            if vhost not in model.vhosts:
                raise KeyError(f"no vhost {vhost!r}")
            table = model.operator_policies if operator else model.policies
            new = (vhost, name) not in table
            if new:
                why = policy_count_error(vhost, sum(1 for v, _ in table if v == vhost),
                                         self.limits)
                if why is not None:
                    raise ValueError(f"Validation failed\n\n{why}\n")
            await self.replica.commit([PolicySet(operator, vhost, name, pattern, apply_to,
                                                 priority, dict(definition))], timeout)
            return new

    async def clear_policy(self, vhost: str, name: str, operator: bool = False,
                           timeout: float = 30.0) -> None:
        async with self._changing:
            model = self.read_model()
            table = model.operator_policies if operator else model.policies
            if (vhost, name) not in table:
                raise KeyError(f"no policy {name!r} in vhost {vhost!r}")
            await self.replica.commit([PolicyClear(operator, vhost, name)], timeout)

    # ------------------------------------------------ limits, topic permissions
    def _limits_on(self) -> None:
        if not self.read_model().limits_on:
            raise RuntimeError(f"limits and topic permissions need machine version {LIMITS}: "
                               "a member of this cluster runs an older build")

    async def set_limit(self, scope: str, owner: str, name: str, value: Any,
                        timeout: float = 30.0) -> None:
        """One limit of a vhost (scope "vhost") or user ("user"). KeyError for
        an unknown owner, ValueError with RabbitMQ's text for a bad limit."""
        async with self._changing:
            model = self.read_model()
            if owner not in (model.vhosts if scope == VHOST else model.users):
                raise KeyError(f"no {scope} {owner!r}")
            why = limit_error(scope, name, value)
            if why is not None:
                raise ValueError(f"Validation failed\n\n{why}\n" if scope == VHOST else why)
            self._limits_on()
            await self.replica.commit([LimitSet(scope, owner, name, int(value))], timeout)

    async def clear_limit(self, scope: str, owner: str, name: str = "",
                          timeout: float = 30.0) -> None:
        """Forget one limit (or all: name ""); KeyError for an unknown owner.
        Clearing a limit that is not set is no error (RabbitMQ's)."""
        async with self._changing:
            model = self.read_model()
            if owner not in (model.vhosts if scope == VHOST else model.users):
                raise KeyError(f"no {scope} {owner!r}")
            table = model.vhost_limits if scope == VHOST else model.user_limits
            limits = table.get(owner)
            if limits is None or (name and name not in limits):
                return
            await self.replica.commit([LimitClear(scope, owner, name)], timeout)

    async def set_topic_permissions(self, user: str, vhost: str, exchange: str, write: Any,
                                    read: Any, timeout: float = 30.0) -> bool:
        """True when new. KeyError for an unknown user or vhost."""
        async with self._changing:
            why = topic_pattern_error(write, read)
            if why is not None:
                raise ValueError(why)
            model = self.read_model()
            if user not in model.users:
                raise KeyError(f"no user {user!r}")
            if vhost not in model.vhosts:
                raise KeyError(f"no vhost {vhost!r}")
            self._limits_on()
            new = (user, vhost, exchange) not in model.topic_permissions
            await self.replica.commit([TopicPermissionSet(user, vhost, exchange, write, read)],
                                      timeout)
            return new

    async def clear_topic_permissions(self, user: str, vhost: str, exchange: str = "",
                                      timeout: float = 30.0) -> None:
        """One exchange's, or (exchange "") all of the user's in the vhost;
        KeyError when there is none."""
        async with self._changing:
            perms = self.read_model().topic_permissions
            if not any(u == user and v == vhost and (not exchange or x == exchange)
                       for u, v, x in perms):
                raise KeyError(f"user {user!r} has no topic permissions on vhost {vhost!r}")
            await self.replica.commit([TopicPermissionClear(user, vhost, exchange)], timeout)
