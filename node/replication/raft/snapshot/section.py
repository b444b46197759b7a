"""The one registry of the snapshot's trailing sections.

After the state's records a snapshot holds optional sections, each one codec
value that starts with its name and section version: the policies, then
from machine version 2 on the machine section, and so on (sections.py).
Each is a Section subclass marked `@section(name, version, since)`: that
decorator is the only place a section is given its name, its section
version and the machine version from which it is written, and it fixes the
order sections are written and read in (registration order, which must
follow the machine versions). write_snapshot writes every section whose
`since` the state's machine version has reached; read_snapshot reads them
in the same order while bytes are left (a file of an older cluster ends
where its last section does) and calls each section's `derive` after its
place, present or not.

A member of a build that does not know a section refuses trailing bytes:
a new section is written only from the machine version on which every
member reads it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, TypeVar

from node.replication.machine.state import BrokerState
from node.replication.raft.snapshot.envelope import _Writer
from node.replication.raft.snapshot.message import _MessageReader, _MessageWriter


class Section:
    """One trailing section: how it is written and read."""

    name: ClassVar[str]  # the section's first field
    version: ClassVar[int]  # its second: the section version this build writes and reads
    since: ClassVar[int]  # the machine version from which it is written

    @classmethod
    def write(cls, w: _Writer, state: BrokerState, msgs: _MessageWriter) -> None:
        raise NotImplementedError

    @classmethod
    def read(cls, r: _MessageReader, state: BrokerState) -> None:
        raise NotImplementedError

    @classmethod
    def derive(cls, state: BrokerState) -> None:
        """After the section's place in the file, whether it was there or not:
        rebuild what the state derives from it (and what came before)."""


# the trailing sections, in the order they are written and read
SECTIONS: list[type[Section]] = []

_S = TypeVar("_S", bound=type[Section])


def section(name: str, version: int, since: int) -> Callable[[_S], _S]:
    """Register the decorated Section as the next trailing section, named
    `name`, of section version `version`, written from machine version `since` on."""
    def register(cls: _S) -> _S:
        for other in SECTIONS:
            if other.name == name:
                raise TypeError(f"two snapshot sections named {name!r}: "
                                f"{other.__qualname__} and {cls.__qualname__}")
        if SECTIONS and since < SECTIONS[-1].since:
            raise TypeError(f"snapshot section {name!r} (machine version {since}) after "
                            f"{SECTIONS[-1].name!r} (machine version {SECTIONS[-1].since}): "
                            "a section is written after every section of older clusters")
        cls.name, cls.version, cls.since = name, version, since
        SECTIONS.append(cls)
        return cls
    return register
