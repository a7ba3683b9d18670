"""Telemetry text is shown as text, and ids stay one URL segment (issue #13 item 17).

Plotly renders its strings as pseudo-HTML (``<a href>`` becomes a link inside a bar,
``<b>`` bold, ``<br>`` a line break). Span, op, lane and series names and log lines
come from the trainers, so the figure builders must escape them; the links the pages
build from job and incident ids must quote them as one path segment. The link test
drives the real Dash app (Flask test client) against a loopback HTTP API stub.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fleetscope.dashboard.app import create_dash_app
from fleetscope.dashboard.figures.common import message_figure, plain
from fleetscope.dashboard.figures.timeline import build_timeline
from fleetscope.dashboard.figures.trends import build_hardware

EVIL = '<a href="https://evil.example/phish">click me</a>'
BOLD = "<b>big</b><br>"


def strings(obj) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in strings(v)]
    if isinstance(obj, (list, tuple)):
        return [s for v in obj for s in strings(v)]
    return []


def markup_in(fig) -> list[str]:
    """Strings of a figure that carry markup other than the builders' own ``<br>``/``<extra>``."""
    out = []
    for s in strings(fig.to_plotly_json()):
        rest = s.replace("<br>", "").replace("<extra></extra>", "")
        if "<" in rest or ">" in rest:
            out.append(s)
    return out


def test_plain_makes_markup_literal():
    assert plain(EVIL) == '&#60;a href="https://evil.example/phish"&#62;click me&#60;/a&#62;'
    assert plain("a & b") == "a &#38; b" and plain(3) == "3"


def test_timeline_escapes_span_op_lane_names():
    spans = [
        {"rank": 0, "step": 1, "cat": "section", "name": EVIL, "kind": BOLD, "start_ns": 0, "end_ns": 10_000_000},
        {"rank": 0, "step": 1, "cat": "collective", "name": "allreduce", "op": EVIL, "group_id": BOLD,
         "seq": 1, "state": "<i>x</i>", "start_ns": 0, "end_ns": 5_000_000},
        {"rank": 1, "step": 1, "cat": "section", "name": "forward", "mb": 0, "start_ns": 0, "end_ns": 5_000_000},
    ]
    fig = build_timeline({"spans": spans, "lanes": [{"rank": 0, "label": EVIL}, {"rank": 1, "label": "r1"}],
                          "links": [], "from_step": 1, "to_step": 1, "t0_ns": 0})
    assert markup_in(fig) == []
    texts = " ".join(strings(fig.to_plotly_json()))
    assert "&#60;a href" in texts  # still shown, as text
    assert "F0" in texts  # the builders' own labels are unchanged


def test_hardware_escapes_log_lines_and_series_names():
    data = {"t0_ns": 0,
            "series": [{"name": EVIL, "device": BOLD, "ts_ns": [0, 1_000_000_000], "value": [1, 2]}],
            "events": [{"ts_ns": 500_000_000, "kind": "nccl", "severity": "error", "message": EVIL}]}
    fig = build_hardware(data)
    assert markup_in(fig) == []


def test_placeholder_messages_escape_what_they_quote():
    assert markup_in(message_figure(f"job {EVIL} not found", "error")) == []


class _Api(ThreadingHTTPServer):
    daemon_threads = True
    JOB = "team/a?x=1#frag"

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _ApiHandler)


class _ApiHandler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        path = self.path.split("?")[0]
        if path == "/api/v1/jobs":
            doc = [{"id": _Api.JOB, "status": "running", "topology": {"dp": 1, "tp": 1, "pp": 1}}]
        elif path == "/api/v1/incidents":
            doc = {"total": 1, "offset": 0, "limit": 100, "items": [
                {"id": 7, "job": _Api.JOB, "status": "open", "severity": "warning", "kind": "straggler",
                 "summary": EVIL, "ranks": [1], "opened_ns": 1}]}
        else:
            doc = {}
        out = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def _callback(app, output: str, inputs: list, state: list | None = None) -> dict:
    """POST one callback as the browser would; ``output`` is its key's start."""
    (key,) = [k for k in app.callback_map if k.startswith(output)]
    outs = [o.split("@")[0] for o in key.strip(".").split("...")]
    outputs = [{"id": o.rsplit(".", 1)[0], "property": o.rsplit(".", 1)[1]} for o in outs]
    body = {"output": key, "outputs": outputs if key.startswith("..") else outputs[0],
            "inputs": inputs, "changedPropIds": [f"{inputs[0]['id']}.{inputs[0]['property']}"],
            "state": state or []}
    r = app.server.test_client().post("/ui/_dash-update-component", json=body)
    assert r.status_code == 200, r.data[:300]
    return r.get_json()


def test_page_links_quote_job_and_incident_ids():
    api = _Api()
    threading.Thread(target=api.serve_forever, daemon=True).start()
    try:
        app = create_dash_app(f"http://127.0.0.1:{api.server_address[1]}", refresh_s=0)
        fleet = _callback(app, "fleet-jobs.children", [{"id": "tick", "property": "data", "value": 1},
                                                       {"id": "url", "property": "pathname", "value": "/ui/"}])
        inc = _callback(app, "..incident-list.children",
                        [{"id": "tick", "property": "data", "value": 1},
                         {"id": "incident-filter", "property": "value", "value": "open"},
                         {"id": "incident-action-status", "property": "children", "value": None}],
                        [{"id": "incident-sig", "property": "data", "value": None}])
    finally:
        api.shutdown()
    hrefs = [s for s in strings([fleet, inc]) if s.startswith("/ui/")]
    quoted = "/ui/jobs/team%2Fa%3Fx%3D1%23frag"
    assert quoted in hrefs, hrefs
    assert not [h for h in hrefs if h.startswith("/ui/jobs/team/")], hrefs
    assert "/ui/incidents/7" in hrefs
