"""Thin asyncio shell around Connection state machines: sockets, timers,
write batching and flow control (S11, publisher congestion, memory alarm).
Replicated state is read from the proposer's ReadModel only. A delivery
whose bytes are in the log is read here, on the event loop, before its
connection gets it (read_stored): the connection does no log I/O."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from typing import Any

from node.amqp.config import WireConfig
from node.amqp.connection import Connection, next_serial
from node.amqp.endpoint import CLOSED, HeldBytes
from node.amqp.log_limit import LogLimit, suppressed_note
from node.amqp.throttle import LoginThrottle
from node.amqp.tls import peer_common_name
from node.broker.ids import ConnId
from node.replication import message_store
from node.replication.effect import ConnectionFailure, Deliver, Effect, GetOk
from node.replication.message_store import LOOP_CACHE
from node.replication.port import Proposer

log = logging.getLogger(__name__)

TIMER_INTERVAL = 0.1  # drain, memory, disk and congestion checks
MEMORY_ALARM = "low on memory"  # the connection.blocked reason (RabbitMQ's words)
TICKS_PER_HEARTBEAT_CHECK = 5  # heartbeat and timeout checks every 0.5 s
TICKS_PER_CACHE_CHECK = 100  # the payload cache goes after 10 s without a read
WRITE_HIGH_WATER = 1024 * 1024
WRITE_LOW_WATER = 256 * 1024
_TCP_CLOSE, _TCP_CLOSE_WAIT = 7, 8  # Linux tcp_states.h (CLOSE_WAIT: the peer sent FIN)


class _Protocol(asyncio.Protocol):
    def __init__(self, server: AmqpServer, tls: ssl.SSLContext | None = None) -> None:
        self.server = server
        # amqps: the handshake is started here once the socket is counted (a handshake
        # in asyncio's listener came before any cap: idle sockets escaped them all)
        self.tls = tls
        self._early: list[bytes] | None = None  # bytes between the TLS handshake and conn
        self.conn: Connection | None = None
        self.transport: asyncio.Transport | None = None
        self.reading_paused = False
        self.peer_host = ""
        self.peer_cn: str | None = None  # subject CN of a verified client certificate (amqps)
        self._hold: asyncio.TimerHandle | None = None  # a throttled login's answer is due

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """At accept, before any byte (amqps: before TLS): the caps, then the
        TLS handshake or the connection."""
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        srv = self.server
        if srv.draining():  # maintenance mode: no new clients (the listener closes too)
            transport.abort()
            return
        peer = transport.get_extra_info("peername")
        self.peer_host = str(peer[0]) if peer else ""
        if not srv.admit_handshake(self):
            transport.abort()
            return
        if self.tls is None:
            self._open(transport)
            return
        transport.pause_reading()  # the ClientHello is for the TLS layer (start_tls resumes)
        self._early = []
        srv.start_tls(self, transport, self.tls)

    def tls_ready(self, transport: asyncio.Transport) -> None:
        """The TLS handshake is done: the connection starts on its transport."""
        self.transport = transport
        # maintenance mode began during the handshake, or the peer went since (its
        # connection_lost came before there was a connection to release)
        if self.server.draining() or transport.is_closing():
            self.server.forget(self)
            transport.abort()
            return
        early, self._early = self._early or [], None
        self._open(transport)
        for data in early:
            self.data_received(data)

    def _open(self, transport: asyncio.Transport) -> None:
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        srv = self.server
        self.peer_cn = peer_common_name(transport.get_extra_info("peercert"))
        # throttle and connection limit are asked when the client logs in and opens
        conn = Connection(srv.proposer, ConnId(srv.node_id, next_serial()), srv.config,
                          peer_host=self.peer_host or None, login_gate=srv.throttle,
                          open_gate=lambda: srv.admit_open(self), gauge=srv.held,
                          peers=srv.connections)
        self.conn = conn
        srv.conns[conn.id.serial] = self

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is None:
            if self._early is not None:  # TLS is up, tls_ready not yet run
                self._early.append(data)
            return
        try:
            conn.data_received(data)
        except Exception:  # never let one client take the node down
            log.exception("internal error on connection %s", conn.id)
            conn.connection_error(541, "INTERNAL_ERROR")
        self.flush()
        # a publish held (alarm, or over its buffer), or Raft congested: the kernel's
        # buffers push back from here
        if conn.input_held or (conn.published and not self.reading_paused
                               and self.server.publishers_must_wait()):
            self.pause_reading()

    def flush(self) -> None:
        conn = self.conn
        transport = self.transport
        if conn is None or transport is None:
            return
        if conn.held():  # a throttled login: its answer, and any hang-up, wait
            if self._hold is None and not transport.is_closing():
                transport.pause_reading()
                self._hold = asyncio.get_running_loop().call_later(
                    max(0.0, conn.hold_until - conn.clock()), self._release)
            return
        data = conn.take_output()
        if data and not transport.is_closing():
            transport.write(data)
        if conn.close_transport and not transport.is_closing():
            transport.close()

    def _release(self) -> None:
        self._hold = None
        transport = self.transport
        if transport is not None and not transport.is_closing() and not self.reading_paused:
            transport.resume_reading()
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._hold is not None:
            self._hold.cancel()
            self._hold = None
        self.server.forget(self)
        conn = self.conn
        if conn is not None:
            try:
                conn.connection_lost()
            except Exception:
                log.exception("error releasing connection %s", conn.id)
            self.server.conns.pop(conn.id.serial, None)

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.writing_paused = True  # hold credit: the queue stops pushing here

    def resume_writing(self) -> None:
        conn = self.conn
        if conn is not None:
            conn.writing_paused = False
            conn.grant_credit()
            conn.dirty.clear()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()

    def peer_gone(self) -> bool:
        """While reading is paused the loop does not see the peer go, so ask the
        kernel (TCP_INFO; unread data would hide an end of stream from a peek).
        Reset: gone. Ended (FIN) while over its own buffer: gone too, nothing
        it sent can be read any more. Ended otherwise: what it sent before is
        still read once the alarm or congestion ends, as before. Without this,
        a blocked connection whose client died held its bytes until a
        heartbeat write failed (never, with heartbeats off)."""
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None or not hasattr(socket, "TCP_INFO"):
            return False
        try:
            state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
        except OSError:
            return True
        conn = self.conn
        return state == _TCP_CLOSE or (state == _TCP_CLOSE_WAIT and conn is not None
                                       and conn.input_held and conn.over_buffer())

    def resume_reading(self) -> None:
        if self.conn is not None and self.conn.input_held:
            return  # frames wait unread: no more until they are taken
        if self.transport is not None and self.reading_paused:
            self.reading_paused = False
            if not self.transport.is_closing():
                self.transport.resume_reading()


class AmqpServer:
    def __init__(self, proposer: Proposer, node_id: str, config: WireConfig,
                 throttle: LoginThrottle | None = None,
                 memory: Callable[[], int] | None = None) -> None:
        self.proposer = proposer
        # the node's memory as the high-watermark sees it (the app's resident-set
        # gauge, node/app/memory.py); none: the bodies this node counts
        self._memory = memory or self.counted_bytes
        self.node_id = node_id
        self.config = config
        self.conns: dict[int, _Protocol] = {}
        # sockets between accept and connection.open, oldest first, and per address
        self.handshaking: dict[int, _Protocol] = {}
        self._handshaking_from: dict[str, int] = {}
        self.opened: set[int] = set()  # ids of protocols past connection.open (max_connections)
        self.refused_handshakes = 0  # sockets closed by the handshake caps (logged, debug)
        self._refusal_log = LogLimit()  # the refusals' WARNING lines, per cause
        self.alarm: str | None = None
        self.held = HeldBytes()  # bytes all connections hold (unfinished bodies, open tx)
        # one per node, shared with the management API's basic auth (node/app/node.py)
        self.throttle = throttle or throttle_from(config)
        self._disk_checked = float("-inf")
        self._disk_low_flag = False
        self._servers: list[asyncio.base_events.Server] = []
        self._tls_handshakes: set[asyncio.Task[None]] = set()  # amqps sockets in TLS
        self._timer: asyncio.Task[None] | None = None
        # (addresses, port, SSLContext or None for plain AMQP); None once closed: no reopening
        self._listen: list[tuple[list[str], int, ssl.SSLContext | None]] | None = None
        self._relisten: asyncio.Task[None] | None = None
        proposer.add_drain_listener(self._on_drain)
        # users, vhosts or permissions changed: close connections they revoke
        proposer.add_model_listener(lambda _model: self._check_access())

    async def start(self, hosts: list[str], port: int | None, tls_port: int | None = None,
                    ssl_context: ssl.SSLContext | None = None) -> None:
        """Listen on every address of `hosts` (e.g. "0.0.0.0" and "::": IPv6
        sockets are IPv6-only, so the two coexist) at `port` (plain AMQP; None:
        TLS-only) and at `tls_port` (amqps). Both listeners share every
        behaviour: connection limit, throttling, drain."""
        self._listen = []
        if port is not None:
            self._listen.append((hosts, port, None))
        if tls_port is not None:
            assert ssl_context is not None, "amqps needs an SSLContext"
            self._listen.append((hosts, tls_port, ssl_context))
        if not self.draining():  # a node restarted in maintenance mode stays closed
            await self._open_listeners()
        self._timer = asyncio.create_task(self._timer_loop())

    async def _open_listeners(self) -> None:
        """All or none: a half-open node would confuse the drain/revive bookkeeping."""
        assert self._listen is not None
        loop = asyncio.get_running_loop()
        servers: list[asyncio.base_events.Server] = []
        try:
            for hosts, port, ctx in self._listen:
                # amqps too is a plain listener: each socket is counted, then starts TLS
                servers.append(await loop.create_server(
                    lambda ctx=ctx: _Protocol(self, ctx), hosts, port,  # type: ignore[misc]
                    reuse_address=True))
        except BaseException:
            for server in servers:
                server.close()
            raise
        self._servers = servers

    def draining(self) -> bool:
        """This node is in maintenance mode (replicated SetDraining)."""
        return self.node_id in self.proposer.read_model().draining

    def _check_draining(self) -> None:
        """Maintenance mode (replicated SetDraining): close the listener and
        every client connection (registered ones were already closed by the
        state machine); reopen the listener when revived."""
        if self.draining():
            if self._servers:
                log.warning("node %s is draining: closing the AMQP listener(s) and %d connection(s)",
                            self.node_id, len(self.conns))
                for server in self._servers:
                    server.close()
                self._servers = []
            for proto in list(self.conns.values()):
                conn = proto.conn
                if conn is not None and conn.phase != CLOSED:
                    conn.force_close(320, f"CONNECTION_FORCED - node {self.node_id} is draining "
                                          "(maintenance mode)")
                    proto.flush()
        elif not self._servers and self._listen and self._relisten is None:
            log.info("node %s revived: reopening the AMQP listener(s)", self.node_id)
            self._relisten = asyncio.create_task(self._reopen())

    async def _reopen(self) -> None:
        try:
            await self._open_listeners()
        except OSError as exc:
            log.warning("cannot reopen the AMQP listener yet: %s", exc)
        finally:
            self._relisten = None

    def connection_count(self) -> int:
        return len(self.conns)

    def held_bytes(self) -> int:
        """Message bytes held by connections, not yet in a queue: unfinished
        bodies and open transactions (each connection's against max_connection_buffer)."""
        return self.held.total

    def counted_bytes(self) -> int:
        """Message bodies queued plus held by connections: a lower bound of the
        node's memory (per-message objects and the Raft log are not in it)."""
        return self.proposer.read_model().message_bytes + self.held.total

    def memory_used(self) -> int:
        """What the memory high-watermark compares (the process's resident set)."""
        return self._memory()

    # ------------------------------------------------------------ connection caps

    def admit_handshake(self, proto: _Protocol) -> bool:
        """A new socket, before any byte: at most max_handshakes_per_address from
        one address (a new one beyond is refused) and max_handshakes in all (the
        oldest is closed: idle sockets cannot keep a real client, whose handshake
        takes a few round trips, out). The handshake timeout closes the rest."""
        cfg, host = self.config, proto.peer_host
        from_host = self._handshaking_from.get(host, 0)
        if cfg.max_handshakes_per_address and from_host >= cfg.max_handshakes_per_address:
            self._refused("per-address", f"{from_host} sockets from {host} are in the AMQP handshake "
                          f"(max_handshakes_per_address): a new one is refused")
            return False
        if cfg.max_handshakes and len(self.handshaking) >= cfg.max_handshakes:
            oldest = next(iter(self.handshaking.values()))
            self._refused("total", f"{len(self.handshaking)} sockets are in the AMQP handshake "
                          f"(max_handshakes): the oldest, from {oldest.peer_host}, is closed")
            self.handshake_done(oldest)
            if oldest.transport is not None:
                oldest.transport.abort()
        self.handshaking[id(proto)] = proto
        self._handshaking_from[host] = from_host + 1
        return True

    def start_tls(self, proto: _Protocol, transport: asyncio.Transport,
                  ctx: ssl.SSLContext) -> None:
        """An admitted amqps socket's TLS handshake, within handshake_timeout
        (then the AMQP handshake has its own)."""
        task = asyncio.get_running_loop().create_task(self._tls(proto, transport, ctx))
        self._tls_handshakes.add(task)
        task.add_done_callback(self._tls_handshakes.discard)

    async def _tls(self, proto: _Protocol, transport: asyncio.Transport,
                   ctx: ssl.SSLContext) -> None:
        loop = asyncio.get_running_loop()
        secure: asyncio.Transport | None = None
        try:
            secure = await loop.start_tls(transport, proto, ctx, server_side=True,
                                          ssl_handshake_timeout=self.config.handshake_timeout)
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            log.debug("amqps handshake from %s failed: %s", proto.peer_host, exc)
        finally:  # also cancelled (shutdown): the socket goes, and its place in the caps
            if secure is None:
                transport.abort()
                self.forget(proto)
        if secure is not None:
            proto.tls_ready(secure)

    def handshake_done(self, proto: _Protocol) -> None:
        """The socket left the handshake (opened, evicted or gone)."""
        if self.handshaking.pop(id(proto), None) is not None:
            left = self._handshaking_from.get(proto.peer_host, 1) - 1
            if left > 0:
                self._handshaking_from[proto.peer_host] = left
            else:
                self._handshaking_from.pop(proto.peer_host, None)

    def forget(self, proto: _Protocol) -> None:
        """The socket is gone: it counts against no cap any more."""
        self.handshake_done(proto)
        self.opened.discard(id(proto))

    def connections(self) -> Iterator[Connection]:
        """This node's client connections (what its limits count exactly)."""
        return (p.conn for p in self.conns.values() if p.conn is not None)

    def admit_open(self, proto: _Protocol) -> str | None:
        """At connection.open (RabbitMQ checks connection_max there too): why it
        may not open, or None and it counts against max_connections from now on."""
        limit = self.config.max_connections
        if limit and len(self.opened) >= limit:
            return f"connection limit ({limit}) of node {self.node_id} is reached"
        self.handshake_done(proto)
        self.opened.add(id(proto))
        return None

    def _refused(self, cause: str, what: str) -> None:
        self.refused_handshakes += 1
        left_out = self._refusal_log.admit(cause, time.monotonic())
        if left_out is not None:  # at most one line per cause per 10 s under a flood
            log.warning("%s (%d refused so far)%s", what, self.refused_handshakes,
                        suppressed_note(left_out))

    # ------------------------------------------------------------ effects

    def dispatch(self, effects: list[Effect]) -> None:
        touched: dict[int, _Protocol] = {}
        conns = self.conns
        for e in effects:
            serial = e.conn.serial if isinstance(e, ConnectionFailure) else e.chan.conn
            proto = conns.get(serial)
            if proto is None or proto.conn is None:
                continue
            try:
                if isinstance(e, Deliver | GetOk) and e.stored is not None \
                        and proto.conn.delivers_to(e.chan):
                    e = read_stored(e)
                proto.conn.apply_effect(e)
            except Exception:
                log.exception("error applying %s", type(e).__name__)
                proto.conn.connection_error(541, "INTERNAL_ERROR")
            touched[serial] = proto
        for proto in touched.values():
            conn = proto.conn
            if conn is None:
                continue
            try:
                conn.end_dispatch()
            except Exception:
                log.exception("error flushing connection %s", conn.id)
                conn.connection_error(541, "INTERNAL_ERROR")
            proto.flush()
        self._check_alarms()

    # ------------------------------------------------------------ flow control

    def publishers_must_wait(self) -> bool:
        """Raft is congested: publishers' sockets are not read. (Alarms hold each
        connection at its next publish instead: Connection._hold_frame.)"""
        return self.proposer.is_congested()

    def _on_drain(self) -> None:
        self._update_reading()

    def _update_reading(self) -> None:
        wait = self.publishers_must_wait()
        for proto in list(self.conns.values()):
            conn = proto.conn
            if conn is None or not conn.published:
                continue
            if wait:
                proto.pause_reading()
            else:
                proto.resume_reading()

    def _disk_low(self) -> bool:
        """Free space on the data dir's filesystem under disk_free_limit
        (statvfs at most once a second; the last answer in between)."""
        limit, path = self.config.disk_free_limit, self.config.data_dir
        if limit <= 0 or not path:
            return False
        now = time.monotonic()
        if now - self._disk_checked >= 1.0:
            self._disk_checked = now
            try:
                st = os.statvfs(path)
                self._disk_low_flag = st.f_bavail * st.f_frsize < limit
            except OSError:
                self._disk_low_flag = False
        return self._disk_low_flag

    def _check_access(self) -> None:
        """Close connections whose user or vhost was deleted: run by the read
        model listener, i.e. only when users, vhosts or permissions (or the
        machine version: connections enter the connection table) changed."""
        for proto in list(self.conns.values()):
            conn = proto.conn
            why = conn.revoked() if conn is not None else None
            if conn is not None and why is not None:
                conn.force_close(320, f"CONNECTION_FORCED - {why}")
                proto.flush()
            elif conn is not None:
                conn.record_open()

    def _check_alarms(self) -> None:
        """Alarms that block publishers (consumers keep draining): memory
        high-watermark, disk free below the limit, or this node cut off from
        the majority (it could not make a publish safe)."""
        mark = self.config.memory_high_watermark
        if mark > 0 and self.memory_used() > mark:
            alarm: str | None = MEMORY_ALARM
        elif self._disk_low():
            alarm = "low on disk"
        else:
            alarm = self.proposer.blocked_reason()
        changed = alarm != self.alarm
        self.alarm = alarm
        for proto in list(self.conns.values()):
            conn = proto.conn
            if conn is None:
                continue
            # every pass, so connections opened during an alarm learn of it too
            if conn.set_blocked(alarm):
                proto.flush()
            if conn.input_held:  # the alarm ended, or a channel error freed its buffer
                conn.retry_input()
                if not conn.input_held:
                    proto.flush()
                    if not (conn.published and self.publishers_must_wait()):
                        proto.resume_reading()
        if changed:
            self._update_reading()

    async def _timer_loop(self) -> None:
        n = 0
        while True:
            await asyncio.sleep(TIMER_INTERVAL)
            n += 1
            try:
                self._check_draining()
                self._check_alarms()
                if not self.publishers_must_wait():
                    self._update_reading()
                if n % TICKS_PER_CACHE_CHECK == 0:
                    LOOP_CACHE.clear_if_idle()
                if n % TICKS_PER_HEARTBEAT_CHECK == 0:
                    for proto in list(self.conns.values()):
                        conn = proto.conn
                        if proto.reading_paused and proto.peer_gone():
                            assert proto.transport is not None
                            proto.transport.abort()  # connection_lost releases it
                            continue
                        if conn is not None:
                            conn.tick()
                            proto.flush()
            except Exception:
                log.exception("timer error")

    # ------------------------------------------------------------ shutdown

    async def close(self, reason: str = "shutdown") -> None:
        self._listen = None  # no reopening from here on
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
            self._timer = None
        for server in self._servers:
            server.close()
        for task in list(self._tls_handshakes):
            task.cancel()
        for proto in list(self.conns.values()):
            conn = proto.conn
            # also the CLOSED ones still lingering after their CloseOk (force_close
            # then writes nothing and just hangs up)
            if conn is not None and not conn.close_transport:
                conn.force_close(320, "CONNECTION_FORCED - broker forced connection closure "
                                      f"with reason '{reason}'")
            proto.flush()
        for server in self._servers:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 2.0)
        self._servers = []

    def _debug(self) -> dict[str, Any]:
        return {"connections": len(self.conns), "opened": len(self.opened),
                "handshaking": len(self.handshaking), "alarm": self.alarm}


def read_stored(e: Deliver | GetOk) -> Deliver | GetOk:
    """A delivery with its properties and body read back from the log here,
    on the event loop (message_store; a damaged record raises, so the
    connection fails instead of getting it)."""
    try:
        props, body = message_store.load(e.stored, e.props, e.body)
    except message_store.StoredMessageError as exc:
        if exc.damaged:  # as the raft thread does: never served; the restart repairs the log
            log.critical("raft log damaged: %s; exiting (the restart drops it and re-fetches)", exc)
            logging.shutdown()
            os._exit(3)
        raise
    if e.delivery_count >= 0 or e.acquired_count >= 0:
        props = message_store.with_delivery_count(props, e.delivery_count, e.acquired_count)
    # props, body and stored are the fifth, fourth and third last fields of both
    return tuple.__new__(type(e), (*e[:-5], props, body, None, *e[-2:]))  # type: ignore[no-any-return]


def throttle_from(config: WireConfig) -> LoginThrottle:
    return LoginThrottle(config.login_failure_limit, config.login_failure_window,
                         config.login_failure_delay, config.login_failure_max_delay,
                         address_limit=config.login_failure_address_limit)
