"""amqplib (Node.js), callback and promise APIs, against a real node.

amqplib is installed with npm into a cache outside the repository
(MIRRORQ_NPM_CACHE, default ~/.cache/mirrorq-npm) when it is missing; the
tests skip only when node or npm is not installed (.ci/run installs them).

Found by amqplib's own callback_api tests: amqplib writes connection.close
ahead of publishes still buffered in its channel streams, and mirrorq closed
the socket right after close-ok, so those publishes met a RST that reached
amqplib before the close-ok: close's callback never ran and the client hung.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from node.amqp.config import ipv6_available
from tests.broker_proc import Broker

pytestmark = pytest.mark.slow  # Node.js and npm: make test-fast leaves it out

AMQPLIB = "amqplib@2"  # the major users get from `npm install amqplib` today
SCRIPT_TIMEOUT = 30.0  # a hang (the bug) shows up as this timeout


@pytest.fixture(scope="module")
def node_path() -> str:
    """NODE_PATH holding amqplib, installed once into the cache."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are not installed (.ci/run installs nodejs and npm)")
    cache = Path(os.environ.get("MIRRORQ_NPM_CACHE", Path.home() / ".cache" / "mirrorq-npm"))
    cache.mkdir(parents=True, exist_ok=True)
    modules = cache / "node_modules"
    with open(cache / ".install.lock", "w") as lock:  # parallel test runs install once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (modules / "amqplib" / "callback_api.js").exists():
            res = subprocess.run([npm, "install", "--prefix", str(cache), "--no-audit", "--no-fund",
                                  "--loglevel=error", AMQPLIB], capture_output=True, text=True,
                                 timeout=300, stdin=subprocess.DEVNULL)
            assert res.returncode == 0, f"npm install {AMQPLIB} failed: {res.stderr[-2000:]}"
    return str(modules)


def run_node(node_path: str, tmp_path: Path, script: str, url: str) -> list[dict[str, Any]]:
    """Run `script` (it prints one JSON object per line) with the URL as argv[2]; it
    must end by itself, i.e. leave no socket or timer behind, within the deadline."""
    path = tmp_path / "client.js"
    path.write_text(script)
    try:
        res = subprocess.run(["node", str(path), url], capture_output=True, text=True,
                             timeout=SCRIPT_TIMEOUT, stdin=subprocess.DEVNULL,
                             env={**os.environ, "NODE_PATH": node_path})
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"amqplib client hung for {SCRIPT_TIMEOUT:g}s; output so far: "
                             f"{exc.stdout!r} {exc.stderr!r}") from exc
    events = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert res.returncode == 0, f"exit {res.returncode}: {events} {res.stderr[-2000:]}"
    return events


CALLBACK_CONFIRM = r"""
const amqp = require('amqplib/callback_api');
const say = (o) => console.log(JSON.stringify(o));
process.on('exit', (code) => say({event: 'exit', code}));
function fail(where, err) { say({event: 'error', where, message: String(err && err.message)});
                            process.exitCode = 1; }

// 1. amqplib's own "Receive confirmation": a confirm channel, a publish to exchange ''
//    with routing key '' (unroutable), its callback, then close
amqp.connect(process.argv[2], (err, conn) => {
  if (err) return fail('connect', err);
  conn.on('error', (e) => fail('connection', e));
  conn.createConfirmChannel((err, ch) => {
    if (err) return fail('channel', err);
    ch.publish('', '', Buffer.from('foo'), {}, (err) => {
      if (err) return fail('confirm', err);
      say({event: 'acked'});
      conn.close((err) => {
        if (err) return fail('close', err);
        say({event: 'closed'});
        flood();
      });
    });
  });
});

// 2. amqplib's "find high watermark": publish until the channel's buffer is full, then
//    close at once (amqplib writes connection.close ahead of the buffered publishes)
function flood() {
  amqp.connect(process.argv[2], (err, conn) => {
    if (err) return fail('connect 2', err);
    conn.on('error', (e) => fail('connection 2', e));
    conn.createConfirmChannel((err, ch) => {
      if (err) return fail('channel 2', err);
      ch.assertQueue('', {exclusive: true}, (err, ok) => {
        if (err) return fail('declare', err);
        let n = 0;
        while (ch.sendToQueue(ok.queue, Buffer.from('x'.repeat(64)))) n++;
        say({event: 'buffered', n});
        conn.close((err) => {
          if (err) return fail('close 2', err);
          say({event: 'closed after flood'});
        });
      });
    });
  });
}
"""


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]"])
def test_amqplib_callback_api_confirm_channel_acks_default_exchange_publish_and_closes(
        broker: Broker, node_path: str, tmp_path: Path, host: str) -> None:
    if host != "127.0.0.1":
        if not broker.own:
            pytest.skip("the IPv6 case needs a mirrorq node of its own")
        if not ipv6_available("::1"):
            pytest.skip("IPv6 is unavailable on this machine (no ::1)")
    url = f"amqp://{broker.user}:{broker.password}@{host}:{broker.amqp_port}/%2F"
    events = run_node(node_path, tmp_path, CALLBACK_CONFIRM, url)
    names = [e["event"] for e in events]
    assert names == ["acked", "closed", "buffered", "closed after flood", "exit"], events
    assert events[2]["n"] > 0 and events[-1]["code"] == 0


PROMISE_API = r"""
const amqp = require('amqplib');
const say = (o) => console.log(JSON.stringify(o));
const N = 50;
(async () => {
  const conn = await amqp.connect(process.argv[2]);
  conn.on('error', (e) => say({event: 'error', message: e.message}));
  const ch = await conn.createConfirmChannel();
  const {queue} = await ch.assertQueue('', {exclusive: true});
  for (let i = 0; i < N; i++) ch.sendToQueue(queue, Buffer.from(`m${i}`), {persistent: true});
  await ch.waitForConfirms();
  say({event: 'confirmed', n: N});
  await new Promise((resolve) => {
    const got = [];
    ch.prefetch(10);
    ch.consume(queue, (m) => {
      got.push(m.content.toString());
      ch.ack(m);
      if (got.length === N) { say({event: 'consumed', got}); resolve(); }
    }, {noAck: false});
  });
  await ch.close();
  await conn.close();
  say({event: 'closed'});
})().catch((e) => { say({event: 'error', message: String(e && e.message)}); process.exitCode = 1; });
"""


def test_amqplib_promise_api_confirms_consume_ack_and_clean_close(
        broker: Broker, node_path: str, tmp_path: Path) -> None:
    events = run_node(node_path, tmp_path, PROMISE_API, broker.url)
    assert [e["event"] for e in events] == ["confirmed", "consumed", "closed"], events
    assert events[1]["got"] == [f"m{i}" for i in range(50)]  # all of them, in order
