"""One registry for commands: the Command union (command.py), the codec's
records (codec.py) and the handler and reply-id tables that @handles fills
(node/replication/machine/handler.py) must agree, or a command would be
proposed that no node can decode or apply."""
from __future__ import annotations

import typing

from node.broker.ids import ChanId, ConnId
from node.replication import codec, command
from node.replication.machine import handler
from node.replication.machine.applier import Applier

COMMANDS = typing.get_args(command.Command)


def test_the_command_union_lists_each_command_once() -> None:
    assert len(COMMANDS) == len(set(COMMANDS)) > 30


def test_every_command_has_exactly_one_handler_and_nothing_else_has_one() -> None:
    # @handles refuses a second handler for a command at import time
    missing = [c.__name__ for c in COMMANDS if c not in handler.HANDLERS]
    extra = [c.__name__ for c in handler.HANDLERS if c not in COMMANDS]
    assert missing == [] and extra == []


def test_every_handler_is_the_appliers_own_method() -> None:
    # a mixin method shadowed by another one of the same name would never run
    for cmd, fn in handler.HANDLERS.items():
        assert getattr(Applier, fn.__name__) is fn, cmd.__name__


def test_reply_ids_are_declared_for_handled_commands_on_a_channel() -> None:
    for cmd in handler.REPLY_IDS:
        assert cmd in handler.HANDLERS, cmd.__name__
        assert "chan" in cmd._fields, cmd.__name__  # type: ignore[attr-defined]


def test_codec_records_are_the_commands_and_the_ids_and_batch() -> None:
    records = codec.RECORDS
    assert len(records) == len(set(records))
    assert set(records) == {ChanId, ConnId, command.Batch, *COMMANDS}
