"""The built-in live page (``GET /dashboard``): per model, per device, the controller's loop lag, and why the
last requests missed.

The page is three files of the package (``frontend/static/``: HTML, a script and a style sheet; nothing from
elsewhere, so it works with no internet). Its script polls ``GET /dashboard/timeline?seconds=30&cursor=C`` twice a
second for what came since its last poll (``telemetry.live_view``: the controller's rows of actions and answers as
they are, the last misses explained), keeps 30 s of them and draws, over the last 5, 10 or 30 s:

- each model's rate, attainment against its SLO, p50 and p99, rejections by reason, the devices that hold it and
  when it was last used;
- each device's pool use and its exec and load lanes on a time axis, every action where it ran under the window
  the controller predicted for it (refused ones in red, those in flight outlined), and the misses on a row;
- the controller's event-loop lag (with cells, each cell's);
- the last misses, each with its cause as ``mainspring analyze`` gives it.

Every mark and row carries ``data-*`` attributes (tested in a headless browser).
"""

from __future__ import annotations

import re
from importlib import resources

from aiohttp import web

from mainspring.frontend.dataplane import InferenceError

MAX_SECONDS = 30.0
# A cursor: the controller's clock reading, or each cell's with its index (``cells_metrics``); none at first.
CURSOR = re.compile(r"[0-9]{1,20}|[0-9]{1,6}:[0-9]{1,20}(,[0-9]{1,6}:[0-9]{1,20})*|")
MAX_CURSOR = 4096
ASSETS = {"dashboard.js": "application/javascript", "dashboard.css": "text/css"}


def _read(name: str) -> str:
    return resources.files("mainspring.frontend").joinpath("static", name).read_text(encoding="utf-8")


async def page(request: web.Request) -> web.Response:
    return web.Response(text=_read("dashboard.html"), content_type="text/html")


async def asset(request: web.Request) -> web.Response:
    """The page's script or style sheet; any other name is not found."""
    name = request.match_info["asset"]
    if name not in ASSETS:
        raise web.HTTPNotFound()
    return web.Response(text=_read(name), content_type=ASSETS[name])


def timeline_cursor(raw_cursor: str) -> str:
    """The page's ``cursor`` query parameter, as a view gave it (``CURSOR``): a 400 naming it when not."""
    if len(raw_cursor) > MAX_CURSOR or not CURSOR.fullmatch(raw_cursor):
        raise InferenceError(400, f"query parameter 'cursor' must be one a view gave, got {raw_cursor[:32]!r}")
    return raw_cursor


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
