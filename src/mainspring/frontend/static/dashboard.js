// The live page: polls /dashboard/timeline twice a second for what came since its last poll (its cursor), keeps
// the last 30 s of each controller's rows (actions and answers) and redraws every panel from them: the per-model
// figures are worked out here, so that a poll costs the controller little (benchmarks/dashboard_cost.py).
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
const HORIZON_NS = 30e9, MAX_MISS_TICKS = 2000;
let cursor = "";
const stores = new Map();  // per controller (a cell's index, or "main"): its rows and its last view

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

function columns(names) { return Object.fromEntries(names.map((name, i) => [name, i])); }

function absorb(data) {  // the rows since the last poll into each controller's store, the older than 30 s out
  for (const view of data.views) {
    const key = view.cell ?? "main", last = stores.get(key);
    // Its rows follow on from the last view's only when it says so: else (a controller started again, a cursor
    // too old) a window anew, with nothing kept from before that it would repeat.
    const store = last && last.view.now_ns === view.since_ns ? last : { actions: [], answers: [] };
    stores.set(key, store);
    const A = columns(view.action_columns), R = columns(view.answer_columns), since = view.now_ns - HORIZON_NS;
    store.actions = store.actions.concat(view.actions).filter(row => row[A.received_ns] >= since);
    store.answers = store.answers.concat(view.answers).filter(row => row[R.answered_ns] >= since);
    Object.assign(store, { view, A, R, names: new Map(view.models.map(m => [m.key, m.model])) });
  }
  for (const key of [...stores.keys()]) if (!data.views.some(v => (v.cell ?? "main") === key)) stores.delete(key);
  cursor = data.cursor;
}

function mark(row, A, now) {  // an action row as the lanes draw it, in ms before now
  const ms = t => (t - now) / 1e6, ran = row[A.begin_ns] >= 0;
  const predicted = Math.max(row[A.earliest_ns], row[A.sent_ns]);
  return {
    lane: row[A.kind] === "infer" ? "exec" : "load", kind: row[A.kind], model: row[A.model], batch: row[A.batch_size],
    status: row[A.status], message: row[A.message],
    begin_ms: ms(ran ? row[A.begin_ns] : row[A.received_ns]), end_ms: ms(ran ? row[A.end_ns] : row[A.received_ns]),
    predicted_begin_ms: ms(predicted), predicted_end_ms: ms(predicted + row[A.expected_ns]),
  };
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

function drawDevices(seconds) {
  const lanes = document.getElementById("lanes"), since = seconds * 1e9;
  lanes.replaceChildren();
  let refused = 0, actions = 0, devices = 0;
  for (const store of stores.values()) {
    const { view, actions: rows, A } = store;
    const offset = view.device_offset || 0, now = view.now_ns, pools = {}, byDevice = {};
    for (const p of view.pools) pools[p.device] = p;
    for (const row of rows.concat(view.in_flight)) {
      const ended = row[A.begin_ns] >= 0 ? row[A.end_ns] : row[A.received_ns];
      if (ended >= now - since) (byDevice[row[A.device]] = byDevice[row[A.device]] || []).push(row);
    }
    for (const device of view.devices) {
      const id = offset + device, pool = pools[device];
      devices += 1;
      html("h3", {}, `device ${id}` + (pool ? ` (${pool.kind})` : "") +
           (view.cell === undefined ? "" : `, cell ${view.cell}`), lanes);
      if (pool) {
        const share = pool.total_pages ? pool.used_pages / pool.total_pages : 0;
        const row = html("div", { class: "pool", "data-device": id, "data-used": pool.used_pages,
                                  "data-total": pool.total_pages }, undefined, lanes);
        const bar = html("div", { class: "bar" }, undefined, row);
        html("div", { class: "fill", style: `width: ${(100 * share).toFixed(1)}%` }, undefined, bar);
        const names = pool.models.map(key => modelName(store, key));
        html("span", {}, `pool ${(100 * share).toFixed(0)}% (${pool.used_pages} of ${pool.total_pages} pages): ` +
             (names.join(", ") || "empty"), row);
      }
      const marks = (byDevice[device] || []).map(row => ({ ...mark(row, A, now), model: modelName(store, row[A.model]) }));
      activity(lanes, id, marks, seconds);
      const lane = svg("svg", { width: LEFT + WIDTH + 10, height: 96, "data-device": id }, lanes);
      svg("text", { x: 2, y: LANES.exec + 10, class: "label" }, lane).textContent = "exec";
      svg("text", { x: 2, y: LANES.load + 10, class: "label" }, lane).textContent = "load";
      for (const a of marks) refused += drawAction(lane, a, seconds) ? 1 : 0;
      actions += marks.length;
      axis(lane, seconds, 76);
    }
  }
  return { refused, actions, devices };
}

function activity(parent, id, marks, seconds) {  // what the device did in the window, in a line
  const ran = marks.filter(a => a.status === "ok"), infers = ran.filter(a => a.kind === "infer");
  const busy = infers.reduce((sum, a) => sum + Math.max(0, Math.min(a.end_ms, 0) -
                                                         Math.max(a.begin_ms, -seconds * 1000)), 0) / (seconds * 1000);
  const late = infers.map(a => a.end_ms - a.predicted_end_ms).sort((a, b) => a - b);
  const refused = {};
  for (const a of marks.filter(a => a.status !== "ok" && a.status !== "in_flight")) {
    const reason = `${a.kind} ${a.status}: ${a.message.replace(/[0-9]+(\.[0-9]+)?/g, "N").slice(0, 80)}`;
    refused[reason] = (refused[reason] || 0) + 1;
  }
  const reasons = Object.entries(refused).map(([k, v]) => `${k} (${v})`);
  const count = kind => ran.filter(a => a.kind === kind).length;
  const batches = infers.reduce((sum, a) => sum + a.batch, 0);
  const off = late.length ? `; each ended ${fixed(percentile(late.map(v => v * 1e6), 0.5), 2)} ms after its ` +
    `prediction at the median, ${fixed(percentile(late.map(v => v * 1e6), 0.99), 2)} ms at p99` : "";
  html("p", { class: "activity", "data-device": id, "data-busy": busy.toFixed(6), "data-infers": infers.length,
              "data-refused": Object.values(refused).reduce((a, b) => a + b, 0) },
       `exec lane ${(100 * busy).toFixed(0)}% busy: ${infers.length} batches of ${batches} requests${off}. ` +
       `Load lane: ${count("load")} loads, ${count("evict")} evictions. ` +
       (reasons.length ? `Refused by the worker: ${reasons.join("; ")}.` : "Nothing refused."), parent);
}

function modelName(store, key) { return store.names.get(key) ?? key; }  // a key is name@n once reloaded

function missed(row, R) { return row[R.outcome] !== "" || !row[R.met]; }

// From when a controller's answers are all there within the last `seconds`: it keeps them only while a page
// polls, so from this page's first poll (or one after a break: a hidden tab's timers slowed past 30 s).
function answersSince(view, seconds) { return Math.max(view.now_ns - seconds * 1e9, view.answers_from_ns); }

function drawMisses(seconds) {
  const row = document.getElementById("miss-row"), ticks = [];
  row.replaceChildren();
  svg("text", { x: 2, y: 14, class: "label" }, row).textContent = "misses";
  let count = 0;
  for (const store of stores.values()) {
    const { view, answers, R } = store, since = answersSince(view, seconds);
    for (const answer of answers) {
      const at = (answer[R.answered_ns] - view.now_ns) / 1e6;
      if (answer[R.answered_ns] < since || !missed(answer, R)) continue;
      count += 1;
      ticks.push({ at, model: modelName(store, answer[R.model]), outcome: answer[R.outcome] || "late" });
    }
  }
  for (const m of ticks.slice(-MAX_MISS_TICKS)) {  // a tick each, up to the last thousands
    const tick = svg("rect", { x: clampX(m.at, seconds), y: 4, width: 2, height: 14, fill: "#e63946",
                               "data-miss": m.outcome, "data-model": m.model }, row);
    title(tick, `${m.model}: ${m.outcome}, ${fixed(-m.at / 1000, 1)} s ago`);
  }
  svg("line", { x1: LEFT, x2: LEFT + WIDTH, y1: 20, y2: 20, stroke: "#bbb" }, row);
  return count;
}

function drawExplained() {
  const list = document.getElementById("explained"), all = [];
  for (const store of stores.values()) {
    const view = store.view;
    for (const e of view.explained) all.push({ ...e, ago_s: (view.now_ns - e.answered_ns) / 1e9, cell: view.cell,
                                               model: modelName(store, e.model) });
  }
  all.sort((a, b) => a.ago_s - b.ago_s);
  list.replaceChildren();
  if (!all.length) html("li", { class: "none" }, "no misses in the last 30 seconds", list);
  for (const e of all.slice(0, 8)) {
    const item = html("li", { "data-request-id": e.request_id, "data-model": e.model, "data-outcome": e.outcome,
                              "data-cause": e.cause }, undefined, list);
    const where = e.cell === undefined ? "" : `, cell ${e.cell}`;
    html("span", {}, `request ${e.request_id} (${e.model}${where}, ${fixed(e.ago_s, 1)} s ago): `, item);
    html("span", { class: "cause" }, e.cause, item);
    if (e.detail) html("span", { class: "detail" }, ` (${e.detail})`, item);
  }
}

function percentile(sorted, share) {  // nearest rank (as /metrics' quantiles), in ms
  return sorted.length ? sorted[Math.max(0, Math.ceil(share * sorted.length) - 1)] / 1e6 : null;
}

function drawModels(seconds) {  // a row per model; with cells, each cell's answers and devices together
  const body = document.querySelector("#models tbody"), rows = new Map();
  let counted = 0;  // the seconds the answers cover (the longest of the controllers')
  for (const { view, answers, R } of stores.values()) {
    const since = answersSince(view, seconds), offset = view.device_offset || 0, names = new Map();
    const span = (view.now_ns - since) / 1e9, share = span > 0 ? 1 / span : 0;  // an answer's part of a rate
    counted = Math.max(counted, span);
    for (const m of view.models) {
      names.set(m.key, m.model);
      if (!rows.has(m.model)) rows.set(m.model, { model: m.model, slo_ms: m.slo_ms, n: 0, rate: 0, met: 0,
                                                  latencies: [], rejections: {}, resident: [], last_used_s: null });
      const row = rows.get(m.model), used = view.last_used_ns[m.key];
      row.resident.push(...view.pools.filter(p => p.models.includes(m.key)).map(p => offset + p.device));
      if (used !== undefined) {
        const ago = (view.now_ns - used) / 1e9;
        row.last_used_s = row.last_used_s === null ? ago : Math.min(row.last_used_s, ago);
      }
    }
    for (const answer of answers) {
      const row = rows.get(names.get(answer[R.model]));
      if (answer[R.answered_ns] < since || !row) continue;
      const reason = answer[R.outcome] || (answer[R.met] ? "" : "late");
      row.n += 1;
      row.rate += share;
      row.met += answer[R.met] ? 1 : 0;
      if (!answer[R.outcome]) row.latencies.push(answer[R.latency_ns]);
      if (reason) row.rejections[reason] = (row.rejections[reason] || 0) + 1;
    }
  }
  body.replaceChildren();
  const caption = document.getElementById("counted");
  caption.dataset.seconds = counted.toFixed(3);
  caption.textContent = counted < seconds - 0.5 ? `Answers counted over the ${counted.toFixed(1)} s since this ` +
    "page began watching (the controller keeps them only while a page is open)." : "";
  for (const m of [...rows.values()].sort((a, b) => a.model.localeCompare(b.model))) {
    m.latencies.sort((a, b) => a - b);
    const rate = m.rate, attained = m.n ? m.met / m.n : null, reasons = Object.entries(m.rejections);
    const p50 = percentile(m.latencies, 0.5), p99 = percentile(m.latencies, 0.99);
    const row = html("tr", {
      "data-model": m.model, "data-rate": rate.toFixed(2), "data-attained": attained ?? "", "data-p50": p50 ?? "",
      "data-p99": p99 ?? "", "data-resident": m.resident.join(","), "data-last-used": m.last_used_s ?? "",
      "data-rejections": reasons.map(([k, v]) => `${k}:${v}`).join(","),
    }, undefined, body);
    html("td", {}, m.model, row);
    html("td", {}, fixed(m.slo_ms, 0), row);
    html("td", {}, fixed(rate, 1), row);
    const cell = html("td", {}, attained === null ? "-" : `${(100 * attained).toFixed(2)}%`, row);
    cell.className = attained === null ? "" : attained < 0.99 ? "bad" : "good";
    html("td", {}, fixed(p50, 2), row);
    html("td", {}, fixed(p99, 2), row);
    html("td", { class: "text" + (reasons.length ? " bad" : "") },
         reasons.map(([k, v]) => `${k} ${v}`).join(", ") || "none", row);
    html("td", { class: "text" }, m.resident.length ? m.resident.map(d => `device ${d}`).join(", ") : "nowhere", row);
    html("td", {}, m.last_used_s === null ? "never" : `${m.last_used_s.toFixed(1)} s ago`, row);
  }
}

function drawLag() {
  const views = [...stores.values()].map(s => s.view), lag = document.getElementById("loop-lag");
  const worst = views.length ? Math.max(...views.map(v => v.loop_lag_ms)) : null;  // none: no controller answered
  lag.dataset.ms = worst ?? "";
  lag.textContent = `controller loop lag: ${fixed(worst, 2)} ms` + (views.length > 1 ? " (the worst cell's)" : "");
  const table = document.getElementById("cells"), body = table.querySelector("tbody");
  const cells = views.filter(v => v.cell !== undefined);
  body.replaceChildren();
  table.hidden = !cells.length;
  for (const v of cells) {
    const row = html("tr", { "data-cell": v.cell, "data-lag-ms": v.loop_lag_ms }, undefined, body);
    html("td", {}, String(v.cell), row);
    html("td", {}, String(v.devices.length), row);
    html("td", {}, fixed(v.loop_lag_ms, 2), row);
  }
}

function render() {
  const seconds = Number(document.getElementById("seconds").value);
  drawModels(seconds);
  drawExplained();
  const misses = drawMisses(seconds);
  const { refused, actions, devices } = drawDevices(seconds);
  drawLag();
  const summary = document.getElementById("summary");
  summary.dataset.updates = String(Number(summary.dataset.updates) + 1);
  summary.dataset.actions = String(actions);
  summary.dataset.refused = String(refused);
  summary.dataset.misses = String(misses);
  document.getElementById("counts").textContent =
    `${devices} device(s), ${actions} actions, ${refused} refused, ${misses} misses`;
}

async function poll() {
  const counts = document.getElementById("counts");
  try {  // a server that does not answer in 5 s: said so, and asked again
    const url = "/dashboard/timeline?seconds=30&cursor=" + encodeURIComponent(cursor);
    const response = await fetch(url, { signal: AbortSignal.timeout(5000) });
    if (response.ok) {
      absorb(await response.json());
      render();
    } else {  // the panels keep the last answer's figures
      counts.textContent = `no data: HTTP ${response.status} ${(await response.text()).slice(0, 200)}`;
    }
  } catch (error) { counts.textContent = "no answer: " + error; }
  setTimeout(poll, 500);
}
document.getElementById("seconds").addEventListener("change", render);
poll();
