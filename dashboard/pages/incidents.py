"""Incidents (list, detail, acknowledge, resolve) and alert rules / webhooks management
(the forms are in :mod:`.alert_forms`)."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from urllib.parse import quote

import dash
from dash import ALL, Input, Output, State, ctx, dcc, html, no_update
from fleetscope.dashboard.client import ApiClient, ApiResult
from fleetscope.dashboard.components import (
    card,
    message,
    result_message,
    severity_badge,
    state_badge,
    table,
)

from . import alert_forms

ACTIONS = {"ack": ("acknowledge", "ack"), "resolve": ("resolve",)}


def _factor_text(ev) -> str:
    """`` · compute 1.79x its peers (95%: 1.40-2.30, 3 steps)`` from a straggler's evidence."""
    if not isinstance(ev, dict) or not ev.get("factor"):
        return ""
    try:
        text = f" · {ev.get('component') or 'factor'} {float(ev['factor']):.2f}x its peers"
        lo, hi = ev.get("factor_interval") or (None, None)
        if lo is not None and hi is not None:
            text += f" (95%: {float(lo):.2f}–{float(hi):.2f}, {int(ev.get('judged_steps', 0))} steps)"
    except (TypeError, ValueError):
        return ""
    return text


def _when(ns: int | None) -> str:
    if not ns:
        return "-"
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _seg(v) -> str:
    """One URL path segment (a job id with ``/``, ``?`` or ``#`` stays one segment)."""
    return quote(str(v if v is not None else ""), safe="")


def _ranks(v) -> list:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return []
    return list(v or [])


def layout(app: dash.Dash, incident_id: str | None) -> html.Div:
    if incident_id is not None:
        return html.Div(
            [
                dcc.Store(id="incident-id", data=incident_id),
                dcc.Store(id="incident-sig", data=None),
                dcc.Link("← all incidents", href=app.get_relative_path("/incidents")),
                card(None, html.Div(message("loading incident…", "loading"), id="incident-detail")),
                html.Div(id="incident-action-status"),
            ]
        )
    return html.Div(
        [
            dcc.Store(id="incident-id", data=None),
            dcc.Store(id="incident-sig", data=None),
            card(
                "Incidents",
                dcc.RadioItems(
                    id="incident-filter",
                    options=[{"label": f" {s} ", "value": s} for s in ("open", "acknowledged", "resolved", "all")],
                    value="open",
                    inline=True,
                ),
                html.Div(message("loading incidents…", "loading"), id="incident-list"),
            ),
            html.Div(id="incident-action-status"),
            *alert_forms.cards(),
        ]
    )


def _action_buttons(inc: dict) -> html.Div:
    status = inc.get("status", "open")
    iid = inc.get("id")
    return html.Div(
        [
            html.Button("Acknowledge", id={"type": "inc-action", "action": "ack", "id": str(iid)},
                        className="fs-btn fs-secondary", disabled=status != "open"),
            html.Button("Resolve", id={"type": "inc-action", "action": "resolve", "id": str(iid)},
                        className="fs-btn fs-secondary", disabled=status == "resolved", style={"marginLeft": "6px"}),
        ]
    )


def _items(res: ApiResult, key: str) -> list[dict]:
    data = res.data
    if isinstance(data, dict):
        data = data.get(key, data.get("items", []))
    return list(data or [])


def _signature(key, data) -> str:
    """A digest of what a refresh would render; equal digests mean nothing to redraw."""
    raw = json.dumps([key, data], sort_keys=True, default=str).encode()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def register(app: dash.Dash, client: ApiClient) -> None:
    def act(iid: str, action: str) -> ApiResult:
        res = ApiResult(error="unknown action")
        for name in ACTIONS[action]:
            res = client.incident_action(iid, name)
            if not res.not_available:
                break
        return res

    @app.callback(
        Output("incident-action-status", "children"),
        Input({"type": "inc-action", "action": ALL, "id": ALL}, "n_clicks"),
        prevent_initial_call=True,
    )
    def on_action(clicks):
        trig = ctx.triggered_id
        if not trig or not any(clicks or []):
            return no_update
        res = act(trig["id"], trig["action"])
        verb = "acknowledged" if trig["action"] == "ack" else "resolved"
        if not res.ok:
            return message(f"incident {trig['id']} could not be {verb}: {res.error}", "error")
        return html.Div(f"incident {trig['id']} {verb}", className="fs-msg", id="action-ok")

    @app.callback(
        Output("incident-list", "children"),
        Output("incident-sig", "data", allow_duplicate=True),
        Input("tick", "data"),
        Input("incident-filter", "value"),
        Input("incident-action-status", "children"),
        State("incident-sig", "data"),
        prevent_initial_call="initial_duplicate",
    )
    def incident_list(_n, status, _action, last_sig):
        res = client.incidents(status=None if status == "all" else status)
        if not res.ok:
            return result_message(res, "incidents"), None
        items = _items(res, "incidents")
        if status != "all":
            items = [i for i in items if i.get("status", "open") == status]
        sig = _signature(status, items)
        if sig == last_sig:
            # Unchanged: keep the rendered rows, so a click on a button is never lost to a re-render.
            return no_update, no_update
        if not items:
            return message(f"no {status if status != 'all' else ''} incidents".replace("  ", " ")), sig
        rows = [
            [
                dcc.Link(f"#{i.get('id')}", href=app.get_relative_path(f"/incidents/{_seg(i.get('id'))}")),
                severity_badge(i.get("severity", "")),
                state_badge(i.get("status", "open")),
                dcc.Link(i.get("job", ""), href=app.get_relative_path(f"/jobs/{_seg(i.get('job', ''))}")),
                i.get("kind", ""),
                i.get("summary", "")[:140],
                ", ".join(str(r) for r in _ranks(i.get("ranks"))[:8]),
                _when(i.get("opened_ns")),
                _action_buttons(i),
            ]
            for i in items[:200]
        ]
        shown = table(["id", "severity", "status", "job", "kind", "summary", "ranks", "opened", ""], rows,
                      id="incident-table")
        total = res.data.get("total", len(items)) if isinstance(res.data, dict) else len(items)
        if isinstance(total, int) and total > len(rows):
            shown = html.Div([shown, message(f"newest {len(rows)} of {total} shown")])
        return shown, sig

    @app.callback(
        Output("incident-detail", "children"),
        Output("incident-sig", "data", allow_duplicate=True),
        Input("tick", "data"),
        Input("incident-id", "data"),
        Input("incident-action-status", "children"),
        State("incident-sig", "data"),
        prevent_initial_call="initial_duplicate",
    )
    def incident_detail(_n, iid, _action, last_sig):
        if iid is None:
            return no_update, no_update
        res = client.incident(iid)
        if not res.ok:
            return result_message(res, f"incident {iid}"), None
        i = res.data
        sig = _signature(iid, i)
        if sig == last_sig:
            return no_update, no_update
        ranks = _ranks(i.get("ranks"))
        ev = i.get("evidence")
        if isinstance(ev, str):
            try:
                ev = json.loads(ev)
            except ValueError:
                pass
        job_href = f"/jobs/{_seg(i.get('job', ''))}" + (f"?rank={ranks[0]}" if ranks else "")
        return html.Div(
            [
                html.H3([severity_badge(i.get("severity", "")), state_badge(i.get("status", "open")),
                         f" #{i.get('id')} {i.get('kind', '')}"]),
                html.P(i.get("summary", ""), id="incident-summary"),
                html.P(["job ", dcc.Link(i.get("job", ""), href=app.get_relative_path(job_href)),
                        f" · ranks {ranks[:16]}" if ranks else "",
                        f" · steps {i.get('first_step')}–{i.get('last_step')}" if i.get("first_step", -1) >= 0 else "",
                        f" · est. slowdown {100 * float(i['est_slowdown']):.1f}%" if i.get("est_slowdown") else "",
                        _factor_text(ev)]),
                html.P(f"opened {_when(i.get('opened_ns'))} · acknowledged {_when(i.get('acknowledged_ns'))}"
                       f" · resolved {_when(i.get('resolved_ns'))}"),
                _action_buttons(i),
                html.H3("Evidence"),
                html.Pre(json.dumps(ev, indent=2, default=str) if not isinstance(ev, str) else ev, className="fs-evidence"),
            ]
        ), sig

    alert_forms.register(app, client)
