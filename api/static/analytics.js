// Clarion operations dashboard, engagement section: rates per channel and template over the last
// 24 hours (GET /v1/analytics, hourly), drawn on <canvas> locally; no external scripts or fonts.
"use strict";

(function () {
  const KEY = "clarion.ops.key"; // the key ops.js keeps for this tab
  const params = new URLSearchParams(location.search);
  const INTERVAL_MS = Math.max(1000, Number(params.get("analytics_ms")) || 10000);
  const HOURS = 24;
  const LINES = [["delivery_rate", "#12805c"], ["open_rate", "#2e90fa"], ["click_rate", "#f79009"]];
  const $ = (id) => document.getElementById(id);

  const el = window.ClarionOps.el; // ops.js, loaded first

  const pct = (v) => (v === null || v === undefined ? "–" : `${(100 * v).toFixed(1)}%`);

  function series(rows, since) {
    // One point per hour of the window; an hour without sends has no rates (a gap in the line).
    const points = Array.from({ length: HOURS }, () => null);
    for (const r of rows) {
      const i = Math.floor((Date.parse(r.at) - since) / 3600000);
      if (i >= 0 && i < HOURS) points[i] = r;
    }
    return points;
  }

  function draw(canvas, points) {
    const ctx = canvas.getContext("2d");
    const w = canvas.width, h = canvas.height, pad = 28;
    ctx.clearRect(0, 0, w, h);
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#667085";
    ctx.fillText("100%", 0, 12);
    ctx.fillText("0", 2, h - pad);
    ctx.strokeStyle = "#e4e7ec";
    ctx.beginPath(); ctx.moveTo(pad, h - pad); ctx.lineTo(w - 4, h - pad); ctx.stroke();
    const x = (i) => pad + (i * (w - pad - 4)) / (HOURS - 1);
    const y = (v) => h - pad - v * (h - pad - 8);
    for (const [field, color] of LINES) {
      ctx.strokeStyle = color;
      ctx.fillStyle = color;
      ctx.lineWidth = 2;
      ctx.beginPath();
      let drawing = false;
      points.forEach((p, i) => {
        const v = p && p.rates[field];
        if (v === null || v === undefined) { drawing = false; return; }
        if (drawing) ctx.lineTo(x(i), y(v)); else ctx.moveTo(x(i), y(v));
        drawing = true;
        ctx.fillRect(x(i) - 1.5, y(v) - 1.5, 3, 3);
      });
      ctx.stroke();
    }
  }

  function card(key, rows, since) {
    const [channel, template] = key.split("\u0000");
    const totals = { sent: 0, delivered: 0, opened: 0, clicked: 0 };
    for (const r of rows) for (const k of Object.keys(totals)) totals[k] += r.counts[k];
    const rate = (k) => (totals.sent ? totals[k] / totals.sent : null);
    const canvas = el("canvas", { width: 600, height: 160 });
    const id = `analytics-${channel}-${template || "inline"}`;
    canvas.dataset.rates = JSON.stringify({ sent: totals.sent, open_rate: rate("opened"), click_rate: rate("clicked"),
      delivery_rate: rate("delivered") });
    draw(canvas, series(rows, since));
    return el("div", { class: "card", id, "data-channel": channel, "data-template": template },
      el("h2", {}, `${channel} · ${template || "inline content"}`),
      el("p", { class: "muted" }, `sent ${totals.sent} · delivered ${pct(rate("delivered"))} · opened ${pct(rate("opened"))}`
        + ` · clicked ${pct(rate("clicked"))}`),
      canvas,
      el("div", { class: "legend" }, ...LINES.map(([f, c]) => el("span", { style: `color:${c}` }, `— ${f.replace("_", " ")}`))));
  }

  async function refresh() {
    const key = sessionStorage.getItem(KEY);
    const box = $("analytics");
    if (!key || !box || $("dashboard").hidden) return;
    const until = new Date(Math.ceil(Date.now() / 3600000) * 3600000);
    const since = until.getTime() - HOURS * 3600000;
    const query = new URLSearchParams({ interval: "hour", group_by: "channel,template",
      since: new Date(since).toISOString(), until: until.toISOString() });
    const rows = [];
    let cursor = null;
    do { // the answer comes a page at a time: follow next_cursor to the last page (null)
      if (cursor) query.set("cursor", cursor);
      const response = await fetch(`/v1/analytics?${query}`, { headers: { Authorization: "Bearer " + key } });
      if (response.status !== 200) { box.dataset.error = String(response.status); return; }
      const body = await response.json();
      rows.push(...body.rows);
      cursor = body.next_cursor;
    } while (cursor);
    const groups = new Map();
    for (const r of rows) {
      const k = `${r.group.channel}\u0000${r.group.template}`;
      if (!groups.has(k)) groups.set(k, []);
      groups.get(k).push(r);
    }
    box.replaceChildren(...(groups.size ? [...groups].map(([k, rows]) => card(k, rows, since))
      : [el("p", { class: "muted" }, "No sends in the last 24 hours.")]));
    box.dataset.updates = String(Number(box.dataset.updates || 0) + 1);
  }

  async function tick() {
    try { await refresh(); } catch (err) { if ($("analytics")) $("analytics").dataset.error = String(err); }
    setTimeout(tick, INTERVAL_MS);
  }
  tick();
})();
