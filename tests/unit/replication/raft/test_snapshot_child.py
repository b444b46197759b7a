"""The forked snapshot writer lets go of every socket it inherited at once
(node/replication/raft/snapshot/child.py _close_sockets): a SIGKILLed node's child
takes a while to die, and while it held the listening ports a restarted
node could not bind them (CI: connection refused right after a kill -9)."""
from __future__ import annotations

import os
import socket

from node.replication.raft.snapshot.child import _close_sockets


def test_a_forked_child_closes_the_sockets_and_keeps_its_files(tmp_path: object) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    r, w = os.pipe()
    with open(os.devnull, "rb") as kept:
        pid = os.fork()
        if pid == 0:  # the child: as the snapshot writer does
            code = 1
            try:
                _close_sockets()
                try:
                    os.fstat(listener.fileno())
                    closed = b"0"
                except OSError:
                    closed = b"1"
                os.fstat(kept.fileno())  # a file stays open
                os.write(w, closed)
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        got = os.read(r, 1)
        _, status = os.waitpid(pid, 0)
    os.close(r)
    assert status == 0 and got == b"1"
    # the parent's listener is untouched
    c = socket.create_connection(("127.0.0.1", port), timeout=2)
    c.close()
    listener.close()
