"""The fleet page: jobs with step rate and MFU, open incidents, hosts with problems."""

from __future__ import annotations

from urllib.parse import quote

import dash
from dash import Input, Output, dcc, html
from fleetscope.dashboard.client import ApiClient, items_of
from fleetscope.dashboard.components import (
    card,
    message,
    result_message,
    severity_badge,
    state_badge,
    table,
)
from fleetscope.dashboard.pages.host import host_href, selfcheck_hosts_panel

MAX_JOB_DETAILS = 50


def layout(app: dash.Dash) -> html.Div:
    return html.Div(
        [
            card("Jobs", html.Div(message("loading jobs…", "loading"), id="fleet-jobs")),
            html.Div(
                [
                    card("Open incidents", html.Div(message("loading incidents…", "loading"), id="fleet-incidents")),
                    card("Hosts with problems", html.Div(message("loading hosts…", "loading"), id="fleet-hosts")),
                ],
                className="fs-row",
            ),
        ]
    )


def register(app: dash.Dash, client: ApiClient) -> None:
    @app.callback(
        Output("fleet-jobs", "children"),
        Input("tick", "data"),
        Input("url", "pathname"),
        running=[(Output("busy-list", "data"), True, False)],
    )
    def jobs(_n, _path):
        res = client.jobs()
        if not res.ok:
            return result_message(res, "the job list")
        if not res.data:
            return message("no jobs yet: start one with `fleetscope train ... --server URL`")
        inc = client.incidents(status="open")
        open_by_job: dict[str, int] = {}
        for i in items_of(inc.data):
            open_by_job[i.get("job", "")] = open_by_job.get(i.get("job", ""), 0) + 1
        rows = []
        for j in res.data[:500]:
            detail = client.job(j["id"]).data if len(rows) < MAX_JOB_DETAILS else None
            detail = detail or {}
            t = j.get("topology") or {}
            rate = detail.get("steps_per_s")
            rows.append(
                [
                    html.Div([dcc.Link(j["id"], href=app.get_relative_path("/jobs/" + quote(str(j["id"]), safe="")),
                                       id={"type": "job-link", "job": j["id"]}),
                              html.Div(j.get("name") or "", className="fs-msg", style={"padding": 0})]),
                    state_badge(j.get("status", "?")),
                    f"DP {t.get('dp')} × PP {t.get('pp')} × TP {t.get('tp')} ({t.get('world_size')} ranks)",
                    "-" if detail.get("last_step") is None else str(detail["last_step"]),
                    "-" if not rate else f"{rate:.2f}/s",
                    "-" if detail.get("mfu") is None else f"{100 * detail['mfu']:.1f}%",
                    str(open_by_job.get(j["id"], 0)) if inc.ok else "-",
                ]
            )
        return table(["job", "status", "topology", "step", "step rate", "MFU", "open incidents"], rows)

    @app.callback(Output("fleet-incidents", "children"), Input("tick", "data"), Input("url", "pathname"))
    def incidents(_n, _path):
        res = client.incidents(status="open")
        if not res.ok:
            return result_message(res, "incidents")
        items = [i for i in items_of(res.data) if i.get("status", "open") == "open"]
        if not items:
            return message("no open incidents")
        return table(
            ["severity", "job", "what", "ranks"],
            [
                [severity_badge(i.get("severity", "")), i.get("job", ""),
                 dcc.Link(i.get("summary", i.get("kind", "")), href=app.get_relative_path("/incidents/" + quote(str(i.get("id")), safe=""))),
                 ", ".join(str(r) for r in (i.get("ranks") or [])[:8])]
                for i in items[:50]
            ],
        )

    @app.callback(Output("fleet-hosts", "children"), Input("tick", "data"), Input("url", "pathname"))
    def hosts(_n, _path):
        res = client.hosts()
        if res.not_available:  # no host list route: the self-check summary names the hosts
            return selfcheck_hosts_panel(client.selfcheck_hosts(), app.get_relative_path)
        if not res.ok:
            return result_message(res, "host health")
        items = items_of(res.data, "hosts")
        bad = [h for h in items or [] if str(h.get("status", h.get("state", "ok"))).lower() not in ("ok", "healthy")]
        if not bad:
            return message(f"all {len(items or [])} hosts healthy")
        return table(
            ["host", "status", "problems"],
            [[_host_link(app, h.get("host", h.get("name", "?"))), state_badge(str(h.get("status", h.get("state", "?")))),
              "; ".join(str(p) for p in (h.get("problems") or h.get("issues") or []))[:200]] for h in bad[:100]],
        )


def _host_link(app: dash.Dash, name: str) -> dcc.Link:
    return dcc.Link(name, href=app.get_relative_path(host_href(name)))
