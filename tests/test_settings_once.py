"""Each environment variable is declared once: a server Settings field or fleetscope.env."""

from __future__ import annotations

import re

import pytest
from fleetscope.server.settings import Settings

from fleetscope import env
from tests.helpers.layers import REPO, package_dirs

NAME = re.compile(r"FLEETSCOPE_[A-Z0-9_]*[A-Z0-9]")


def test_every_fleetscope_variable_in_the_sources_is_declared_once():
    settings = {f"FLEETSCOPE_{name.upper()}" for name in Settings.model_fields}
    declared = {v.name for v in env.ALL}
    assert len(declared) == len(env.ALL)
    only_env = declared - settings
    seen: dict[str, str] = {}
    for folder in set(package_dirs().values()):
        for path in sorted((REPO / folder).rglob("*.py")):
            for m in NAME.finditer(path.read_text(encoding="utf-8")):
                seen.setdefault(m.group(0), str(path.relative_to(REPO)))
    undeclared = {n: where for n, where in seen.items() if n not in settings and n not in only_env}
    assert not undeclared, f"declare these in fleetscope/env.py or server Settings: {undeclared}"


def test_env_vars_parse_and_name_themselves_when_bad():
    assert env.UI_REFRESH_S.get({}) == 5.0
    assert env.UI_REFRESH_S.get({"FLEETSCOPE_UI_REFRESH_S": " 2.5 "}) == 2.5
    assert env.PEAK_TFLOPS.get({}) is None
    with pytest.raises(ValueError, match="FLEETSCOPE_UI_REFRESH_S='soon' is not a number"):
        env.UI_REFRESH_S.get({"FLEETSCOPE_UI_REFRESH_S": "soon"})
    with pytest.raises(ValueError, match="FLEETSCOPE_PEAK_TFLOPS='-1' must be a positive number"):
        env.PEAK_TFLOPS.get({"FLEETSCOPE_PEAK_TFLOPS": "-1"})


def test_dashboard_and_kernels_read_through_the_declarations(monkeypatch):
    from fleetscope.dashboard import mount
    from fleetscope.kernels import devices

    assert mount.REFRESH_ENV == env.UI_REFRESH_S.name
    monkeypatch.setenv(env.PEAK_MEM_GBPS.name, "123")
    assert devices._env_float(devices.ENV_PEAK_MEM_GBPS) == 123.0


def test_declared_variables_are_read_through_their_declaration():
    """A variable declared in fleetscope/env.py is read with ``env.X.get()``, not by its
    name through ``os.environ`` / ``os.getenv`` (which would skip its parser and blank
    handling). The agent's token look-up keeps its own order (file, then variable)."""
    declared = {v.name for v in env.ALL}
    raw = re.compile(r"(?:os\.environ\.get|os\.getenv)\(\s*[\"'](FLEETSCOPE_[A-Z0-9_]+)[\"']")
    bad = []
    for folder in set(package_dirs().values()):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.name == "env.py" and path.parent.name == "fleetscope":
                continue
            for m in raw.finditer(path.read_text(encoding="utf-8")):
                if m.group(1) in declared:
                    bad.append(f"{path.relative_to(REPO)}: {m.group(1)}")
    assert not bad, "read these through fleetscope.env: " + ", ".join(bad)
