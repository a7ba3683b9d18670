"""Alert rules and webhooks on the incidents page: tables, forms with per-field errors,
and a "send test notification" button per webhook.

The forms check what the browser can (a required name, numbers that parse); the server
checks the rest, and each message of its 422 answer is shown under the field it names
(FastAPI's ``loc``), a 409 (name taken) under the name.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

import dash
from dash import ALL, Input, Output, State, ctx, dcc, html, no_update
from fleetscope.dashboard.client import ApiClient, ApiResult
from fleetscope.dashboard.components import card, message, result_message, severity_badge, table

RULE_KINDS = ("straggler", "hang", "heartbeat_lost", "hardware_error", "mfu_drop", "collective_mismatch")
"""The server's rule kinds (``GET /openapi.json``, RuleCreate.kind); the server validates."""
SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class FormField:
    name: str
    """The API field (``loc[-1]`` of the server's validation errors)."""
    label: str
    kind: str = "text"
    """text | password | number | int | select | multi | csv | bool"""
    default: Any = None
    options: tuple[str, ...] = ()
    placeholder: str = ""
    required: bool = False
    help: str = ""


RULE_FIELDS = (
    FormField("name", "name", required=True, placeholder="e.g. slow ranks 10%"),
    FormField("kind", "kind", "select", "straggler", RULE_KINDS),
    FormField("job", "job", placeholder="every job"),
    FormField("severity", "severity", "select", "warning", SEVERITIES),
    FormField("min_slowdown", "min slowdown", "number", 0.05, help="straggler: est. job slowdown ≥ (0.05 = 5%)"),
    FormField("min_steps", "min steps", "int", 5, help="straggler: seen for ≥ steps"),
    FormField("min_mfu_drop", "min MFU drop", "number", 0.0, help="mfu_drop: relative decline ≥ (0.1 = 10%)"),
    FormField("enabled", "enabled", "bool", True),
)
WEBHOOK_FIELDS = (
    FormField("name", "name", required=True, placeholder="e.g. ops pager"),
    FormField("url", "URL", required=True, placeholder="https://alerts.example.com/fleetscope"),
    FormField("secret", "signing secret", "password", placeholder="optional HMAC-SHA256 key"),
    FormField("min_severity", "min severity", "select", "warning", SEVERITIES),
    FormField("filter_kinds", "rule kinds", "multi", [], RULE_KINDS, placeholder="all kinds"),
    FormField("filter_jobs", "jobs", "csv", placeholder="all jobs (or: job-a, job-b)"),
    FormField("timeout_s", "timeout (s)", "number", 5.0),
    FormField("max_attempts", "max attempts", "int", 12),
    FormField("enabled", "enabled", "bool", True),
)
FORMS = {"rule": ("/alerts/rules", RULE_FIELDS), "webhook": ("/alerts/webhooks", WEBHOOK_FIELDS)}


def _fid(form: str, field: str) -> str:
    return f"{form}-f-{field}"


def _eid(form: str, field: str) -> str:
    return f"{form}-e-{field}"


def _input(form: str, f: FormField) -> Any:
    fid = _fid(form, f.name)
    if f.kind in ("select", "multi"):
        return dcc.Dropdown(id=fid, options=[{"label": o, "value": o} for o in f.options], value=f.default,
                            multi=f.kind == "multi", clearable=f.kind == "multi", placeholder=f.placeholder,
                            className="fs-select")
    if f.kind == "bool":
        return dcc.Checklist(id=fid, options=[{"label": " yes", "value": "yes"}], value=["yes"] if f.default else [],
                             className="fs-check")
    typ: Literal["text", "number", "password"] = (
        "number" if f.kind in ("number", "int") else "password" if f.kind == "password" else "text")
    return dcc.Input(id=fid, type=typ, value=f.default, placeholder=f.placeholder, debounce=False,
                     step="any" if f.kind == "number" else 1 if f.kind == "int" else None, className="fs-input")


def form(form_name: str) -> html.Div:
    """The create form: one labelled input per field, its error under it."""
    _, fields = FORMS[form_name]
    cells = [
        html.Div([html.Label(f.label + (" *" if f.required else ""), htmlFor=_fid(form_name, f.name)),
                  _input(form_name, f),
                  html.Div(f.help, className="fs-field-help") if f.help else None,
                  html.Div(id=_eid(form_name, f.name), className="fs-field-error")],
                 className=f"fs-field fs-field-{f.kind}")
        for f in fields
    ]
    return html.Div(
        [html.H4(f"New {form_name}"), html.Div(cells, className="fs-form-grid"),
         html.Div([html.Button(f"Create {form_name}", id=f"{form_name}-create", className="fs-btn"),
                   html.Div(id=f"{form_name}-create-status", className="fs-form-status")], className="fs-form-actions")],
        className="fs-form", id=f"{form_name}-form",
    )


def cards() -> list[Any]:
    return [
        card("Alert rules", html.Div(message("loading rules…", "loading"), id="rules-list"), form("rule")),
        card("Webhooks", html.Div(message("loading webhooks…", "loading"), id="webhooks-list"),
             html.Div(id="webhook-test-status"), form("webhook")),
        dcc.Store(id="rules-sig", data=None),
        dcc.Store(id="webhooks-sig", data=None),
    ]


# ---- turning form values into a body, and the server's errors into field messages ---------
def body_of(fields: tuple[FormField, ...], values: list[Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(request body, field -> error) from the raw input values."""
    body: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for f, v in zip(fields, values):
        if f.kind == "bool":
            body[f.name] = "yes" in (v or [])
        elif f.kind == "multi":
            body[f.name] = list(v or [])
        elif f.kind == "csv":
            body[f.name] = [p.strip() for p in str(v or "").split(",") if p.strip()]
        elif f.kind in ("number", "int"):
            if v is None or v == "":
                errors[f.name] = "enter a number" if f.kind == "number" else "enter a whole number"
            elif f.kind == "int" and float(v) != int(float(v)):
                errors[f.name] = "enter a whole number"
            else:
                body[f.name] = int(float(v)) if f.kind == "int" else float(v)
        else:
            text = str(v or "").strip()
            if f.required and not text:
                errors[f.name] = "required"
            elif text or f.kind == "text":
                body[f.name] = text
    return body, errors


def field_errors(res: ApiResult, names: set[str]) -> tuple[dict[str, str], str]:
    """(field -> message, message for the form) of a failed create call."""
    detail = res.detail
    out: dict[str, str] = {}
    rest: list[str] = []
    if isinstance(detail, list):
        for d in detail:
            loc = [str(x) for x in (d.get("loc") or []) if x != "body"] if isinstance(d, dict) else []
            msg = str(d.get("msg", "")) if isinstance(d, dict) else str(d)
            msg = msg.removeprefix("Value error, ")
            if loc and loc[0] in names:
                out.setdefault(loc[0], msg)
            else:
                rest.append(f"{'.'.join(loc)}: {msg}" if loc else msg)
    elif res.status == 409 and "name" in names:
        out["name"] = str(detail or res.error)
    else:
        rest.append(res.error)
    return out, "; ".join(r for r in rest if r)


def _signature(data: Any) -> str:
    raw = json.dumps(data, sort_keys=True, default=str).encode()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def _rule_rows(items: list[dict]) -> tuple[list[str], list[list[Any]]]:
    cols = ["name", "kind", "job", "severity", "min slowdown", "min steps", "min MFU drop", "enabled", ""]
    rows = [[r.get("name", ""), r.get("kind", ""), r.get("job") or "all", severity_badge(r.get("severity", "")),
             f"{100 * float(r.get('min_slowdown') or 0):.0f}%", str(r.get("min_steps", 0)),
             f"{100 * float(r.get('min_mfu_drop') or 0):.0f}%",
             ("yes" if r.get("enabled") else "no") + (" (built-in)" if r.get("builtin") else ""),
             html.Button("Delete", id={"type": "rule-delete", "id": str(r.get("id"))}, className="fs-btn fs-secondary")]
            for r in items]
    return cols, rows


def _webhook_rows(items: list[dict]) -> tuple[list[str], list[list[Any]]]:
    cols = ["name", "URL", "rule kinds", "jobs", "min severity", "signed", "enabled", ""]
    rows = [[h.get("name", ""), html.Span(h.get("url", ""), title=h.get("url", ""), className="fs-ellipsis"),
             ", ".join(h.get("filter_kinds") or []) or "all", ", ".join(h.get("filter_jobs") or []) or "all",
             severity_badge(h.get("min_severity", "")), "yes" if h.get("has_secret") else "no",
             "yes" if h.get("enabled") else "no",
             html.Div([html.Button("Send test", id={"type": "webhook-test", "id": str(h.get("id"))},
                                   className="fs-btn fs-secondary", title="send a test notification now"),
                       html.Button("Delete", id={"type": "webhook-delete", "id": str(h.get("id"))},
                                   className="fs-btn fs-secondary")], className="fs-actions")]
            for h in items]
    return cols, rows


def register(app: dash.Dash, client: ApiClient) -> None:
    for form_name in FORMS:
        _register_form(app, client, form_name)
    _register_list(app, client, "rule", "rules-list", "rules-sig", _rule_rows)
    _register_list(app, client, "webhook", "webhooks-list", "webhooks-sig", _webhook_rows)

    @app.callback(
        Output("webhook-test-status", "children"),
        Input({"type": "webhook-test", "id": ALL}, "n_clicks"),
        prevent_initial_call=True,
    )
    def send_test(clicks):
        trig = ctx.triggered_id
        if not isinstance(trig, dict) or not any(clicks or []):
            return no_update
        res = client.test_webhook(trig["id"])
        if not res.ok:
            return message(f"test notification to webhook {trig['id']} not sent: {res.error}", "error")
        d = res.data or {}
        if not d.get("delivered"):
            return message(f"test notification to webhook {trig['id']} failed: {d.get('error', '')}", "error",
                           id="webhook-test-failed")
        return html.Div(f"test notification delivered to webhook {trig['id']} in {d.get('elapsed_ms', 0):.0f} ms",
                        className="fs-msg fs-ok-msg", id="webhook-test-ok")


def _register_form(app: dash.Dash, client: ApiClient, form_name: str) -> None:
    path, fields = FORMS[form_name]
    names = {f.name for f in fields}

    @app.callback(
        [Output(_eid(form_name, f.name), "children") for f in fields],
        Output(f"{form_name}-create-status", "children"),
        Input(f"{form_name}-create", "n_clicks"),
        [State(_fid(form_name, f.name), "value") for f in fields],
        prevent_initial_call=True,
    )
    def create(_clicks, *values):
        body, errors = body_of(fields, list(values))
        status: Any = ""
        if not errors:
            res = client.create(path, body)
            if res.ok:
                created = res.data or {}
                return [""] * len(fields) + [html.Div(f"{form_name} {created.get('name', '')!r} created "
                                                      f"(#{created.get('id')})", className="fs-msg fs-ok-msg",
                                                      id=f"{form_name}-created")]
            errors, rest = field_errors(res, names)
            status = message(f"could not create {form_name}: {rest}", "error") if rest else ""
        if errors and not status:
            status = message(f"could not create {form_name}: check the marked fields", "error")
        return [errors.get(f.name, "") for f in fields] + [status]


def _register_list(app: dash.Dash, client: ApiClient, kind: str, list_id: str, sig_id: str, rows_of: Any) -> None:
    path, _ = FORMS[kind]

    @app.callback(
        Output(list_id, "children"),
        Output(sig_id, "data"),
        Input("tick", "data"),
        Input(f"{kind}-create-status", "children"),
        Input({"type": f"{kind}-delete", "id": ALL}, "n_clicks"),
        State(sig_id, "data"),
    )
    def listing(_n, _created, deletes, last_sig):
        trig = ctx.triggered_id
        if isinstance(trig, dict) and any(deletes or []):
            client.delete(path, trig["id"])  # the id quoted as one path segment
        res = client.get(path)
        if not res.ok:
            return result_message(res, f"{kind}s"), None
        items = res.data if isinstance(res.data, list) else []
        sig = _signature(items)
        if sig == last_sig:  # unchanged: keep the rendered rows (a click is never lost to a re-render)
            return no_update, no_update
        if not items:
            return message(f"no {kind}s configured"), sig
        cols, rows = rows_of(items)
        return html.Div(table(cols, rows, id=f"{kind}s-table"), className="fs-fit"), sig
