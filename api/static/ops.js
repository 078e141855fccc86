// Clarion operations dashboard: polls /v1/ops/queues and /v1/notifications with an admin key.
// Everything is drawn locally (a <canvas> line chart); no external scripts or fonts.
"use strict";

(function () {
  const KEY = "clarion.ops.key";
  const params = new URLSearchParams(location.search);
  const INTERVAL_MS = Math.max(500, Number(params.get("interval_ms")) || 2000);
  const HISTORY = 90; // samples kept per chart
  const history = {}; // channel -> [{t, throughput, lag}]
  let timer = null;

  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k.startsWith("data-")) node.setAttribute(k, v);
      else node[k] = v;
    }
    for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child ?? "")));
    return node;
  }

  async function api(path, options) {
    const key = sessionStorage.getItem(KEY);
    const response = await fetch(path, {
      ...(options || {}),
      headers: { Authorization: "Bearer " + key, Accept: "application/json" },
    });
    let body = null;
    try { body = await response.json(); } catch (_) { body = null; }
    return { status: response.status, body };
  }

  window.ClarionOps = { el }; // shared with analytics.js, loaded after this file

  function errorText(result) {
    const e = result.body && result.body.error;
    return e ? `${e.code}: ${e.message}` : `HTTP ${result.status}`;
  }

  function age(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    if (seconds < 120) return `${seconds.toFixed(1)} s`;
    if (seconds < 7200) return `${(seconds / 60).toFixed(1)} min`;
    return `${(seconds / 3600).toFixed(1)} h`;
  }

  function ensureCard(channel) {
    let card = $(`card-${channel}`);
    if (card) return card;
    const canvas = el("canvas", { id: `chart-${channel}`, width: 600, height: 160, "data-samples": "0" });
    card = el(
      "div", { class: "card", id: `card-${channel}`, "data-channel": channel },
      el("h2", {}, channel),
      el("div", { class: "figures", id: `figures-${channel}` }),
      canvas,
      el("div", { class: "legend" },
        el("span", { class: "thr" }, "— completed / min"), el("span", { class: "lag" }, "— consumer lag")),
      el("h3", { class: "muted" }, "Status (last hour)"),
      el("table", {}, el("tbody", { id: `statuses-${channel}` })),
      el("h3", { class: "muted" }, "Lanes"),
      el("table", {},
        el("thead", {}, el("tr", {}, ...["lane", "depth", "lag", "oldest", "partitions"].map((h) => el("th", {}, h)))),
        el("tbody", { id: `lanes-${channel}` })),
      el("p", {},
        "Dead-letter queue: ", el("b", { id: `dlq-${channel}` }, "0"), " ",
        el("button", { type: "button", id: `redrive-${channel}`, onclick: () => redrive(channel) }, "Redrive"),
        " ", el("span", { class: "muted", id: `redrive-status-${channel}`, role: "status" })),
    );
    $("channels").append(card);
    return card;
  }

  function figure(label, value) {
    return el("div", {}, el("b", {}, value), el("span", { class: "muted" }, label));
  }

  function renderChannel(c) {
    ensureCard(c.channel);
    const breakers = Object.entries(c.breakers);
    $(`figures-${c.channel}`).replaceChildren(
      figure("waiting", c.depth),
      figure("consumer lag", c.lag === null ? "?" : c.lag),
      figure("oldest waiting", age(c.oldest_age_s)),
      figure("accepted / min", c.accepted_last_min),
      figure("completed / min", c.completed_last_min),
      el("div", {}, el("b", {}, ...(breakers.length
        ? breakers.map(([p, s]) => el("span", { class: `state-${s}`, title: p }, `${p}: ${s} `))
        : ["–"])), el("span", { class: "muted" }, "breakers")),
    );
    const statuses = Object.entries(c.counts);
    $(`statuses-${c.channel}`).replaceChildren(
      ...(statuses.length
        ? statuses.map(([s, n]) => el("tr", { "data-status": s }, el("td", {}, s), el("td", {}, n)))
        : [el("tr", {}, el("td", { class: "muted" }, "no notifications"))]),
    );
    $(`lanes-${c.channel}`).replaceChildren(
      ...c.lanes.map((l) => el("tr", {},
        el("td", {}, l.lane), el("td", {}, l.depth), el("td", {}, l.lag === null ? "?" : l.lag),
        el("td", {}, age(l.oldest_age_s)),
        el("td", { class: "muted" }, l.partitions.map((p) => `p${p.partition}:${p.lag}`).join(" ")))),
    );
    $(`dlq-${c.channel}`).textContent = String(c.dlq);
    const points = (history[c.channel] = history[c.channel] || []);
    points.push({ t: Date.now(), throughput: c.completed_last_min, lag: c.lag || 0 });
    if (points.length > HISTORY) points.shift();
    drawChart($(`chart-${c.channel}`), points);
  }

  function drawChart(canvas, points) {
    const ctx = canvas.getContext("2d");
    const w = canvas.width, h = canvas.height, pad = 24;
    ctx.clearRect(0, 0, w, h);
    ctx.font = "11px system-ui, sans-serif";
    ctx.strokeStyle = "#e4e7ec";
    ctx.beginPath(); ctx.moveTo(pad, h - pad); ctx.lineTo(w - 4, h - pad); ctx.stroke();
    const max = Math.max(1, ...points.map((p) => Math.max(p.throughput, p.lag)));
    ctx.fillStyle = "#667085";
    ctx.fillText(String(max), 2, 12);
    ctx.fillText("0", 2, h - pad);
    const span = Math.max(20, points.length) - 1; // fills the width as samples arrive
    const x = (i) => pad + (i * (w - pad - 4)) / span;
    const y = (v) => h - pad - (v * (h - pad - 8)) / max;
    for (const [field, color] of [["throughput", "#2e90fa"], ["lag", "#f04438"]]) {
      ctx.strokeStyle = color;
      ctx.lineWidth = 2;
      ctx.beginPath();
      points.forEach((p, i) => (i ? ctx.lineTo(x(i), y(p[field])) : ctx.moveTo(x(i), y(p[field]))));
      ctx.stroke();
    }
    canvas.dataset.samples = String(points.length);
    canvas.dataset.last = JSON.stringify(points[points.length - 1] || null);
  }

  function notificationRow(n, withError) {
    const when = new Date(n.created_at).toLocaleTimeString();
    const cells = [el("td", {}, when), el("td", {}, el("code", {}, n.id))];
    if (withError) {
      cells.push(el("td", {}, n.channel), el("td", {}, n.status),
        el("td", {}, el("code", {}, n.error ? n.error.code : "")), el("td", {}, n.error ? n.error.message || "" : ""));
    } else {
      cells.push(el("td", {}, n.event_id), el("td", {}, n.channel), el("td", {}, n.status), el("td", {}, n.provider || ""));
    }
    return el("tr", { "data-id": n.id }, ...cells);
  }

  function renderList(tbody, items, withError) {
    $(tbody).replaceChildren(
      ...(items.length ? items.map((n) => notificationRow(n, withError))
        : [el("tr", {}, el("td", { colspan: 6, class: "muted" }, "None."))]),
    );
  }

  async function refresh() {
    const [queues, recent, failures] = await Promise.all([
      api("/v1/ops/queues"),
      api("/v1/notifications?limit=15"),
      api("/v1/notifications?status=failed&status=dead&limit=15"),
    ]);
    if (queues.status === 401 || queues.status === 403) return signOut(errorText(queues));
    if (queues.status !== 200) {
      $("updated").textContent = `Update failed (${errorText(queues)}); retrying.`;
      return;
    }
    for (const c of queues.body.channels) renderChannel(c);
    const k = queues.body.kafka;
    $("kafka").textContent = k.available ? "Kafka: reachable" : `Kafka: unreachable (${k.error || "?"})`;
    $("kafka").className = k.available ? "muted" : "error";
    const log = queues.body.log;
    if (log) {
      const size = log.total_bytes === null ? "" : `${(log.total_bytes / 1048576).toFixed(1)} MiB, `;
      $("log").textContent = `Log: ${size}${log.days_kept} day(s) since ${log.oldest_day || "–"} ` +
        `(retention ${log.retention_days} d), partitions ${log.partitions_ahead} d ahead` +
        (log.default_rows ? `, ${log.default_rows} row(s) in a default partition` : "");
      $("log").className = log.partitions_ahead < 2 || log.default_rows ? "error" : "muted";
    }
    if (recent.status === 200) renderList("recent", recent.body.items, false);
    if (failures.status === 200) renderList("failures", failures.body.items, true);
    $("updated").textContent = `Updated ${new Date().toLocaleTimeString()}`;
    $("updated").dataset.updates = String(Number($("updated").dataset.updates || 0) + 1);
  }

  async function redrive(channel) {
    const status = $(`redrive-status-${channel}`);
    const button = $(`redrive-${channel}`);
    button.disabled = true;
    status.textContent = "Redriving…";
    try {
      const result = await api(`/v1/ops/dlq/${encodeURIComponent(channel)}/redrive`, { method: "POST" });
      if (result.status === 404 || result.status === 405) status.textContent = "Redrive is not available on this server.";
      else if (result.status >= 400) status.textContent = `Redrive failed: ${errorText(result)}`;
      else {
        const n = result.body && result.body.requeued;
        status.textContent = n === undefined || n === null ? "Redrive requested." : `Requeued ${n}.`;
      }
    } catch (err) {
      status.textContent = `Redrive failed: ${err}`;
    } finally {
      button.disabled = false;
    }
    refresh();
  }

  async function tick() {
    try { await refresh(); } catch (err) { $("updated").textContent = `Update failed (${err}); retrying.`; }
    if (sessionStorage.getItem(KEY)) timer = setTimeout(tick, INTERVAL_MS);
  }

  function show(signedIn) {
    $("login").hidden = signedIn;
    $("dashboard").hidden = !signedIn;
    $("logout").hidden = !signedIn;
  }

  function signOut(message) {
    sessionStorage.removeItem(KEY);
    clearTimeout(timer);
    show(false);
    $("login-error").textContent = message || "";
  }

  $("login").addEventListener("submit", async (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, $("api-key").value.trim());
    const check = await api("/v1/ops/queues");
    if (check.status !== 200) return signOut(`Sign-in refused: ${errorText(check)}`);
    $("api-key").value = "";
    $("login-error").textContent = "";
    show(true);
    tick();
  });
  $("logout").addEventListener("click", () => signOut(""));

  if (sessionStorage.getItem(KEY)) { show(true); tick(); } else show(false);
})();
