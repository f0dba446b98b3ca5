"""The built-in live page: each device's exec and load lanes over the last seconds.

``GET /dashboard`` is one self-contained HTML page (no scripts from elsewhere: it works with
no internet); it polls ``GET /dashboard/timeline?seconds=S`` (``telemetry.timeline``) twice a
second and draws one SVG per device: infers on the exec lane, loads and evictions on the load
lane, refused actions in red, actions in flight as outlines, and the requests that missed their
SLO as ticks on a row of their own. Every mark carries ``data-*`` attributes (tested in a
headless browser).
"""

from __future__ import annotations

from aiohttp import web

from mainspring.frontend.dataplane import InferenceError

MAX_SECONDS = 30.0

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Mainspring: lanes</title>
<style>
 body { font: 13px system-ui, sans-serif; margin: 16px; color: #222; }
 svg { display: block; background: #f8f9fa; margin: 4px 0 12px; }
 .label { font-size: 11px; fill: #555; }
 #summary span { margin-right: 16px; }
</style></head>
<body>
<h1>Mainspring: the last <select id="seconds"><option>5</option><option selected>10</option>
<option>30</option></select> seconds</h1>
<p id="summary" data-updates="0"><span id="counts">waiting for data</span></p>
<p>Exec lane: infers (green); load lane: loads (blue) and evictions (orange); red: refused by the worker;
outlined: in flight (planned window). Misses: requests answered outside their SLO.</p>
<div id="misses"></div>
<div id="lanes"></div>
<script>
const WIDTH = 1000, NS = "http://www.w3.org/2000/svg";
const COLORS = { infer: "#2a9d8f", load: "#457b9d", evict: "#f4a261" };
function el(name, attrs, parent) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}
function x(ms, seconds) { return WIDTH + ms * WIDTH / (seconds * 1000); }
function title(node, text) { el("title", {}, node).textContent = text; }
function render(data) {
  const s = data.seconds, lanes = document.getElementById("lanes");
  lanes.replaceChildren();
  let refused = 0;
  for (const device of data.devices) {
    const header = document.createElement("h2");
    header.textContent = "device " + device;
    lanes.appendChild(header);
    const svg = el("svg", { width: WIDTH, height: 64, "data-device": device }, lanes);
    el("text", { x: 2, y: 11, class: "label" }, svg).textContent = "exec";
    el("text", { x: 2, y: 43, class: "label" }, svg).textContent = "load";
    for (const a of data.actions.filter(a => a.device === device)) {
      const y = a.lane === "exec" ? 14 : 46, left = Math.max(0, x(a.begin_ms, s));
      const width = Math.max(1.5, x(a.end_ms, s) - left);
      const bad = a.status !== "ok" && a.status !== "in_flight";
      refused += bad ? 1 : 0;
      const rect = el("rect", {
        x: left, y: y, width: width, height: 14, "data-lane": a.lane, "data-kind": a.kind,
        "data-status": a.status, "data-model": a.model,
        fill: a.status === "in_flight" ? "none" : bad ? "#e63946" : COLORS[a.kind],
        stroke: a.status === "in_flight" ? "#6c757d" : "none",
      }, svg);
      title(rect, `${a.kind} ${a.model}` + (a.batch ? ` x${a.batch}` : "") +
            ` ${a.status} ${(a.end_ms - a.begin_ms).toFixed(2)} ms ${a.message}`);
    }
  }
  const misses = el("svg", { width: WIDTH, height: 24, id: "miss-row" });
  el("text", { x: 2, y: 11, class: "label" }, misses).textContent = "misses";
  for (const m of data.misses) {
    const tick = el("rect", { x: x(m.at_ms, s), y: 12, width: 2, height: 12, fill: "#e63946",
                              "data-miss": m.outcome, "data-model": m.model }, misses);
    title(tick, `${m.model}: ${m.outcome}`);
  }
  document.getElementById("misses").replaceChildren(misses);
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
</script>
</body></html>
"""


async def page(request: web.Request) -> web.Response:
    return web.Response(text=PAGE, content_type="text/html")


def timeline_seconds(raw_seconds: str) -> float:
    """The page's ``seconds`` query parameter: a 400 naming it when it is bad."""
    try:
        seconds = float(raw_seconds)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= MAX_SECONDS:
        raise InferenceError(400, f"query parameter 'seconds' must be a number in (0, {MAX_SECONDS:g}], "
                                  f"got {raw_seconds[:32]!r}")  # fmt: skip
    return seconds
