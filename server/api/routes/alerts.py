"""Alert rules and webhooks (CRUD), and the delivery outbox (read-only)."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fleetscope.server.alerts.guard import AllowList, WebhookURLError, check_target, redact_url
from fleetscope.server.alerts.outbox import public_error
from fleetscope.server.alerts.rules import RULE_KINDS, SEVERITIES
from fleetscope.server.alerts.secrets import MAX_SECRET_CHARS, MIN_SECRET_CHARS, box_for
from fleetscope.server.api.deps import SessionDep
from fleetscope.server.db.diagnosis_models import AlertOutbox, AlertRule, Webhook, dumps
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

router = APIRouter(tags=["alerts"])


# ---- models -------------------------------------------------------------------------------
class RuleFields(BaseModel):
    job: str = Field("", max_length=200, description="job id; '' = every job")
    enabled: bool = True
    min_slowdown: float = Field(0.0, ge=0, le=10, description="straggler: est. job slowdown >= this fraction")
    min_steps: int = Field(0, ge=0, le=1_000_000, description="straggler: seen for >= this many steps")
    min_mfu_drop: float = Field(0.0, ge=0, le=1, description="mfu_drop: relative decline >= this fraction")
    severity: str = Field("warning", description="info | warning | critical")

    @field_validator("severity")
    @classmethod
    def _sev(cls, v: str) -> str:
        if v not in SEVERITIES:
            raise ValueError(f"severity {v!r}: expected one of {list(SEVERITIES)}")
        return v


class RuleCreate(RuleFields):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "name": "straggler-10pct-job-demo", "kind": "straggler", "job": "demo",
        "min_slowdown": 0.10, "min_steps": 20, "severity": "warning"}]})
    name: str = Field(min_length=1, max_length=200)
    kind: str = Field(description=" | ".join(RULE_KINDS))

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v not in RULE_KINDS:
            raise ValueError(f"kind {v!r}: expected one of {list(RULE_KINDS)}")
        return v


class RuleUpdate(BaseModel):
    job: str | None = None
    enabled: bool | None = None
    min_slowdown: float | None = Field(None, ge=0, le=10)
    min_steps: int | None = Field(None, ge=0, le=1_000_000)
    min_mfu_drop: float | None = Field(None, ge=0, le=1)
    severity: str | None = None

    @field_validator("severity")
    @classmethod
    def _sev(cls, v: str | None) -> str | None:
        if v is not None and v not in SEVERITIES:
            raise ValueError(f"severity {v!r}: expected one of {list(SEVERITIES)}")
        return v


class RulePublic(RuleFields):
    id: int
    name: str
    kind: str
    builtin: bool
    created_ns: int
    updated_ns: int


class WebhookFields(BaseModel):
    enabled: bool = True
    filter_jobs: list[str] = Field(default_factory=list, description="job ids; empty = all")
    filter_kinds: list[str] = Field(default_factory=list, description="rule kinds; empty = all")
    min_severity: str = "info"
    timeout_s: float = Field(default=5.0, gt=0, le=120, description="per-request timeout")
    max_attempts: int = Field(default=12, ge=1, le=100, description="delivery attempts before giving up")

    @field_validator("min_severity")
    @classmethod
    def _sev(cls, v: str) -> str:
        if v not in SEVERITIES:
            raise ValueError(f"min_severity {v!r}: expected one of {list(SEVERITIES)}")
        return v

    @field_validator("filter_kinds")
    @classmethod
    def _kinds(cls, v: list[str]) -> list[str]:
        bad = [k for k in v if k not in RULE_KINDS]
        if bad:
            raise ValueError(f"filter_kinds {bad[0]!r}: expected among {list(RULE_KINDS)}")
        return v


def _check_webhook(request: Request, url: str | None, secret: str | None) -> None:
    """URL rules + the SSRF guard's static part (IP literals, localhost) and the secret's
    length: 422 naming the field. Checked here rather than by pydantic validators, whose
    422 would echo the input (a URL with its token, a secret) back; so the lengths too."""
    errors = []
    if url is not None:
        allow = AllowList.parse(str(request.app.state.settings.webhook_allow or ""))
        try:
            check_target(url, allow)
        except WebhookURLError as e:
            errors.append({"loc": ["body", "url"], "type": "value_error", "msg": f"url {redact_url(url)!r}: {e}"})
    if secret and not MIN_SECRET_CHARS <= len(secret) <= MAX_SECRET_CHARS:
        errors.append({"loc": ["body", "secret"], "type": "value_error",
                       "msg": f"secret: must be {MIN_SECRET_CHARS} to {MAX_SECRET_CHARS} characters "
                              "('' sends unsigned)"})
    if errors:
        raise HTTPException(422, detail=errors)


def _public_hook(h: Webhook) -> dict:
    d = h.to_dict()
    d["url"] = redact_url(h.url)
    return d


def _public_row(r: AlertOutbox) -> dict:
    d = r.to_dict()
    d["last_error"] = public_error(d["last_error"])
    return d


class WebhookCreate(WebhookFields):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "name": "oncall", "url": "https://alerts.example.com/fleetscope", "secret": "a-long-shared-secret",
        "filter_kinds": ["hang", "straggler"], "min_severity": "warning"}]})
    name: str = Field(min_length=1, max_length=200)
    url: str = Field(description="http(s) URL without credentials; loopback, private and link-local "
                                 "targets need FLEETSCOPE_WEBHOOK_ALLOW")
    secret: str = Field("", description=f"HMAC-SHA256 key of {MIN_SECRET_CHARS}+ characters; "
                                                         "'' = unsigned; never returned")


class WebhookUpdate(BaseModel):
    url: str | None = None
    secret: str | None = None
    enabled: bool | None = None
    filter_jobs: list[str] | None = None
    filter_kinds: list[str] | None = None
    min_severity: str | None = None
    timeout_s: float | None = Field(None, gt=0, le=120)
    max_attempts: int | None = Field(None, ge=1, le=100)


class WebhookPublic(WebhookFields):
    id: int
    name: str
    url: str = Field(description="scheme, host and port only: the rest often holds a token")
    has_secret: bool
    created_ns: int
    updated_ns: int


# ---- rules ----------------------------------------------------------------------------------
def _rule(session: Any, rule_id: int) -> AlertRule:
    r = session.get(AlertRule, rule_id)
    if r is None:
        raise HTTPException(404, detail=f"alert rule {rule_id} not found")
    return r


@router.get("/alerts/rules", response_model=list[RulePublic])
def list_rules(session: SessionDep, kind: str | None = None, job: str | None = None,
               limit: Annotated[int, Query(ge=1, le=1000)] = 100,
               offset: Annotated[int, Query(ge=0)] = 0) -> list[dict]:
    """Alert rules (built-in defaults included), filtered by kind and job."""
    q = select(AlertRule)
    if kind:
        q = q.where(AlertRule.kind == kind)
    if job is not None:
        q = q.where(AlertRule.job == job)
    return [r.to_dict() for r in session.scalars(q.order_by(AlertRule.id).offset(offset).limit(limit))]


@router.post("/alerts/rules", response_model=RulePublic, status_code=201)
def create_rule(body: RuleCreate, session: SessionDep) -> dict:
    now = time.time_ns()
    r = AlertRule(**body.model_dump(), builtin=False, created_ns=now, updated_ns=now)
    session.add(r)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise HTTPException(409, detail=f"alert rule name {body.name!r} already exists") from None
    return r.to_dict()


@router.get("/alerts/rules/{rule_id}", response_model=RulePublic)
def get_rule(rule_id: int, session: SessionDep) -> dict:
    return _rule(session, rule_id).to_dict()


@router.patch("/alerts/rules/{rule_id}", response_model=RulePublic)
def update_rule(rule_id: int, body: RuleUpdate, session: SessionDep) -> dict:
    r = _rule(session, rule_id)
    for k, v in body.model_dump(exclude_none=True).items():
        setattr(r, k, v)
    r.updated_ns = time.time_ns()
    session.commit()
    return r.to_dict()


@router.delete("/alerts/rules/{rule_id}", status_code=204)
def delete_rule(rule_id: int, session: SessionDep) -> Response:
    """Delete a rule (built-in rules can be disabled with PATCH instead, or deleted)."""
    session.delete(_rule(session, rule_id))
    session.commit()
    return Response(status_code=204)


# ---- webhooks --------------------------------------------------------------------------------
def _hook(session: Any, hook_id: int) -> Webhook:
    h = session.get(Webhook, hook_id)
    if h is None:
        raise HTTPException(404, detail=f"webhook {hook_id} not found")
    return h


@router.get("/alerts/webhooks", response_model=list[WebhookPublic])
def list_webhooks(session: SessionDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                  offset: Annotated[int, Query(ge=0)] = 0) -> list[dict]:
    """Webhooks (secrets are never returned, only ``has_secret``; URLs only up to the port)."""
    return [_public_hook(h) for h in session.scalars(select(Webhook).order_by(Webhook.id).offset(offset).limit(limit))]


@router.post("/alerts/webhooks", response_model=WebhookPublic, status_code=201)
def create_webhook(body: WebhookCreate, request: Request, session: SessionDep) -> dict:
    _check_webhook(request, body.url, body.secret)
    now = time.time_ns()
    d = body.model_dump()
    d["filter_jobs"], d["filter_kinds"] = dumps(d["filter_jobs"]), dumps(d["filter_kinds"])
    d["secret"] = box_for(request.app.state.settings).seal(d["secret"])
    h = Webhook(**d, created_ns=now, updated_ns=now)
    session.add(h)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise HTTPException(409, detail=f"webhook name {body.name!r} already exists") from None
    return _public_hook(h)


@router.get("/alerts/webhooks/{hook_id}", response_model=WebhookPublic)
def get_webhook(hook_id: int, session: SessionDep) -> dict:
    return _public_hook(_hook(session, hook_id))


@router.patch("/alerts/webhooks/{hook_id}", response_model=WebhookPublic)
def update_webhook(hook_id: int, body: WebhookUpdate, request: Request, session: SessionDep) -> dict:
    h = _hook(session, hook_id)
    d = body.model_dump(exclude_none=True)
    _check_webhook(request, d.get("url"), d.get("secret"))
    if "secret" in d:
        d["secret"] = box_for(request.app.state.settings).seal(d["secret"])
    if "filter_kinds" in d:
        WebhookFields(filter_kinds=d["filter_kinds"])  # validates
    if "min_severity" in d:
        WebhookFields(min_severity=d["min_severity"])
    for k in ("filter_jobs", "filter_kinds"):
        if k in d:
            d[k] = json.dumps(d[k])
    for k, v in d.items():
        setattr(h, k, v)
    h.updated_ns = time.time_ns()
    session.commit()
    return _public_hook(h)


@router.delete("/alerts/webhooks/{hook_id}", status_code=204)
def delete_webhook(hook_id: int, session: SessionDep) -> Response:
    session.delete(_hook(session, hook_id))
    session.commit()
    return Response(status_code=204)


@router.get("/alerts/outbox")
def list_outbox(session: SessionDep, status: str | None = Query(None, description="pending | delivered | failed"),
                webhook_id: int | None = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                offset: Annotated[int, Query(ge=0)] = 0) -> list[dict]:
    """Alert notifications and their delivery state, newest first."""
    q = select(AlertOutbox)
    if status:
        q = q.where(AlertOutbox.status == status)
    if webhook_id is not None:
        q = q.where(AlertOutbox.webhook_id == webhook_id)
    return [_public_row(r) for r in session.scalars(q.order_by(AlertOutbox.id.desc()).offset(offset).limit(limit))]
