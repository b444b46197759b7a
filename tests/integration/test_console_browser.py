"""The web console (node/http/static/) in a real headless Chromium, against a real
3-node cluster (issue 15).

The browser is Debian's `chromium`, driven over the DevTools protocol through
`--remote-debugging-pipe` (NUL-separated JSON on file descriptors 3 and 4): no
websocket client, no Playwright, no browser download. The test publishes
N messages to a queue with pika, logs in through the console's form, waits
(polling the DOM, with a deadline) until the page shows the 3 members, the
leader the API names and the queue with N messages, and writes a screenshot to
its tmp dir (and to $MIRRORQ_SCREENSHOT when set: that is how docs/console.png
is made, with a little traffic first so that the charts have lines).

Chromium comes from apt (`apt-get install -y chromium`, which .ci/run does);
if it is missing the test installs it when it can (root with apt-get) and skips
only when that is impossible. $MIRRORQ_CHROMIUM names another binary.
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from harness.process import Cluster, free_port, port_open

pytestmark = pytest.mark.slow  # headless Chromium: make test-fast leaves it out

N_MESSAGES = 37
PAGE_DEADLINE = 45.0
USER, PASSWORD = "guest", "guest"


@pytest.fixture(autouse=True)
def _own_nodes_only() -> None:
    if os.environ.get("MIRRORQ_TARGET"):
        pytest.skip("starts its own 3-node mirrorq cluster")


# ---------------------------------------------------------------- chromium

def find_chromium() -> str | None:
    env = os.environ.get("MIRRORQ_CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium_or_skip() -> str:
    exe = find_chromium()
    if exe:
        return exe
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
            subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=600, check=False)
        exe = find_chromium()
        if exe:
            return exe
    pytest.skip("no chromium, and it cannot be installed here (apt-get install -y chromium)")


class CdpError(Exception):
    pass


class Chromium:
    """Headless Chromium and one page, over the DevTools protocol on a pipe."""

    def __init__(self, exe: str, profile_dir: Path, width: int = 1440, height: int = 1000) -> None:
        profile_dir.mkdir(parents=True, exist_ok=True)
        # our ends: we write commands to cmd_w, read answers from res_r; the browser's
        # ends go to its fds 3 (commands in) and 4 (answers out)
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        # copies above 9 so that the dup2 onto 3 and 4 cannot clobber one another
        child_in = _dup_high(cmd_r)
        child_out = _dup_high(res_w)
        os.close(cmd_r)
        os.close(res_w)

        def wire() -> None:  # runs in the child between fork and exec
            os.dup2(child_in, 3)   # dup2 leaves 3 and 4 inheritable; the rest is O_CLOEXEC
            os.dup2(child_out, 4)

        args = [exe, "--headless=new", "--remote-debugging-pipe", f"--user-data-dir={profile_dir}",
                f"--window-size={width},{height}", "--hide-scrollbars", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-background-networking", "--disable-sync",
                "--disable-component-update", "--disable-default-apps", "--mute-audio",
                "--password-store=basic", "--use-mock-keychain", "--force-color-profile=srgb",
                "--disable-features=Translate,MediaRouter,OptimizationHints",
                "about:blank"]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # the setuid/namespace sandbox refuses root
        self.log_path = profile_dir.parent / "chromium.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         close_fds=False, preexec_fn=wire)  # noqa: PLW1509
        os.close(child_in)
        os.close(child_out)
        self._w = os.fdopen(cmd_w, "wb", buffering=0)
        self._r = os.fdopen(res_r, "rb", buffering=0)
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self._cv = threading.Condition()
        self._closed = False
        self._reader = threading.Thread(target=self._read_loop, name="cdp-reader", daemon=True)
        self._reader.start()
        self.session = ""
        self.width, self.height = width, height

    # -------------------------------------------------------------- protocol
    def _read_loop(self) -> None:
        buf = b""
        while True:
            try:
                chunk = self._r.read(65536)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cv:
                    self._closed = True
                    self._cv.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                with self._cv:
                    if "id" in msg:
                        self._replies[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                    self._cv.notify_all()

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict[str, Any]:
        with self._cv:
            self._next_id += 1
            mid = self._next_id
        msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
        sid = self.session if session is None else session
        if sid:
            msg["sessionId"] = sid
        self._w.write(json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cv:
            while mid not in self._replies:
                left = deadline - time.monotonic()
                if self._closed:
                    raise CdpError(f"chromium went away during {method}:\n{self.log_tail()}")
                if left <= 0:
                    raise CdpError(f"no answer to {method} within {timeout}s")
                self._cv.wait(left)
            reply = self._replies.pop(mid)
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    # -------------------------------------------------------------- page
    def open_page(self) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, session="")["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session="")["sessionId"]
        for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.send(domain)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})

    def navigate(self, url: str, timeout: float = 30.0) -> None:
        res = self.send("Page.navigate", {"url": url}, timeout=timeout)
        if res.get("errorText"):
            raise CdpError(f"navigate {url}: {res['errorText']}")
        self.wait_for("document.readyState === 'complete'", timeout, "the page to load")

    def eval(self, expression: str, timeout: float = 10.0) -> Any:
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True}, timeout=timeout)
        if "exceptionDetails" in res:
            det = res["exceptionDetails"]
            raise CdpError(f"{expression[:80]!r}: {det.get('exception', {}).get('description') or det.get('text')}")
        return res.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            last = self.eval(expression)
            if last:
                return last
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what} ({expression[:100]!r} = {last!r})")
            time.sleep(0.2)

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        if full_page:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            h = max(self.height, int(size["height"]) + 1)
            self.send("Emulation.setDeviceMetricsOverride",
                      {"width": self.width, "height": h, "deviceScaleFactor": 1, "mobile": False})
            time.sleep(0.3)  # a relayout (the charts redraw to the new size on resize)
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        if full_page:
            self.send("Emulation.setDeviceMetricsOverride",
                      {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def page_errors(self, network: bool = False) -> list[str]:
        """Uncaught exceptions and console.error/Log errors seen so far (failed
        requests too with `network`)."""
        out = []
        with self._cv:
            events = list(self.events)
        for ev in events:
            p = ev.get("params", {})
            if ev.get("method") == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append(d.get("exception", {}).get("description") or d.get("text", "?"))
            elif ev.get("method") == "Runtime.consoleAPICalled" and p.get("type") == "error":
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif (ev.get("method") == "Log.entryAdded" and p.get("entry", {}).get("level") == "error"
                  and (network or p["entry"].get("source") != "network")):
                out.append(p["entry"].get("text", ""))
        return out

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "<no log>"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send("Browser.close", session="", timeout=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for f in (self._w, self._r):
            with contextlib.suppress(OSError):
                f.close()


def _dup_high(fd: int) -> int:
    import fcntl
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Chromium]:
    b = Chromium(chromium_or_skip(), tmp_path / "chromium-profile")
    try:
        b.open_page()
        yield b
    finally:
        b.close()


# ---------------------------------------------------------------- cluster with HTTP ports

def http_port(node: Any) -> int:
    port = getattr(node, "http_port", None)
    assert port, f"{node.node_id} has no HTTP port"
    return int(port)


@pytest.fixture
def http_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A started 3-node cluster whose nodes serve the management HTTP API. Uses
    ClusterNode.http_port when the harness has one, else gives each node a port
    through --http-port itself."""
    c = Cluster(tmp_path / "cluster", n=3)
    for n in c.nodes:
        if not getattr(n, "http_port", None):
            n.http_port = free_port()  # type: ignore[attr-defined]
        if "--http-port" not in n.argv():
            n.extra_args += ["--http-port", str(n.http_port)]  # type: ignore[attr-defined]
    try:
        c.start()
        for n in c.nodes:
            deadline = time.monotonic() + 30
            while not port_open(http_port(n), n.host):
                assert n.alive(), f"{n.node_id} exited:\n{n.tail_log(15)}"
                assert time.monotonic() < deadline, f"{n.node_id}: HTTP port {http_port(n)} closed:\n{n.tail_log(15)}"
                time.sleep(0.05)
        yield c
    except BaseException:
        c.dump_logs(25)
        raise
    finally:
        c.kill_all()


def api_get(node: Any, path: str, timeout: float = 5.0) -> Any:
    req = urllib.request.Request(f"http://{node.host}:{http_port(node)}{path}")
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(req, timeout=timeout) as res:
        return json.loads(res.read())


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = cond()
            if last:
                return last
        except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}: {last!r}")


def publish(node: Any, queue: str, n: int) -> None:
    params = pika.ConnectionParameters(host=node.host, port=node.amqp_port, heartbeat=0,
                                       credentials=pika.PlainCredentials(USER, PASSWORD),
                                       connection_attempts=3, retry_delay=0.5, socket_timeout=10)
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, durable=True)
        for i in range(n):
            ch.basic_publish("", queue, f"console message {i}".encode(),
                             pika.BasicProperties(delivery_mode=2), mandatory=True)
    finally:
        conn.close()


class Traffic(threading.Thread):
    """Publishes with confirms and consumes (acking) on another queue, so that the
    console's rate and latency charts have something to draw (screenshot mode only)."""

    def __init__(self, node: Any, queue: str, rate: float = 150.0) -> None:
        super().__init__(name="console-traffic", daemon=True)
        self.node, self.queue, self.rate = node, queue, rate
        self.stop_event = threading.Event()

    def run(self) -> None:
        params = pika.ConnectionParameters(host=self.node.host, port=self.node.amqp_port, heartbeat=0,
                                           credentials=pika.PlainCredentials(USER, PASSWORD),
                                           client_properties={"connection_name": "console-traffic"})
        conn = pika.BlockingConnection(params)
        try:
            pub = conn.channel()
            pub.confirm_delivery()
            pub.queue_declare(self.queue, durable=True)
            sub = conn.channel()
            sub.basic_qos(prefetch_count=20)

            def on_message(ch: Any, method: Any, _props: Any, _body: bytes) -> None:
                ch.basic_ack(method.delivery_tag)

            sub.basic_consume(self.queue, on_message)
            t0 = time.monotonic()
            i = 0
            while not self.stop_event.is_set():
                # a rate that steps up and down, so that the chart is not a flat line
                want = self.rate * (1.0 + 0.6 * (int((time.monotonic() - t0) / 15) % 2))
                pub.basic_publish("", self.queue, b"x" * 512, pika.BasicProperties(delivery_mode=2))
                i += 1
                if i % 5 == 0:
                    conn.process_data_events(time_limit=0)
                time.sleep(max(0.0, 1.0 / want - 0.003))
        finally:
            with contextlib.suppress(Exception):
                conn.close()


# ---------------------------------------------------------------- the test

VISIBLE = "document.getElementById('%s').offsetParent !== null"

DOM_SNAPSHOT = r"""(() => {
  const rows = [...document.querySelectorAll('#members tbody tr')];
  const q = [...document.querySelectorAll('#queues tbody tr')];
  return {
    state: document.body.dataset.state,
    loginVisible: document.getElementById('login').offsetParent !== null,
    consoleVisible: document.getElementById('console').offsetParent !== null,
    leader: document.getElementById('leader-name').textContent.trim(),
    term: document.getElementById('term').textContent.trim(),
    members: rows.map(r => ({name: r.dataset.member, leader: r.dataset.leader === 'true',
                             text: r.innerText})),
    queues: q.map(r => ({vhost: r.dataset.vhost, name: r.dataset.queue, messages: r.dataset.messages,
                         cell: (r.querySelector('td.messages') || {}).textContent,
                         visible: r.offsetParent !== null})),
    banner: document.getElementById('banner').hidden ? '' : document.getElementById('banner').textContent,
    polls: (window.mirrorqConsole || {}).polls,
  };
})()"""


def test_console_shows_cluster_leader_and_queue(browser: Chromium, http_cluster: Cluster,
                                                 tmp_path: Path) -> None:
    c = http_cluster
    leader = c.leader()
    follower = next(n for n in c.nodes if n is not leader)
    queue = f"console-{os.getpid()}-{int(time.time() * 1000) % 100000}"
    publish(follower, queue, N_MESSAGES)

    # what the API says, from another node than the one the browser asks
    view = wait_for(lambda: (v := api_get(leader, "/api/mirrorq/cluster")).get("leader") and v,
                    20, "a leader in /api/mirrorq/cluster")
    assert view["leader"] == leader.node_id, (view, leader.node_id)
    wait_for(lambda: api_get(leader, f"/api/queues/%2F/{queue}").get("messages") == N_MESSAGES,
             20, f"{queue} to hold {N_MESSAGES} messages in the API")

    shot_env = os.environ.get("MIRRORQ_SCREENSHOT")
    traffic: Traffic | None = None
    if shot_env:
        traffic = Traffic(follower, f"{queue}-traffic")  # through the node the page asks
        traffic.start()

    try:
        # 1. the login form (guest/guest pre-filled; filled again here), then the console
        log_in(browser, f"http://{follower.host}:{http_port(follower)}/")
        assert not browser.eval(VISIBLE % "login-form"), "the login form is still shown"

        # 2. members, leader and queue, polled until shown (the page refreshes every 2 s)
        ids = sorted(n.node_id for n in c.nodes)

        def shown(snap: dict[str, Any]) -> bool:
            names = sorted(m["name"] for m in snap["members"])
            leaders = [m["name"] for m in snap["members"] if m["leader"]]
            qrow = [q for q in snap["queues"] if q["name"] == queue and q["vhost"] == "/"]
            return bool(snap["consoleVisible"] and not snap["loginVisible"]
                        and names == ids and snap["leader"] == leader.node_id
                        and leaders == [leader.node_id]
                        and qrow and qrow[0]["visible"] and qrow[0]["messages"] == str(N_MESSAGES)
                        and (qrow[0]["cell"] or "").replace(",", "") == str(N_MESSAGES))

        deadline = time.monotonic() + PAGE_DEADLINE
        while not shown(snap := browser.eval(DOM_SNAPSHOT)):
            if time.monotonic() > deadline:
                raise AssertionError(f"the console did not show 3 members, leader {leader.node_id} "
                                     f"and {queue} with {N_MESSAGES} messages within {PAGE_DEADLINE}s; "
                                     f"last DOM: {json.dumps(snap, indent=1)}\n"
                                     f"page errors: {browser.page_errors(network=True)}")
            time.sleep(0.25)

        assert snap["state"] == "ok", snap
        assert snap["banner"] == "", snap["banner"]
        # the leader is still the one the API names (no election in between)
        assert api_get(follower, "/api/mirrorq/cluster")["leader"] == leader.node_id
        assert c.leader().node_id == leader.node_id

        if traffic is not None:  # let the charts fill for the README's screenshot
            time.sleep(float(os.environ.get("MIRRORQ_SCREENSHOT_SECONDS", "40")))
        assert browser.page_errors() == [], browser.page_errors()
    finally:
        try:
            shot = browser.screenshot(tmp_path / "console.png")
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            print(f"console screenshot: {shot}")
            if shot_env:
                Path(shot_env).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(shot, shot_env)
                print(f"console screenshot copied to {shot_env}")
        except (CdpError, OSError) as exc:  # do not hide the test's own failure
            print(f"no screenshot: {exc}")
        if traffic is not None:
            traffic.stop_event.set()
            traffic.join(10)


def log_in(browser: Chromium, url: str) -> None:
    browser.navigate(url)
    browser.wait_for(VISIBLE % "login-form", 15, "the login form")
    browser.eval(f"""(() => {{
        document.getElementById('login-user').value = {json.dumps(USER)};
        document.getElementById('login-pass').value = {json.dumps(PASSWORD)};
        document.getElementById('login-submit').click();
        return true; }})()""")
    browser.wait_for(VISIBLE % "console", 15, "the console after log in")


def test_console_survives_nodes_going_away(browser: Chromium, http_cluster: Cluster,
                                           tmp_path: Path) -> None:
    """A member that dies shows as unreachable; when the node serving the page dies
    the page says so and keeps polling, and it recovers once that node is back."""
    c = http_cluster
    leader = c.leader()
    served, other = [n for n in c.nodes if n is not leader]
    # a wrong password is refused on the form
    browser.navigate(f"http://{served.host}:{http_port(served)}/")
    browser.wait_for(VISIBLE % "login-form", 15, "the login form")
    browser.eval("document.getElementById('login-pass').value = 'not-the-password';"
                 "document.getElementById('login-submit').click(); true")
    browser.wait_for("/Login failed/.test(document.getElementById('login-error').textContent)",
                     10, "the login error")
    assert not browser.eval(VISIBLE % "console")
    log_in(browser, f"http://{served.host}:{http_port(served)}/")
    browser.wait_for("document.querySelectorAll('#members tbody tr').length === 3", 20, "3 members")

    # another follower dies: its row says unreachable, the page itself stays fine
    other.kill9()
    row = f"document.querySelector('#members tr[data-member={json.dumps(other.node_id)}]')"
    browser.wait_for(f"{row} && /unreachable/.test({row}.innerText) && /out of sync/.test({row}.innerText)",
                     30, f"{other.node_id} shown unreachable and out of sync")
    assert browser.eval("document.body.dataset.state") in ("ok", "degraded")

    # the node serving the page dies: an error banner, and the page keeps polling
    served.kill9()
    browser.wait_for("document.body.dataset.state === 'error' && "
                     "/not answering/.test(document.getElementById('banner').textContent)",
                     20, "the error banner")
    polls = browser.eval("window.mirrorqConsole.polls")
    time.sleep(4.5)
    assert browser.eval("window.mirrorqConsole.polls") >= polls + 2, "the page stopped polling"
    # the last figures stay on the page
    assert browser.eval("document.querySelectorAll('#members tbody tr').length") == 3
    browser.screenshot(tmp_path / "console-node-down.png", full_page=False)

    # back: the page recovers by itself (no reload, no new log in)
    served.start()
    browser.wait_for("document.body.dataset.state === 'ok' && document.getElementById('banner').hidden",
                     40, "the page to recover")
    assert not browser.eval(VISIBLE % "login-form")
    assert browser.page_errors() == [], browser.page_errors()
