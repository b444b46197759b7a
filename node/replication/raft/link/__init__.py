"""Peer links for pysyncobj: our own connections under its TCPTransport.

pysyncobj's own TcpConnection pickles, zlib-compresses and Fernet-encrypts
every message once per follower, on the Raft thread, and unpickles whatever
arrives. Here instead messages are codec-encoded, a link is authenticated
once when it opens, its frames carry MACs (without TLS) and its reads and
writes are bounded:

security.py    PeerSecurity: the link key (scrypt of the Raft password), mutual TLS contexts
frame.py       frame kinds and limits, the per-frame MAC
handshake.py   TLS then HELLO, CHALLENGE, PROOF, WELCOME (PROTOCOL); limits on strangers
connection.py  PeerLink: one link, its reads, writes and pings
transport.py   PeerTransport: TCPTransport over PeerLinks, the Raft port

The raft package (node/replication/raft/, this one included) is the only
one that imports pysyncobj.
"""
