"""Who a management request comes from, and what they may see and do (pure).

HTTP basic auth against the replicated users (salted SHA-256 as the AMQP
login checks them, node/broker/password.py), or, when the node has an
`[admin] token`, `Authorization: Bearer <token>` as an administrator.
RabbitMQ's tags: `administrator` does everything; `monitoring` reads
everything; `management` and `policymaker` see the objects of the vhosts
they have permissions on; a user with none of these tags cannot use the API.
`loopback_users` (guest) may log in only from loopback, as on AMQP.
"""
from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from node.broker.loopback import is_loopback
from node.broker.password import check_password
from node.http.server import HttpError

REALM = 'Basic realm="RabbitMQ Management"'
MANAGEMENT_TAGS = frozenset(("administrator", "monitoring", "management", "policymaker"))


def _unauthorized(reason: str) -> HttpError:
    return HttpError(401, "not_authorized", reason, {"WWW-Authenticate": REALM})


@dataclass(frozen=True)
class Principal:
    name: str
    tags: tuple[str, ...]
    token: bool = False  # authenticated by the admin token: administrator, full access

    @property
    def administrator(self) -> bool:
        return self.token or "administrator" in self.tags

    @property
    def monitor(self) -> bool:
        """May read every vhost's objects (administrator or monitoring)."""
        return self.administrator or "monitoring" in self.tags

    @property
    def policymaker(self) -> bool:
        return self.administrator or "policymaker" in self.tags


def parse_tags(value: object) -> tuple[str, ...]:
    """RabbitMQ accepts tags as a comma-separated string or a list."""
    if value is None:
        return ()
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, list):
        items = [str(v) for v in value]
    else:
        raise HttpError(400, "bad_request", "tags must be a string or a list")
    return tuple(t.strip() for t in items if t.strip())


def claimed_user(authorization: str) -> str:
    """The user name a Basic Authorization header claims, unchecked (what the
    login throttle keys on); "" for a bearer token or anything unreadable."""
    scheme, _, cred = authorization.partition(" ")
    if scheme.lower() != "basic":
        return ""
    try:
        raw = base64.b64decode(cred.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return ""
    return raw.partition(":")[0]


def authenticate(authorization: str | None, peer_host: str,
                 users: Mapping[str, tuple[str, tuple[str, ...]]],
                 configured: Mapping[str, str], loopback_users: list[str] | tuple[str, ...],
                 token: str | None) -> Principal:
    """The principal of a request, or 401 with RabbitMQ's realm."""
    if not authorization:
        raise _unauthorized("Not_Authorized")
    scheme, _, cred = authorization.partition(" ")
    scheme = scheme.lower()
    if scheme == "bearer":
        if token and hmac.compare_digest(cred.strip().encode(), token.encode()):
            return Principal("mirrorq-admin-token", ("administrator",), token=True)
        raise _unauthorized("Not_Authorized")
    if scheme != "basic":
        raise _unauthorized("Not_Authorized")
    try:
        raw = base64.b64decode(cred.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise _unauthorized("Not_Authorized") from None
    user, sep, password = raw.partition(":")
    if not sep:
        raise _unauthorized("Not_Authorized")
    if user in loopback_users and not is_loopback(peer_host, peer=True):
        raise _unauthorized(f"User '{user}' can only log in via localhost")
    if users:
        entry = users.get(user)
        if entry is None or not check_password(entry[0], password):
            raise _unauthorized("Not_Authorized")
        tags = tuple(entry[1])
    else:  # a cluster without replicated users yet: the node's configured ones, as on AMQP
        expected = configured.get(user)
        if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
            raise _unauthorized("Not_Authorized")
        tags = ("administrator",)
    if not MANAGEMENT_TAGS.intersection(tags):
        raise HttpError(403, "not_authorised", "Not management user")
    return Principal(user, tags)


def visible_vhosts(p: Principal, vhosts: Mapping[str, None],
                   permissions: Mapping[tuple[str, str], tuple[str, str, str]]) -> list[str]:
    """The vhosts whose objects `p` may list."""
    if p.monitor:
        return list(vhosts)
    return [v for v in vhosts if (p.name, v) in permissions]


def access_vhosts(p: Principal, vhosts: Mapping[str, None],
                  permissions: Mapping[tuple[str, str], tuple[str, str, str]]) -> list[str]:
    """The vhosts `p` may act in or read policies of: every one for an
    administrator, else those it has permissions on (RabbitMQ's
    list_login_vhosts; the monitoring tag only makes vhosts visible)."""
    if p.administrator:
        return list(vhosts)
    return [v for v in vhosts if (p.name, v) in permissions]


def require_vhost_access(p: Principal, vhost: str, vhosts: Mapping[str, None],
                         permissions: Mapping[tuple[str, str], tuple[str, str, str]]) -> None:
    """RabbitMQ's user_matches_vhost (is_authorized_vhost, is_authorized_policies):
    404 for an unknown vhost, 403 unless `p` is an administrator or has
    permissions on it, whatever its other tags (monitoring included)."""
    if vhost not in vhosts:
        raise HttpError(404, "not_found", "Object Not Found")
    if not p.administrator and (p.name, vhost) not in permissions:
        raise HttpError(403, "not_authorised", "User not authorised to access virtual host")


def require_admin(p: Principal) -> None:
    if not p.administrator:
        raise HttpError(403, "not_authorised", "Not administrator user")


def require_monitor(p: Principal) -> None:
    if not p.monitor:
        raise HttpError(403, "not_authorised", "Not monitor user")


def require_vhost(p: Principal, vhost: str, vhosts: Mapping[str, None],
                  permissions: Mapping[tuple[str, str], tuple[str, str, str]]) -> None:
    """404 for an unknown vhost, 403 when `p` may not see it."""
    if vhost not in vhosts:
        raise HttpError(404, "not_found", "Object Not Found")
    if not p.monitor and (p.name, vhost) not in permissions:
        raise HttpError(403, "not_authorised", f"Access refused to vhost '{vhost}'")
