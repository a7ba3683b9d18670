"""Typed FastAPI dependencies: ``StoreDep``, ``SessionDep``, ``SettingsDep``,
``CollectorDep``, and the optional static-token check."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fleetscope.collector.writer import IngestWriter
from fleetscope.server.settings import Settings
from fleetscope.server.store import Store
from sqlalchemy.orm import Session


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_store(request: Request) -> Store:
    store = getattr(request.app.state, "store", None)
    if store is None:
        raise HTTPException(503, detail="store not open yet")
    return store


def get_collector(request: Request) -> IngestWriter:
    collector = getattr(request.app.state, "collector", None)
    if collector is None:
        raise HTTPException(503, detail="collector not started yet")
    return collector


def get_session(request: Request) -> Iterator[Session]:
    db = getattr(request.app.state, "db", None)
    if db is None:
        raise HTTPException(503, detail="control-plane database not open yet")
    with db() as session:
        yield session


def require_token(request: Request) -> None:
    """401 unless ``Authorization: Bearer <token>`` matches the configured token."""
    token = request.app.state.settings.token
    if token is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(), token.get_secret_value().encode()
    ):
        raise HTTPException(
            401, detail="missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
        )


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
SessionDep = Annotated[Session, Depends(get_session)]
CollectorDep = Annotated[IngestWriter, Depends(get_collector)]
TokenDep = Annotated[Any, Depends(require_token)]
