"""Virtual hosts: how a (vhost, name) pair becomes one key of the broker's
exchange and queue tables (pure).

The default vhost "/" keeps plain names, so its keys are what clients see;
other vhosts prefix the name with the vhost and a NUL, a byte that may
appear in no vhost and (enforced by the state machine) in no resource name,
so keys of different vhosts never collide.
"""
from __future__ import annotations

from typing import NewType

DEFAULT_VHOST = "/"
SEP = "\x00"

# A table key, vhost-qualified: not interchangeable with a bare resource name
# (an error text built from a bare name named vhost "/" for a queue of vhost "v").
ResourceKey = NewType("ResourceKey", str)


def resource_key(vhost: str, name: str) -> ResourceKey:
    return ResourceKey(name if vhost == DEFAULT_VHOST else f"{vhost}{SEP}{name}")


def split_key(key: str) -> tuple[str, str]:
    """(vhost, name) of a table key."""
    vhost, sep, name = key.partition(SEP)
    return (vhost, name) if sep else (DEFAULT_VHOST, key)


def vhost_name_error(name: str) -> str | None:
    """Why `name` cannot be a vhost, or None."""
    if not name:
        return "a vhost needs a name"
    if SEP in name:
        return "a vhost name cannot contain NUL"
    if len(name.encode()) > 255:
        return "a vhost name is at most 255 bytes"
    return None


def deletion_refused(name: str) -> str:
    """RabbitMQ 4.x's answer to deleting a vhost protected from deletion
    (rabbit_mgmt_wm_vhost: 412 precondition_failed with this reason)."""
    return f"Refusing to delete virtual host '{name}' because it is protected from deletion"


def protection_of_missing(name: str, enable: bool) -> str:
    """rabbit_mgmt_wm_vhost_deletion_protection's 404 reason for a vhost
    that does not exist."""
    what = "enable" if enable else "disable"
    return (f"Cannot {what} deletion protection of virtual host '{name}' because it does "
            "not exist")


class ProtectedFromDeletion(RuntimeError):
    """A vhost protected from deletion was asked to be deleted (its text is
    deletion_refused's)."""

    def __init__(self, name: str) -> None:
        super().__init__(deletion_refused(name))
        self.vhost = name
