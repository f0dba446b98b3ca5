// The live page: polls /dashboard/timeline twice a second and redraws every panel from it.
// Every mark and row carries data-* attributes, so that a test (and a person's devtools) can read them.
"use strict";
const WIDTH = 1000, LEFT = 40, NS = "http://www.w3.org/2000/svg";
const COLORS = { infer: "#2a9d8f", load: "#457b9d", evict: "#f4a261" };
const LANES = { exec: 18, load: 58 };  // each lane: its predicted windows (6 px) over where it ran (12 px)

function svg(name, attrs, parent) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}
function html(name, attrs, text, parent) {
  const node = document.createElement(name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}
function x(ms, seconds) { return LEFT + WIDTH + ms * WIDTH / (seconds * 1000); }
function clampX(ms, seconds) { return Math.min(LEFT + WIDTH, Math.max(LEFT, x(ms, seconds))); }
function title(node, text) { svg("title", {}, node).textContent = text; }
function fixed(value, digits) { return value === null || value === undefined ? "-" : value.toFixed(digits); }

function axis(parent, seconds, y) {  // ticks in seconds before now
  const step = seconds <= 5 ? 1 : seconds <= 10 ? 2 : 5;
  svg("line", { x1: LEFT, x2: LEFT + WIDTH, y1: y, y2: y, stroke: "#bbb" }, parent);
  for (let s = 0; s <= seconds; s += step) {
    const at = x(-s * 1000, seconds);
    svg("line", { x1: at, x2: at, y1: y, y2: y + 4, stroke: "#999", "data-tick": s }, parent);
    const label = svg("text", { x: at, y: y + 14, class: "tick", "text-anchor": s === 0 ? "end" : "middle" }, parent);
    label.textContent = s === 0 ? "now" : `-${s} s`;
  }
}

function drawAction(parent, a, seconds) {
  const y = LANES[a.lane], bad = a.status !== "ok" && a.status !== "in_flight";
  const predicted = svg("rect", {
    x: clampX(a.predicted_begin_ms, seconds), y: y - 7, height: 5, fill: "none", stroke: "#6c757d",
    width: Math.max(1, clampX(a.predicted_end_ms, seconds) - clampX(a.predicted_begin_ms, seconds)),
    "data-mark": "predicted", "data-lane": a.lane, "data-model": a.model,
  }, parent);
  title(predicted, `${a.kind} ${a.model}: predicted ${fixed(a.predicted_begin_ms, 1)} to ${fixed(a.predicted_end_ms, 1)} ms`);
  const begin = clampX(a.begin_ms, seconds);
  const actual = svg("rect", {
    x: begin, y: y, width: Math.max(1.5, clampX(a.end_ms, seconds) - begin), height: 12,
    "data-mark": "actual", "data-lane": a.lane, "data-kind": a.kind, "data-status": a.status, "data-model": a.model,
    "data-late-ms": (a.end_ms - a.predicted_end_ms).toFixed(3),
    fill: a.status === "in_flight" ? "none" : bad ? "#e63946" : COLORS[a.kind],
    stroke: a.status === "in_flight" ? "#6c757d" : "none",
  }, parent);
  const ran = `ran ${fixed(a.begin_ms, 1)} to ${fixed(a.end_ms, 1)} ms`;
  const off = `ended ${fixed(a.end_ms - a.predicted_end_ms, 2)} ms after the prediction`;
  title(actual, `${a.kind} ${a.model}` + (a.batch ? ` x${a.batch}` : "") + ` ${a.status}: ${ran}, ${off}` +
        (a.message ? `; ${a.message}` : ""));
  return bad;
}

function drawDevices(data) {
  const s = data.seconds, lanes = document.getElementById("lanes"), pools = {};
  for (const p of data.pools || []) pools[p.device] = p;
  lanes.replaceChildren();
  let refused = 0;
  const byDevice = {};
  for (const a of data.actions) (byDevice[a.device] = byDevice[a.device] || []).push(a);
  for (const device of data.devices) {
    const pool = pools[device];
    html("h3", {}, `device ${device}` + (pool ? ` (${pool.kind})` : ""), lanes);
    if (pool) {
      const share = pool.total_pages ? pool.used_pages / pool.total_pages : 0;
      const row = html("div", { class: "pool", "data-device": device, "data-used": pool.used_pages,
                                "data-total": pool.total_pages }, undefined, lanes);
      const bar = html("div", { class: "bar" }, undefined, row);
      html("div", { class: "fill", style: `width: ${(100 * share).toFixed(1)}%` }, undefined, bar);
      html("span", {}, `pool ${(100 * share).toFixed(0)}% (${pool.used_pages} of ${pool.total_pages} pages): ` +
           (pool.models.join(", ") || "empty"), row);
    }
    const lane = svg("svg", { width: LEFT + WIDTH + 10, height: 96, "data-device": device }, lanes);
    svg("text", { x: 2, y: LANES.exec + 10, class: "label" }, lane).textContent = "exec";
    svg("text", { x: 2, y: LANES.load + 10, class: "label" }, lane).textContent = "load";
    for (const a of byDevice[device] || []) refused += drawAction(lane, a, s) ? 1 : 0;
    axis(lane, s, 76);
  }
  return refused;
}

function drawMisses(data) {
  const s = data.seconds, row = document.getElementById("miss-row");
  row.replaceChildren();
  svg("text", { x: 2, y: 14, class: "label" }, row).textContent = "misses";
  for (const m of data.misses) {
    const tick = svg("rect", { x: clampX(m.at_ms, s), y: 4, width: 2, height: 14, fill: "#e63946",
                               "data-miss": m.outcome, "data-model": m.model, "data-request-id": m.request_id }, row);
    title(tick, `request ${m.request_id} (${m.model}): ${m.outcome}`);
  }
  svg("line", { x1: LEFT, x2: LEFT + WIDTH, y1: 20, y2: 20, stroke: "#bbb" }, row);
}

function drawExplained(data) {
  const list = document.getElementById("explained");
  list.replaceChildren();
  if (!data.explained.length) html("li", { class: "none" }, "no misses in this window", list);
  for (const e of data.explained) {
    const item = html("li", { "data-request-id": e.request_id, "data-model": e.model, "data-outcome": e.outcome,
                              "data-cause": e.cause }, undefined, list);
    const where = e.cell === undefined ? "" : `, cell ${e.cell}`;
    html("span", {}, `request ${e.request_id} (${e.model}${where}, ${fixed(-e.at_ms / 1000, 1)} s ago): `, item);
    html("span", { class: "cause" }, e.cause, item);
    if (e.detail) html("span", { class: "detail" }, ` (${e.detail})`, item);
  }
}

function drawModels(data) {
  const body = document.querySelector("#models tbody");
  body.replaceChildren();
  for (const m of data.models || []) {
    const row = html("tr", {
      "data-model": m.model, "data-rate": m.rate_rps, "data-attained": m.attained ?? "", "data-p50": m.p50_ms ?? "",
      "data-p99": m.p99_ms ?? "", "data-resident": m.resident.join(","), "data-last-used": m.last_used_s ?? "",
      "data-rejections": Object.entries(m.rejections).map(([k, v]) => `${k}:${v}`).join(","),
    }, undefined, body);
    if (m.cell !== undefined) row.dataset.cell = m.cell;
    html("td", {}, m.model + (m.cell === undefined ? "" : ` (cell ${m.cell})`), row);
    html("td", {}, fixed(m.slo_ms, 0), row);
    html("td", {}, fixed(m.rate_rps, 1), row);
    const attained = html("td", {}, m.attained === null ? "-" : `${(100 * m.attained).toFixed(2)}%`, row);
    attained.className = m.attained === null ? "" : m.attained < 0.99 ? "bad" : "good";
    html("td", {}, fixed(m.p50_ms, 2), row);
    html("td", {}, fixed(m.p99_ms, 2), row);
    const reasons = Object.entries(m.rejections).map(([k, v]) => `${k} ${v}`).join(", ");
    html("td", { class: "text" + (reasons ? " bad" : "") }, reasons || "none", row);
    html("td", { class: "text" }, m.resident.length ? m.resident.map(d => `device ${d}`).join(", ") : "nowhere", row);
    html("td", {}, m.last_used_s === null ? "never" : `${m.last_used_s.toFixed(1)} s ago`, row);
  }
}

function drawLag(data) {
  const lag = document.getElementById("loop-lag");
  lag.dataset.ms = data.loop_lag_ms;
  lag.textContent = `controller loop lag: ${fixed(data.loop_lag_ms, 2)} ms`;
  const table = document.getElementById("cells"), body = table.querySelector("tbody");
  body.replaceChildren();
  table.hidden = !(data.cells && data.cells.length);
  for (const c of data.cells || []) {
    const row = html("tr", { "data-cell": c.cell, "data-lag-ms": c.loop_lag_ms }, undefined, body);
    html("td", {}, String(c.cell), row);
    html("td", {}, String(c.devices), row);
    html("td", {}, fixed(c.loop_lag_ms, 2), row);
  }
}

function render(data) {
  drawModels(data);
  drawExplained(data);
  drawMisses(data);
  const refused = drawDevices(data);
  drawLag(data);
  const summary = document.getElementById("summary");
  summary.dataset.updates = String(Number(summary.dataset.updates) + 1);
  summary.dataset.actions = String(data.actions.length);
  summary.dataset.refused = String(refused);
  summary.dataset.misses = String(data.misses.length);
  document.getElementById("counts").textContent =
    `${data.devices.length} device(s), ${data.actions.length} actions, ${refused} refused, ` +
    `${data.misses.length} misses`;
}

async function poll() {
  try {
    const seconds = document.getElementById("seconds").value;
    const response = await fetch("/dashboard/timeline?seconds=" + seconds);
    if (response.ok) render(await response.json());
  } catch (error) { document.getElementById("counts").textContent = "no answer: " + error; }
  setTimeout(poll, 500);
}
poll();
