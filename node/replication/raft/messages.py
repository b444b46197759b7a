"""Our own Raft messages, beside pysyncobj's (append_entries, next_node_idx,
request_vote, ...). Each is a table with a "type", sent through the peer
transport (link/) as one codec-encoded frame; the shim (shim.py)
routes what arrives.

  {"type": MIRRORED, "index": i}                  leader -> followers: i is mirrored
  {"type": PREVOTE, "term": t, "last_log_index": i, "last_log_term": lt}
  {"type": PREVOTE_REPLY, "term": t, "granted": bool}
  {"type": TERM_NOTICE, "term": t}                to the sender of a stale AppendEntries
"""
from __future__ import annotations

MIRRORED = "mq_mirrored"  # our transport message: leader -> followers
PREVOTE, PREVOTE_REPLY = "mq_prevote", "mq_prevote_reply"  # Raft thesis §9.6
TERM_NOTICE = "mq_term"  # "your term is behind mine": a stale leader steps down
