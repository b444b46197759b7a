"""The process harness under the tests, chaos experiments, bench and soak: real mirrorq
node processes and clusters (process), the one raw AMQP client (amqp), random
checksummed bodies (body), confirm-tracking publishers (publisher), pika-side helpers
and checks (client), and per-node data filesystems (datafs, slowfs). Imports none of
tests, chaos, bench, soak or k8s."""
