"""The handshake of a Connection (a mixin of node/amqp/connection.py): the
connection-level methods (class 10), from Connection.StartOk to
Connection.Open and those that may come while running (Close, UpdateSecret):
login (PLAIN, AMQPLAIN; the login throttle; RabbitMQ's loopback_users rule),
tune, open, and the entry of an open connection in the replicated connection
table.
"""
from __future__ import annotations

import hmac
import platform
from typing import Any

from node.amqp import frame
from node.amqp.channel import ConnectionException
from node.amqp.endpoint import AWAIT_OPEN, AWAIT_START_OK, AWAIT_TUNE_OK, RUNNING, Endpoint
from node.broker.loopback import is_loopback
from node.broker.password import check_password
from node.broker.vhost import DEFAULT_VHOST
from node.replication.command import ConnectionOpen

VERSION = "0.1.0"

SERVER_PROPERTIES: dict[str, Any] = {
    "product": "mirrorq",
    "version": VERSION,
    "platform": f"Python {platform.python_version()}",
    "copyright": "mirrorq authors",
    "information": "Raft-mirrored AMQP 0-9-1 broker",
    "capabilities": {
        "publisher_confirms": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "exchange_exchange_bindings": True,
        "per_consumer_qos": True,
        "connection.blocked": True,
        "authentication_failure_close": True,
    },
}


class Handshake(Endpoint):
    """Connection's methods of the handshake and the connection class."""

    def _connection_method(self, m: frame.Method, payload: bytes) -> None:
        name = m.name
        phase = self.phase
        if name == "Connection.Close":
            self.write(frame.encode_method(0, "Connection.CloseOk"))
            self._linger()
            return
        if phase == AWAIT_START_OK and name == "Connection.StartOk":
            self._start_ok(m)
        elif phase == AWAIT_TUNE_OK and name == "Connection.TuneOk":
            self._tune_ok(m)
        elif phase == AWAIT_OPEN and name == "Connection.Open":
            vhost = m.virtual_host or DEFAULT_VHOST
            if vhost not in self.proposer.read_model().vhosts:
                raise ConnectionException(530, f"NOT_ALLOWED - vhost {vhost} not found", 10, 40)
            self.vhost = vhost
            refused = self._connection_limit_refusal()
            if refused is not None:  # RabbitMQ checks limits before access
                raise ConnectionException(530, refused, 10, 40)
            if self._patterns() is None:
                raise ConnectionException(530, f"NOT_ALLOWED - access to vhost '{vhost}' refused "
                                          f"for user '{self.user}'", 10, 40)
            full = self.open_gate() if self.open_gate is not None else None
            if full is not None:
                raise ConnectionException(530, f"NOT_ALLOWED - {full}", 10, 40)
            self.phase = RUNNING
            self.record_open()
            self.write(frame.encode_method(0, "Connection.OpenOk"))
        elif phase == RUNNING and name in ("Connection.CloseOk", "Connection.Blocked",
                                           "Connection.Unblocked"):
            pass
        elif phase == RUNNING and name == "Connection.UpdateSecret":
            self.write(frame.encode_method(0, "Connection.UpdateSecretOk"))
        else:
            cid, mid = frame.method_ids(payload)
            if phase == RUNNING:
                raise ConnectionException(
                    504, "CHANNEL_ERROR - unexpected method in connection state running", cid, mid)
            raise ConnectionException(503, f"COMMAND_INVALID - unexpected {name} during handshake",
                                      cid, mid)

    def record_open(self) -> None:
        """Put this open connection in the replicated connection table (that
        limits count and topic permissions read the user from) once the
        cluster's machine version has one: at connection.open, or at the
        switch for a connection opened before it (the server calls this)."""
        if self.in_table or self.phase != RUNNING or not self.proposer.read_model().limits_on:
            return
        self.in_table = True
        self.opened_in_log = True  # ConnectionClose owed at the end
        self.proposer.propose(ConnectionOpen(self.id, self.vhost, self.user))

    def _start_ok(self, m: frame.Method) -> None:
        props = m.client_properties or {}
        self.client_properties = props
        caps = props.get("capabilities") or {}
        if isinstance(caps, dict):
            self.cancel_notify = bool(caps.get("consumer_cancel_notify"))
            self.blocked_notify = bool(caps.get("connection.blocked"))
            self.auth_failure_close = bool(caps.get("authentication_failure_close"))
        mech = m.mechanism
        user, password = "", None
        response = m.response or ""
        if mech == "PLAIN":
            raw = response.encode("utf-8") if isinstance(response, str) else bytes(response)
            parts = raw.split(b"\x00")
            if len(parts) == 3:
                user, password = parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
        elif mech == "AMQPLAIN":
            table = frame.decode_amqplain(response)
            login, pw = table.get("LOGIN"), table.get("PASSWORD")
            if isinstance(login, bytes):
                login = login.decode("utf-8", "replace")
            if isinstance(pw, bytes):
                pw = pw.decode("utf-8", "replace")
            if isinstance(login, str) and isinstance(pw, str):
                user, password = login, pw
        gate, host, now = self.login_gate, self.peer_host or "", self.clock()
        wait = gate.wait(host, now, user) if gate is not None else 0.0
        if wait is None:  # this address's queue of held answers is full: not even checked
            self.connection_error(403, f"ACCESS_REFUSED - too many login attempts from {host}, "
                                       "retry later", 10, 11)
            return
        if wait > 0:
            self.hold_until = now + wait
            self.handshake_deadline += wait
        if password is not None and user in self.config.loopback_users \
                and not is_loopback(self.peer_host, peer=True):
            # RabbitMQ's loopback_users rule: guest only from this machine
            self.connection_error(403, f"ACCESS_REFUSED - user '{user}' can only connect via localhost",
                                  10, 11)
            return
        ok = password is not None and self._authenticate(user, password)
        if gate is not None:
            gate.record(host, ok, now, user)
        if not ok:
            if self.auth_failure_close:
                self.connection_error(
                    403, f"ACCESS_REFUSED - Login was refused using authentication mechanism {mech}.",
                    10, 11)
            else:
                self._finish()
            return
        self.user = user
        self.phase = AWAIT_TUNE_OK
        self.write(frame.encode_method(0, "Connection.Tune", {
            "channel_max": self.config.channel_max, "frame_max": self.config.frame_max,
            "heartbeat": self.config.heartbeat}))

    def _authenticate(self, user: str, password: str) -> bool:
        """The replicated users when the cluster has any, else this node's
        configured ones (a cluster bootstrapped before users were replicated)."""
        users = self.proposer.read_model().users
        if users:
            entry = users.get(user)
            return entry is not None and check_password(entry[0], password)
        expected = self.config.users.get(user)
        return expected is not None and hmac.compare_digest(expected.encode(), password.encode())

    def _tune_ok(self, m: frame.Method) -> None:
        def neg(ours: int, theirs: int) -> int:  # 0 means "no limit"
            if ours == 0:
                return theirs
            if theirs == 0:
                return ours
            return min(ours, theirs)

        self.channel_max = neg(self.config.channel_max, int(m.channel_max)) or 65535
        fmax = neg(self.config.frame_max, int(m.frame_max)) or 131072
        if fmax < 4096:
            raise ConnectionException(530, f"NOT_ALLOWED - frame_max={fmax} < 4096", 10, 31)
        self.frame_max = fmax
        self.reader.frame_max = fmax
        # The client's TuneOk heartbeat is the agreed value (it already saw ours);
        # taking a min here could time out a client that beats slower.
        self.heartbeat = int(m.heartbeat)
        self.phase = AWAIT_OPEN
