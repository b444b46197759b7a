/* mirrorq web console: plain JavaScript, no build step, no external assets.
 *
 * Polls the management HTTP API every POLL_MS (RabbitMQ 3.10 paths plus
 * /api/mirrorq/cluster) with HTTP basic auth kept in sessionStorage, as
 * RabbitMQ's own console does, and draws rate and latency charts from the
 * samples it has collected (kept in sessionStorage too, so a reload keeps
 * them). Every endpoint fails on its own: its card shows the error, the rest
 * of the page keeps its last data, and polling goes on.
 *
 * Everything that comes from the broker is written with textContent (queue,
 * user and connection names are client-controlled).
 */
(function () {
  "use strict";

  var POLL_MS = 2000;
  var FETCH_TIMEOUT_MS = 5000;
  var WINDOW_MS = 5 * 60 * 1000;          // chart window
  var KEEP_MS = 15 * 60 * 1000;           // samples kept
  var AUTH_KEY = "mirrorq.auth";
  var USER_KEY = "mirrorq.user";
  var HIST_KEY = "mirrorq.history";

  var $ = function (id) { return document.getElementById(id); };

  var state = {
    auth: sessionStorage.getItem(AUTH_KEY),
    user: sessionStorage.getItem(USER_KEY) || "",
    timer: null,
    generation: 0,           // bumped on log in/out: stale polls are ignored
    polls: 0,
    lastOk: null,
    prevCounters: {},        // key -> {t, value}: rates computed from counters
    queueRates: {},          // queue id -> rates of the last poll (for re-filtering)
    history: loadHistory(),
    data: {}                 // last good response per endpoint
  };

  // Exposed for tests and for curious operators (read-only use).
  window.mirrorqConsole = state;

  // ------------------------------------------------------------------ utils
  function b64utf8(s) {
    var bytes = new TextEncoder().encode(s);
    var bin = "";
    for (var i = 0; i < bytes.length; i++) bin += String.fromCharCode(bytes[i]);
    return btoa(bin);
  }

  function el(tag, attrs, children) {
    var e = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        var v = attrs[k];
        if (v === undefined || v === null || v === false) return;
        if (k === "text") e.textContent = String(v);
        else if (k === "className") e.className = v;
        else if (k === "title") e.title = String(v);
        else e.setAttribute(k, String(v));
      });
    }
    (children || []).forEach(function (c) {
      if (c === null || c === undefined) return;
      e.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
    });
    return e;
  }

  function td(content, cls, title) {
    var cell = el("td", { className: cls, title: title });
    if (content !== null && typeof content === "object") cell.appendChild(content);
    else cell.textContent = content === undefined || content === null ? "\u2014" : String(content);
    return cell;
  }

  function badge(text, kind, title) {
    return el("span", { className: "badge " + kind, text: text, title: title });
  }

  function isNum(v) { return typeof v === "number" && isFinite(v); }

  function fmtInt(v) { return isNum(v) ? Math.round(v).toLocaleString("en-US") : "\u2014"; }

  function fmtRate(v) {
    if (!isNum(v)) return "\u2014";
    if (v === 0) return "0";
    if (v < 10) return v.toFixed(1);
    return Math.round(v).toLocaleString("en-US");
  }

  function fmtMs(v) {
    if (!isNum(v)) return "\u2014";
    return v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : Math.round(v).toLocaleString("en-US");
  }

  function fmtBytes(v) {
    if (!isNum(v)) return "\u2014";
    var units = ["B", "KiB", "MiB", "GiB", "TiB"];
    var i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? v : v.toFixed(v < 10 ? 1 : 0)) + " " + units[i];
  }

  function fmtUptime(ms) {
    if (!isNum(ms)) return "\u2014";
    var s = Math.floor(ms / 1000);
    var d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    if (d) return d + "d " + h + "h";
    if (h) return h + "h " + m + "m";
    if (m) return m + "m " + (s % 60) + "s";
    return s + "s";
  }

  function fmtTime(t) {
    var d = new Date(t);
    var p = function (n) { return (n < 10 ? "0" : "") + n; };
    return p(d.getHours()) + ":" + p(d.getMinutes()) + ":" + p(d.getSeconds());
  }

  function shortNode(name) {
    // "mirrorq@n1" / "rabbit@host" -> keep as is, but match members by either form
    return typeof name === "string" ? name : "";
  }

  function sameNode(a, b) {
    if (!a || !b) return false;
    a = String(a); b = String(b);
    if (a === b) return true;
    var ta = a.indexOf("@") >= 0 ? a.split("@") : null;
    var tb = b.indexOf("@") >= 0 ? b.split("@") : null;
    if (ta && !tb) return ta[0] === b || ta[1] === b;
    if (tb && !ta) return tb[0] === a || tb[1] === a;
    return false;
  }

  // rate from "<key>_details.rate", else from the change of the "<key>" counter
  // between two polls (also when the server's rate says 0 while its counter grew)
  function rateOf(stats, key, id) {
    if (!stats) return undefined;
    var det = stats[key + "_details"];
    var given = det && isNum(det.rate) ? det.rate : undefined;
    var v = stats[key];
    var counted;
    if (isNum(v)) {
      var now = Date.now();
      var k = id + "|" + key;
      var prev = state.prevCounters[k];
      state.prevCounters[k] = { t: now, value: v };
      if (prev && now > prev.t && v >= prev.value) counted = (v - prev.value) * 1000 / (now - prev.t);
    }
    if (given !== undefined && !(given === 0 && counted > 0)) return given;
    return counted;
  }

  // ------------------------------------------------------------------ fetch
  function HttpError(status, message) {
    this.status = status;
    this.message = message;
  }

  function api(path) {
    var ctrl = typeof AbortController === "function" ? new AbortController() : null;
    var timer = ctrl ? setTimeout(function () { ctrl.abort(); }, FETCH_TIMEOUT_MS) : null;
    var headers = { "Accept": "application/json" };
    if (state.auth) headers["Authorization"] = "Basic " + state.auth;
    // credentials "omit": no cookies, and no browser basic-auth dialog on a 401
    // (the console shows its own form, as RabbitMQ's does)
    return fetch(path, { headers: headers, credentials: "omit", cache: "no-store",
                         signal: ctrl ? ctrl.signal : undefined })
      .then(function (res) {
        return res.text().then(function (body) {
          var json = null;
          try { json = body ? JSON.parse(body) : null; } catch (e) { json = null; }
          if (!res.ok) {
            var why = json && (json.reason || json.error) ? String(json.reason || json.error) : (res.statusText || "");
            throw new HttpError(res.status, "HTTP " + res.status + (why ? ": " + why : ""));
          }
          if (json === null) throw new HttpError(res.status, "not JSON");
          return json;
        });
      }, function (err) {
        var aborted = err && err.name === "AbortError";
        throw new HttpError(0, aborted ? "no answer within " + FETCH_TIMEOUT_MS / 1000 + " s"
                                       : "cannot reach the node (" + (err && err.message || err) + ")");
      })
      .finally(function () { if (timer) clearTimeout(timer); });
  }

  // ------------------------------------------------------------------ login
  function showLogin(message) {
    stopPolling();
    document.body.dataset.state = "login";
    $("console").hidden = true;
    $("login").hidden = false;
    $("logout").hidden = true;
    $("whoami").textContent = "";
    $("banner").hidden = true;
    $("login-error").textContent = message || "";
    if (state.user) $("login-user").value = state.user;
    $("login-pass").focus();
  }

  function showConsole() {
    $("login").hidden = true;
    $("console").hidden = false;
    $("logout").hidden = false;
    $("whoami").textContent = state.user;
  }

  function logIn(user, pass) {
    state.auth = b64utf8(user + ":" + pass);
    state.user = user;
    $("login-submit").disabled = true;
    $("login-error").textContent = "";
    return api("api/whoami").then(function (who) {
      sessionStorage.setItem(AUTH_KEY, state.auth);
      sessionStorage.setItem(USER_KEY, who && who.name ? who.name : user);
      state.user = who && who.name ? who.name : user;
      start();
    }, function (err) {
      state.auth = null;
      $("login-error").textContent = err.status === 401 ? "Login failed: wrong username or password."
        : err.status === 403 ? "This user may not use the management API (needs a management tag)."
        : "Login failed: " + err.message;
    }).finally(function () { $("login-submit").disabled = false; });
  }

  function logOut() {
    sessionStorage.removeItem(AUTH_KEY);
    state.auth = null;
    state.generation++;
    showLogin("");
  }

  // ------------------------------------------------------------------ polling
  var ENDPOINTS = {
    cluster: "api/mirrorq/cluster",
    overview: "api/overview",
    nodes: "api/nodes",
    queues: "api/queues",
    connections: "api/connections"
  };

  function start() {
    state.generation++;
    showConsole();
    stopPolling();
    poll(state.generation);
  }

  function stopPolling() {
    if (state.timer) clearTimeout(state.timer);
    state.timer = null;
  }

  function poll(gen) {
    var names = Object.keys(ENDPOINTS);
    Promise.all(names.map(function (n) {
      return api(ENDPOINTS[n]).then(function (v) { return { ok: true, value: v }; },
                                    function (e) { return { ok: false, error: e }; });
    })).then(function (results) {
      if (gen !== state.generation) return;
      var res = {};
      names.forEach(function (n, i) { res[n] = results[i]; });
      if (names.some(function (n) { return !res[n].ok && res[n].error.status === 401; })) {
        sessionStorage.removeItem(AUTH_KEY);
        state.auth = null;
        showLogin("The API refused these credentials (401): log in again.");
        return;
      }
      try {
        render(res);
      } catch (e) {
        showBanner("Console error: " + (e && e.message || e), "bad");
        if (window.console) console.error(e);
      }
      state.polls++;
      state.timer = setTimeout(function () { poll(gen); }, POLL_MS);
    });
  }

  // ------------------------------------------------------------------ render
  function showBanner(text, kind) {
    var b = $("banner");
    if (!text) { b.hidden = true; return; }
    b.hidden = false;
    b.className = "banner" + (kind === "warn" ? " warn" : "");
    b.textContent = text;
  }

  function sectionError(id, err) {
    var box = $(id);
    if (!box) return;
    if (!err) { box.hidden = true; box.textContent = ""; return; }
    box.hidden = false;
    var since = state.lastOk ? " (showing data from " + fmtTime(state.lastOk) + ")" : "";
    box.textContent = (err.status === 403 ? "Not authorised: " : "") + err.message + since;
  }

  function render(res) {
    var failed = Object.keys(res).filter(function (n) { return !res[n].ok; });
    Object.keys(res).forEach(function (n) { if (res[n].ok) state.data[n] = res[n].value; });
    var now = Date.now();

    if (failed.length === Object.keys(res).length) {
      document.body.dataset.state = "error";
      var e0 = res[failed[0]].error;
      showBanner(location.host + " is not answering: " + e0.message +
                 "\nStill retrying every " + POLL_MS / 1000 + " s" +
                 (state.lastOk ? "; the figures below are from " + fmtTime(state.lastOk) + "." : "."),
                 "bad");
    } else if (failed.length) {
      document.body.dataset.state = "degraded";
      showBanner(failed.map(function (n) { return ENDPOINTS[n] + ": " + res[n].error.message; }).join("\n"), "warn");
      state.lastOk = now;
    } else {
      document.body.dataset.state = "ok";
      showBanner("");
      state.lastOk = now;
    }
    $("refresh-text").textContent = (failed.length === Object.keys(res).length ? "failed " : "updated ") + fmtTime(now);

    renderHeader(res);
    renderMembers(res);
    var rates = renderQueues(res);
    renderConnections(res);
    renderTiles(res, rates, now);
  }

  function renderHeader(res) {
    var c = state.data.cluster || {};
    var ov = state.data.overview || {};
    var leaderEl = $("leader-name");
    var leader = c.leader || (Array.isArray(c.members) ? (c.members.filter(function (m) { return m.leader; })[0] || {}).name : null);
    leaderEl.textContent = leader || "none";
    leaderEl.className = "leader-name" + (leader ? "" : " none");
    leaderEl.dataset.leader = leader || "";
    $("term").textContent = isNum(c.term) ? c.term : "\u2014";
    $("commit-index").textContent = isNum(c.commit_index) ? fmtInt(c.commit_index) : "\u2014";
    var members = Array.isArray(c.members) ? c.members : [];
    var inSync = Array.isArray(c.in_sync) ? c.in_sync
      : members.filter(function (m) { return m.in_sync; }).map(function (m) { return m.name; });
    $("in-sync").textContent = members.length || inSync.length
      ? inSync.length + "/" + (members.length || inSync.length) + (inSync.length ? " (" + inSync.join(", ") + ")" : "")
      : "\u2014";
    $("served-by").textContent = c.node || ov.node || "\u2014";
    var name = c.cluster_name || ov.cluster_name || "";
    $("cluster-name").textContent = name;
    document.title = "mirrorq" + (name ? " \u00b7 " + name : "") + (leader ? " \u00b7 leader " + leader : "");
  }

  function renderMembers(res) {
    sectionError("cluster-error", !res.cluster.ok ? res.cluster.error : !res.nodes.ok ? res.nodes.error : null);
    var c = state.data.cluster || {};
    var nodes = Array.isArray(state.data.nodes) ? state.data.nodes : [];
    var members = Array.isArray(c.members) ? c.members.slice() : [];
    var inSyncSet = Array.isArray(c.in_sync) ? c.in_sync : null;
    // nodes the API lists that are not (or no longer) members: show them too
    nodes.forEach(function (n) {
      if (!members.some(function (m) { return sameNode(m.name, n.name); })) {
        members.push({ name: n.name, _nodeOnly: true });
      }
    });
    var tbody = $("members").querySelector("tbody");
    var rows = members.map(function (m) {
      var node = nodes.filter(function (n) { return sameNode(m.name, n.name); })[0] || null;
      var isLeader = !!(m.leader || (c.leader && sameNode(m.name, c.leader)));
      var inSync = typeof m.in_sync === "boolean" ? m.in_sync
        : inSyncSet ? inSyncSet.some(function (x) { return sameNode(x, m.name); }) : undefined;
      var reachable = typeof m.reachable === "boolean" ? m.reachable
        : node && typeof node.running === "boolean" ? node.running : undefined;
      var tr = el("tr", { "data-member": m.name, "data-leader": isLeader ? "true" : "false",
                          className: (isLeader ? "is-leader" : "") + (reachable === false ? " is-down" : "") });
      var nameCell = el("td", null, [el("b", { text: m.name })]);
      if (isLeader) nameCell.appendChild(badge("leader", "leader"));
      if (m.self || (c.node && sameNode(c.node, m.name))) nameCell.appendChild(badge("this node", "plain", "the node serving this page"));
      else if (consoleUrl(m)) {
        nameCell.appendChild(document.createTextNode(" "));
        nameCell.appendChild(el("a", { href: consoleUrl(m), text: "console", title: "this member's own console", className: "console-link" }));
      }
      tr.appendChild(nameCell);
      tr.appendChild(td(m.address || m.raft_address));
      tr.appendChild(td(m.role || (m._nodeOnly ? "not a member" : isLeader ? "leader" : "follower")));
      tr.appendChild(td(inSync === undefined ? null : inSync ? badge("in sync", "ok") : badge("out of sync", "bad")));
      tr.appendChild(td(m.draining === undefined ? null : m.draining ? badge("draining", "warn") : badge("no", "plain")));
      tr.appendChild(td(reachable === undefined ? null : reachable ? badge("reachable", "ok") : badge("unreachable", "bad")));
      // only the leader knows its followers' match index (a follower reports null)
      var knowsMatch = m.self || !c.role || c.role === "leader";
      tr.appendChild(td(knowsMatch && isNum(m.match_index) ? fmtInt(m.match_index) : null, "num",
                        knowsMatch ? null : "known to the leader only"));
      tr.appendChild(td(!node ? null : node.running === false ? badge("not running", "bad") : badge("running", "ok")));
      tr.appendChild(td(node ? fmtUptime(node.uptime) : null, "num"));
      tr.appendChild(td(node ? memCell(node) : null, "num"));
      tr.appendChild(td(node && isNum(node.fd_used) ? fmtInt(node.fd_used) + (isNum(node.fd_total) ? " / " + fmtInt(node.fd_total) : "") : null, "num"));
      return tr;
    });
    tbody.replaceChildren.apply(tbody, rows);
    var note = [];
    if (isNum(c.commit_index)) note.push("commit index " + fmtInt(c.commit_index));
    if (isNum(c.mirrored_index)) note.push("mirrored index " + fmtInt(c.mirrored_index));
    $("cluster-note").textContent = note.join(" \u00b7 ");
  }

  // another member's console, when the API says where its HTTP port is
  function consoleUrl(m) {
    var u = m.http_url || m.management_url;
    if (typeof u === "string" && /^https?:\/\//.test(u)) return u;
    if (isNum(m.http_port) && typeof m.address === "string") {
      var host = m.address.replace(/:\d+$/, "");
      return location.protocol + "//" + host + ":" + m.http_port + "/";
    }
    return null;
  }

  function memCell(node) {
    if (!isNum(node.mem_used)) return null;
    var span = el("span", null, [fmtBytes(node.mem_used)]);
    if (isNum(node.mem_limit) && node.mem_limit > 0) {
      var pct = Math.min(100, node.mem_used * 100 / node.mem_limit);
      var bar = el("span", { className: "bar", title: Math.round(pct) + "% of the high watermark " + fmtBytes(node.mem_limit) });
      var fill = el("i");
      fill.style.width = pct.toFixed(1) + "%";
      if (node.mem_alarm) fill.style.background = "var(--bad)";
      bar.appendChild(fill);
      span.appendChild(bar);
    }
    return span;
  }

  function renderQueues(res, cached) {
    if (!cached) sectionError("queues-error", res.queues.ok ? null : res.queues.error);
    var queues = Array.isArray(state.data.queues) ? state.data.queues : [];
    var filter = ($("queue-filter").value || "").toLowerCase();
    var sums = { publish: 0, deliver: 0, confirm: 0, any: { publish: false, deliver: false, confirm: false } };
    var sorted = queues.slice().sort(function (a, b) {
      return (a.vhost || "").localeCompare(b.vhost || "") || (a.name || "").localeCompare(b.name || "");
    });
    var rows = [];
    sorted.forEach(function (q) {
      var id = "q|" + q.vhost + "|" + q.name;
      var ms = q.message_stats || {};
      var r = cached ? (state.queueRates[id] || {}) : res.queues.ok
        ? { pub: rateOf(ms, "publish", id), del: rateOf(ms, "deliver_get", id), conf: rateOf(ms, "confirm", id) }
        : {};
      if (!cached) state.queueRates[id] = r;
      var pub = r.pub, del = r.del, conf = r.conf;
      if (isNum(pub)) { sums.publish += pub; sums.any.publish = true; }
      if (isNum(del)) { sums.deliver += del; sums.any.deliver = true; }
      if (isNum(conf)) { sums.confirm += conf; sums.any.confirm = true; }
      if (filter && (q.name + " " + q.vhost).toLowerCase().indexOf(filter) < 0) return;
      var ready = q.messages_ready, unacked = q.messages_unacknowledged;
      var total = isNum(q.messages) ? q.messages : isNum(ready) && isNum(unacked) ? ready + unacked : undefined;
      var tr = el("tr", { "data-vhost": q.vhost, "data-queue": q.name, "data-messages": isNum(total) ? total : "" });
      tr.appendChild(td(q.vhost));
      tr.appendChild(td(el("b", { text: q.name })));
      tr.appendChild(td(q.type || (q.arguments && q.arguments["x-queue-type"]) || "classic"));
      tr.appendChild(td(features(q)));
      tr.appendChild(td(fmtInt(ready), "num ready"));
      tr.appendChild(td(fmtInt(unacked), "num unacked"));
      tr.appendChild(td(fmtInt(total), "num messages"));
      tr.appendChild(td(fmtInt(q.consumers), "num consumers"));
      tr.appendChild(td(fmtRate(pub), "num"));
      tr.appendChild(td(fmtRate(del), "num"));
      tr.appendChild(td(fmtRate(conf), "num"));
      rows.push(tr);
    });
    var tbody = $("queues").querySelector("tbody");
    tbody.replaceChildren.apply(tbody, rows);
    $("queues-count").textContent = "(" + (filter ? rows.length + " of " : "") + queues.length + ")";
    $("queues-empty").hidden = rows.length > 0;
    $("queues-empty").textContent = queues.length ? "No queue matches the filter." : "No queues.";
    return sums;
  }

  function features(q) {
    var f = [];
    var a = q.arguments || {};
    if (q.durable) f.push("D");
    if (q.auto_delete) f.push("AD");
    if (q.exclusive) f.push("Excl");
    if (a["x-max-priority"] !== undefined) f.push("Pri");
    if (a["x-single-active-consumer"]) f.push("SAC");
    if (a["x-dead-letter-exchange"] !== undefined) f.push("DLX");
    if (a["x-message-ttl"] !== undefined) f.push("TTL");
    if (a["x-max-length"] !== undefined || a["x-max-length-bytes"] !== undefined) f.push("Lim");
    var span = el("span", { title: JSON.stringify(a) });
    f.forEach(function (x) { span.appendChild(badge(x, "plain")); span.appendChild(document.createTextNode(" ")); });
    return span;
  }

  function renderConnections(res) {
    sectionError("connections-error", res.connections.ok ? null : res.connections.error);
    var conns = Array.isArray(state.data.connections) ? state.data.connections : [];
    var rows = conns.slice().sort(function (a, b) { return (a.name || "").localeCompare(b.name || ""); }).map(function (c) {
      var props = c.client_properties || {};
      var client = [props.product, props.version].filter(Boolean).join(" ") || props.connection_name || null;
      var peer = c.peer_host ? (String(c.peer_host).indexOf(":") >= 0 ? "[" + c.peer_host + "]" : c.peer_host) +
                 (isNum(c.peer_port) ? ":" + c.peer_port : "") : null;
      var st = c.state || "running";
      var tr = el("tr", { "data-connection": c.name });
      tr.appendChild(td(c.name));
      tr.appendChild(td(shortNode(c.node) || null));
      tr.appendChild(td(c.user));
      tr.appendChild(td(c.vhost));
      tr.appendChild(td(peer));
      tr.appendChild(td(client));
      tr.appendChild(td(fmtInt(c.channels), "num"));
      tr.appendChild(td(badge(st, st === "running" ? "ok" : st === "blocked" || st === "blocking" || st === "flow" ? "warn" : "plain")));
      return tr;
    });
    var tbody = $("connections").querySelector("tbody");
    tbody.replaceChildren.apply(tbody, rows);
    $("connections-count").textContent = "(" + conns.length + ")";
    $("connections-empty").hidden = rows.length > 0;
  }

  function renderTiles(res, qsums, now) {
    var ov = state.data.overview || {};
    var c = state.data.cluster || {};
    var qt = ov.queue_totals || {};
    var queues = Array.isArray(state.data.queues) ? state.data.queues : [];
    var sum = function (k) {
      return queues.reduce(function (s, q) { return s + (isNum(q[k]) ? q[k] : 0); }, 0);
    };
    var messages = isNum(qt.messages) ? qt.messages : queues.length ? sum("messages") : undefined;
    var ready = isNum(qt.messages_ready) ? qt.messages_ready : queues.length ? sum("messages_ready") : undefined;
    var unacked = isNum(qt.messages_unacknowledged) ? qt.messages_unacknowledged : queues.length ? sum("messages_unacknowledged") : undefined;
    $("t-messages").textContent = fmtInt(messages);
    $("t-messages-sub").textContent = fmtInt(ready) + " ready \u00b7 " + fmtInt(unacked) + " unacked";

    // rates: the overview's message_stats (publish/deliver cluster-wide; confirm is the
    // answering node's, confirms are not replicated), else the sum over queues
    var ms = res.overview.ok ? (ov.message_stats || {}) : null;
    var pick = function (key, qkey) {
      var r = ms ? rateOf(ms, key, "overview") : undefined;
      if (isNum(r)) return r;
      return qsums.any[qkey] ? qsums[qkey] : undefined;
    };
    var publish = pick("publish", "publish");
    var deliver = pick("deliver_get", "deliver");
    var confirm = pick("confirm", "confirm");
    $("t-publish").textContent = fmtRate(publish);
    $("t-deliver").textContent = fmtRate(deliver);
    $("t-confirm").textContent = fmtRate(confirm);

    var lat = res.cluster.ok ? (c.confirm_latency || {}) : {};
    var p50 = lat.p50_ms, p99 = lat.p99_ms;
    $("t-latency").textContent = isNum(p50) || isNum(p99) ? fmtMs(p50) + " / " + fmtMs(p99) : "\u2014";

    var ot = ov.object_totals || {};
    var nq = isNum(ot.queues) ? ot.queues : queues.length;
    $("t-objects").textContent = fmtInt(nq) + (nq === 1 ? " queue" : " queues");
    var conns = Array.isArray(state.data.connections) ? state.data.connections.length : undefined;
    $("t-objects-sub").textContent = fmtInt(isNum(ot.connections) ? ot.connections : conns) + " connections \u00b7 " +
      fmtInt(ot.channels) + " channels \u00b7 " + fmtInt(ot.consumers) + " consumers";

    // one sample per poll for the charts (gaps where the node did not answer)
    var sample = { t: now };
    if (isNum(publish)) sample.publish = publish;
    if (isNum(deliver)) sample.deliver = deliver;
    if (isNum(confirm)) sample.confirm = confirm;
    if (isNum(p50)) sample.p50 = p50;
    if (isNum(p99)) sample.p99 = p99;
    state.history.push(sample);
    while (state.history.length && state.history[0].t < now - KEEP_MS) state.history.shift();
    saveHistory();
    drawCharts(now);
  }

  var RATE_SERIES = [
    { key: "publish", label: "publish", color: "var(--c-publish)", under: true },
    { key: "deliver", label: "deliver/get", color: "var(--c-deliver)" },
    { key: "confirm", label: "confirm", color: "var(--c-confirm)" }
  ];
  var LATENCY_SERIES = [
    { key: "p50", label: "p50", color: "var(--c-p50)" },
    { key: "p99", label: "p99", color: "var(--c-p99)" }
  ];

  function drawCharts(now) {
    drawChart($("rate-chart"), state.history, now, RATE_SERIES, fmtRate);
    drawChart($("latency-chart"), state.history, now, LATENCY_SERIES, fmtMs);
  }

  function loadHistory() {
    try {
      var h = JSON.parse(sessionStorage.getItem(HIST_KEY) || "[]");
      return Array.isArray(h) ? h.filter(function (s) { return s && isNum(s.t); }) : [];
    } catch (e) { return []; }
  }

  function saveHistory() {
    try { sessionStorage.setItem(HIST_KEY, JSON.stringify(state.history)); } catch (e) { /* full: fine */ }
  }

  // ------------------------------------------------------------------ chart (inline SVG)
  var SVGNS = "http://www.w3.org/2000/svg";

  function svg(tag, attrs, text) {
    var e = document.createElementNS(SVGNS, tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, String(attrs[k])); });
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // a round step for 4 grid lines at least covering v
  function niceStep(v) {
    var raw = v > 0 ? v / 4 : 0.25;
    var p = Math.pow(10, Math.floor(Math.log10(raw)));
    return [1, 2, 2.5, 5, 10].filter(function (x) { return x * p >= raw * (1 - 1e-9); })[0] * p;
  }

  function fmtAxis(v, step) {
    var frac = String(+step.toFixed(6)).split(".")[1];
    var digits = frac ? Math.min(4, frac.length) : 0;
    return v.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
  }

  function drawChart(box, history, now, series, fmt) {
    var W = Math.max(box.clientWidth, 300), H = Math.max(box.clientHeight, 160);
    var L = 52, R = 12, T = 26, B = 24;
    var t0 = now - WINDOW_MS;
    var pts = history.filter(function (s) { return s.t >= t0 - POLL_MS; });
    var max = 0;
    pts.forEach(function (s) { series.forEach(function (se) { if (isNum(s[se.key]) && s[se.key] > max) max = s[se.key]; }); });
    var step = niceStep(max);
    var ymax = 4 * step;
    var x = function (t) { return L + (W - L - R) * Math.max(0, t - t0) / WINDOW_MS; };
    var y = function (v) { return T + (H - T - B) * (1 - v / ymax); };
    var root = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": series.map(function (s) { return s.label; }).join(", ") });
    for (var i = 0; i <= 4; i++) {
      var v = ymax * i / 4;
      root.appendChild(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), "class": "grid" }));
      root.appendChild(svg("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end", "class": "axis" }, fmtAxis(v, step)));
    }
    for (var m = 0; m <= WINDOW_MS / 60000; m++) {
      var tx = x(now - m * 60000);
      root.appendChild(svg("text", { x: tx, y: H - 6, "text-anchor": m === 0 ? "end" : "middle", "class": "axis" },
                           m === 0 ? "now" : "-" + m + "m"));
    }
    var lx = L;
    series.forEach(function (se) {
      // split into runs where the value exists (a failed poll leaves a gap)
      var runs = [], cur = [];
      pts.forEach(function (s) {
        if (isNum(s[se.key])) cur.push(x(s.t).toFixed(1) + "," + y(s[se.key]).toFixed(1));
        else if (cur.length) { runs.push(cur); cur = []; }
      });
      if (cur.length) runs.push(cur);
      runs.forEach(function (r) {
        if (r.length === 1) {
          var xy = r[0].split(",");
          var dotc = svg("circle", { cx: xy[0], cy: xy[1], r: 2 });
          dotc.style.fill = se.color;
          root.appendChild(dotc);
        } else {
          var line = svg("polyline", { points: r.join(" "), "class": "series" });
          line.style.stroke = se.color;
          if (se.under) { line.style.strokeWidth = "4.5"; line.style.strokeOpacity = "0.45"; }
          root.appendChild(line);
        }
      });
      var last = null;
      for (var j = pts.length - 1; j >= 0; j--) { if (isNum(pts[j][se.key])) { last = pts[j][se.key]; break; } }
      var key = svg("rect", { x: lx, y: 6, width: 10, height: 10, rx: 2 });
      key.style.fill = se.color;
      root.appendChild(key);
      var label = svg("text", { x: lx + 14, y: 15, "class": "legend" }, se.label + " " + (last === null ? "\u2014" : fmt(last)));
      root.appendChild(label);
      lx += 14 + 8 * (se.label.length + (last === null ? 2 : fmt(last).length + 1)) + 14;
    });
    if (!pts.some(function (s) { return series.some(function (se) { return isNum(s[se.key]); }); })) {
      root.appendChild(svg("text", { x: (L + W - R) / 2, y: (T + H - B) / 2, "text-anchor": "middle", "class": "nodata" },
                           "no samples yet"));
    }
    box.replaceChildren(root);
  }

  // ------------------------------------------------------------------ wiring
  $("login-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    logIn($("login-user").value, $("login-pass").value);
  });
  $("logout").addEventListener("click", logOut);
  $("queue-filter").addEventListener("input", function () {
    // re-render from the last data and rates, without counting it as a poll
    renderQueues({ queues: { ok: true, value: state.data.queues || [] } }, true);
  });
  $("interval").textContent = String(POLL_MS / 1000);
  Array.prototype.forEach.call(document.querySelectorAll(".window-min"), function (e) {
    e.textContent = String(WINDOW_MS / 60000);
  });
  window.addEventListener("resize", function () {
    if (state.history.length && !$("console").hidden) drawCharts(Date.now());
  });

  if (state.auth) start();
  else showLogin("");
})();
