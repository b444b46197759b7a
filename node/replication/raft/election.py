"""Elections: when this member may campaign, and what it tells the others.

pysyncobj runs the Raft election itself (terms, RequestVote, votes); the
shim gates and hurries it:
- startup grace: a restarting member listens STARTUP_GRACE seconds before
  it may campaign (a fresh one of a new cluster need not), a joining one
  until a leader contacts it (quiet_timeouts);
- PreVote (Raft thesis §9.6): no term is raised without a majority's yes
  (_gate_election, _on_prevote, _on_prevote_reply);
- fast election: a follower whose leader's link broke campaigns at once,
  ranked by address (_on_link_lost);
- term notice: an AppendEntries from a stale term is answered with our term,
  so that a leader that missed an election steps down (_on_append_term,
  _on_term_notice);
- a raft thread held up past its election deadline does not campaign before
  it has read the leader's heartbeats (_defer_election).
ElectionMixin is the election half of RaftShim (shim.py); the messages it
sends are in messages.py.
"""
from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

from pysyncobj.monotonic import monotonic as clock
from pysyncobj.syncobj import _RAFT_STATE

from node.replication.config import RaftConfig
from node.replication.raft.messages import PREVOTE, PREVOTE_REPLY, TERM_NOTICE

if TYPE_CHECKING:
    from node.replication.raft.shim import _BrokerLog

log = logging.getLogger(__name__)

STARTUP_GRACE = 2.0  # seconds a restarted member listens before it may campaign


def quiet_timeouts(c: RaftConfig, fresh: bool = False) -> tuple[float, float] | None:
    """The election timeouts a node starts with, until it hears a leader (_Conf).
    `fresh`: its data directory holds no log and no snapshot yet."""
    # a node that campaigns before it has heard the leader deposes a healthy
    # one: a joining node stays quiet until a leader contacts it; a
    # restarting member waits a grace period first (a full-cluster restart
    # elects after it). A fresh member of a new cluster does not: an empty log
    # wins no PreVote against any member that holds an entry, nor while the
    # voters hear a leader (_on_prevote), so the grace only delayed the first
    # election of every new cluster (3.4 s to a leader instead of ~1.5)
    quiet: tuple[float, float] | None = None
    if c.join:
        quiet = (3600.0, 3601.0)
    elif c.peers and not fresh:
        quiet = (c.election_min + STARTUP_GRACE, c.election_max + STARTUP_GRACE)
    return quiet


class ElectionMixin:
    """RaftShim's election methods (raft thread)."""

    config: RaftConfig
    address: str
    _so: _BrokerLog | None
    leader_contact: float
    _leader_lost: bool
    _contact_node: Any
    _campaign_transfer: bool
    _prevote_term: int
    _prevote_grants: set[Any]
    _prevote_won: bool
    _term_noticed: dict[Any, float]
    deferred_elections: int
    prevote_rounds: int
    vote_floor: int
    fast_elections: int
    longest_leader_gap: float

    def _on_link_lost(self, node: Any) -> None:
        """A peer's link broke (raft thread). If it was our leader, campaign
        soon instead of after the election timeout: the survivors rank
        themselves by address (the first goes after ~20 ms, the next 150 ms
        later) so that they do not split the vote; PreVote still decides."""
        so = self._so
        if so is None or so._SyncObj__raftState != _RAFT_STATE.FOLLOWER or so._getLeader() != node:  # type: ignore[attr-defined]
            return
        self.leader_contact = 0.0
        self._contact_node = None
        self._leader_lost = True
        survivors = sorted([n.address for n in list(so.otherNodes) if n != node] + [self.address])
        rank = survivors.index(self.address)
        deadline = clock() + 0.02 + 0.15 * rank + random.uniform(0.0, 0.03)
        if so._SyncObj__raftElectionDeadline > deadline:  # type: ignore[attr-defined]
            so._SyncObj__raftElectionDeadline = deadline  # type: ignore[attr-defined]
            self.fast_elections += 1

    # ---------------------------------------------- elections (raft thread)
    def _gate_election(self, so: _BrokerLog, now: float) -> bool:
        """PreVote (Raft thesis §9.6): before pysyncobj may start an election
        (bump its term and ask for votes), ask the others whether they would
        vote: only with a majority's yes does the election go ahead. A member
        that is behind, slow or cut off thus never raises its term and
        never disrupts a healthy leader.

        True: pysyncobj may campaign in the coming tick. False: it must not,
        even if its deadline passes before its check (the tick's first steps,
        the meta file's once-a-second fsync, or the GIL can hold it up for
        longer than any margin here): _run hides the deadline for the tick."""
        if so._SyncObj__raftState == _RAFT_STATE.LEADER or not so.otherNodes:  # type: ignore[attr-defined]
            return True
        if so._SyncObj__transferInProgress:  # type: ignore[attr-defined]
            self._campaign_transfer = True  # the leader asked: no pre-vote
            return True
        if so._SyncObj__raftElectionDeadline > now + 2 * self.config.idle_tick:  # type: ignore[attr-defined]
            # a win set the deadline to 0: pushed since, a leader was heard after it
            self._prevote_won = False
            return False
        if self._prevote_won:
            self._prevote_won = False
            if so.raftCurrentTerm + 1 <= self.vote_floor:
                # nor does it vote for itself there: campaign in the term after
                so._SyncObj__setCurrentTerm(self.vote_floor, None)  # type: ignore[attr-defined]
            so._SyncObj__raftElectionDeadline = 0  # type: ignore[attr-defined]
            return True
        c = self.config
        # the next round: soon while the leader's link is known broken
        lo, hi = (0.15, 0.3) if self._leader_lost else (c.election_min, c.election_max)
        so._SyncObj__raftElectionDeadline = now + random.uniform(lo, hi)  # type: ignore[attr-defined]
        self._prevote_term = so.raftCurrentTerm + 1
        self._prevote_grants = set()
        self.prevote_rounds += 1
        last_index, last_term = self._log_tail(so)
        transport = so.transport()
        for node in list(so.otherNodes):
            transport.send_raw(node, {"type": PREVOTE, "term": self._prevote_term,
                                      "last_log_index": last_index, "last_log_term": last_term})
        return False

    @staticmethod
    def _log_tail(so: _BrokerLog) -> tuple[int, int]:
        journal = so._SyncObj__raftLog
        return (int(journal[-1][1]), int(journal[-1][2])) if len(journal) else (0, 0)

    def _leader_alive(self) -> bool:
        """A live leader is known: we lead and a majority answered within the
        minimum election timeout, or we follow one heard from within it."""
        so = self._so
        assert so is not None
        now = clock()
        bound = self.config.election_min
        if so._isLeader():
            fresh = sum(1 for t in list(so.last_response().values()) if now - t < bound)
            return fresh + 1 > (len(so.otherNodes) + 1) / 2
        return so._getLeader() is not None and now - self.leader_contact < bound

    def _on_prevote(self, node: Any, msg: dict[str, Any]) -> None:
        so = self._so
        assert so is not None
        term = int(msg.get("term", 0))
        theirs = (int(msg.get("last_log_term", 0)), int(msg.get("last_log_index", 0)))
        mine_index, mine_term = self._log_tail(so)
        granted = term > so.raftCurrentTerm and theirs >= (mine_term, mine_index) and not self._leader_alive()
        so.transport().send_raw(node, {"type": PREVOTE_REPLY, "term": term, "granted": granted})

    def _on_prevote_reply(self, node: Any, msg: dict[str, Any]) -> None:
        so = self._so
        assert so is not None
        if not msg.get("granted") or msg.get("term") != self._prevote_term \
                or so._SyncObj__raftState == _RAFT_STATE.LEADER:  # type: ignore[attr-defined]
            return
        self._prevote_grants.add(node)
        if len(self._prevote_grants) + 1 > (len(so.otherNodes) + 1) / 2:
            self._prevote_won = True
            so._SyncObj__raftElectionDeadline = 0  # type: ignore[attr-defined]

    def _on_append_term(self, node: Any, msg: dict[str, Any]) -> bool:
        """False: an AppendEntries from a stale term; tell its sender (at most
        once a second) so that a leader that missed an election steps down."""
        so = self._so
        assert so is not None
        term = int(msg.get("term", 0))
        now = clock()
        if term >= so.raftCurrentTerm:
            if node is self._contact_node and now - self.leader_contact > self.longest_leader_gap:
                self.longest_leader_gap = now - self.leader_contact  # heartbeats late or starved
            self._contact_node = node
            self.leader_contact = now
            self._leader_lost = False
            return True
        if now - self._term_noticed.get(node, 0.0) > 1.0:
            self._term_noticed[node] = now
            so.transport().send_raw(node, {"type": TERM_NOTICE, "term": so.raftCurrentTerm})
        return False

    def _on_term_notice(self, node: Any, msg: dict[str, Any]) -> None:
        so = self._so
        assert so is not None
        term = int(msg.get("term", 0))
        if term > so.raftCurrentTerm and so._isLeader():
            log.warning("stepping down: a member is at term %d, above ours (%d)", term, so.raftCurrentTerm)
            so._SyncObj__setCurrentTerm(term, None)  # type: ignore[attr-defined]
            so._SyncObj__setState(_RAFT_STATE.FOLLOWER)  # type: ignore[attr-defined]
            so._SyncObj__raftLeader = None  # type: ignore[attr-defined]
            c = self.config
            so._SyncObj__raftElectionDeadline = clock() + random.uniform(c.election_min, c.election_max)  # type: ignore[attr-defined]

    def _defer_election(self, so: _BrokerLog, now: float) -> None:
        if so._SyncObj__raftState != _RAFT_STATE.FOLLOWER:  # type: ignore[attr-defined]
            return
        deadline = now + self.config.election_min
        if so._SyncObj__raftElectionDeadline < deadline:  # type: ignore[attr-defined]
            so._SyncObj__raftElectionDeadline = deadline  # type: ignore[attr-defined]
            self.deferred_elections += 1

