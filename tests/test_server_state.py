"""``app.state`` holds only what :class:`fleetscope.server.state.ServerState` declares."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from fastapi import FastAPI
from fleetscope.server.app import create_app
from fleetscope.server.settings import Settings
from fleetscope.server.state import ServerState, server_state

REPO = Path(__file__).resolve().parents[1]
SERVER_SOURCES = [p for d in ("server", "collector") for p in sorted((REPO / d).rglob("*.py"))]


def _declared() -> set[str]:
    return set(ServerState.__annotations__)


def _state_attributes(path: Path) -> list[tuple[int, str]]:
    """``<x>.app.state.NAME`` / ``app.state.NAME`` attribute uses in one file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            inner = node.value
            if inner.attr == "state" and (
                (isinstance(inner.value, ast.Name) and inner.value.id == "app")
                or (isinstance(inner.value, ast.Attribute) and inner.value.attr == "app")
            ):
                out.append((node.lineno, node.attr))
    return out


def test_every_app_state_attribute_is_declared() -> None:
    declared = _declared()
    found = {(str(p.relative_to(REPO)), line, name) for p in SERVER_SOURCES
             for line, name in _state_attributes(p)}  # fmt: skip
    assert len(found) > 30, "the scan found too few app.state uses: is it still looking at the code?"
    unknown = sorted(f"{p}:{line}: app.state.{name}" for p, line, name in found if name not in declared)
    assert not unknown, "attributes used on app.state but not declared in ServerState:\n" + "\n".join(unknown)


def test_no_getattr_with_a_default_on_app_state() -> None:
    bad = []
    for p in SERVER_SOURCES:
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                    and node.args and isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "state"):
                bad.append(f"{p.relative_to(REPO)}:{node.lineno}")
    # request.state (per request, set by the auth dependency) is not app.state
    bad = [b for b in bad if "routes/ingest.py" not in b]
    assert not bad, "getattr(..., default) on app.state hides missing wiring:\n" + "\n".join(bad)


def test_create_app_fills_every_declared_field(tmp_path) -> None:
    app = create_app(Settings(store_url=f"chdb://{tmp_path}/store", db_url=f"sqlite:///{tmp_path}/c.db", ui=False))
    state = server_state(app)
    missing = [name for name in _declared() if not hasattr(state, name)]
    assert not missing, f"declared but never set: {missing}"
    assert state.ready is False and state.store is None and state.diagnosis is None
    assert state.authority.app is app


def test_server_state_refuses_an_app_not_made_by_create_app() -> None:
    with pytest.raises(TypeError, match="not ServerState: build the app with create_app"):
        server_state(FastAPI())
