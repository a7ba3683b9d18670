"""Imports point one way: the dependency rules of DESIGN.md, checked on every source file.

The rules table lives in :mod:`tests.helpers.layers` (and, for people, in
docs/architecture.md). ``python -m tests.helpers.layers`` lists what breaks them.
"""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

from tests.helpers.layers import LAYERS, REPO, Violation, check_tree, layer_of, package_dirs

# Deliberate exceptions: (file, imported module prefix, reason). A line that no longer
# matches an import is reported, so delete it once the import is gone.
ALLOWED: tuple[tuple[str, str, str], ...] = ()


def _allowed(v: Violation) -> bool:
    return any(
        v.path == path and (v.imported == prefix or v.imported.startswith(prefix + "."))
        for path, prefix, _ in ALLOWED
    )


def test_package_imports_follow_the_dependency_rules() -> None:
    violations = check_tree()
    bad = [str(v) for v in violations if not _allowed(v)]
    assert not bad, "imports against DESIGN.md's dependency rules:\n" + "\n".join(bad)
    stale = [
        entry for entry in ALLOWED
        if not any(v.path == entry[0] and v.imported.startswith(entry[1]) for v in violations)
    ]  # fmt: skip
    if stale:
        warnings.warn(f"allow-list entries no longer needed, delete them: {stale}", stacklevel=1)


def test_every_package_has_a_layer_rule() -> None:
    """A new top-level package must say what it may import (add it to LAYERS)."""
    missing = [m for m in package_dirs() if m not in LAYERS]
    assert not missing, f"packages without a rule in tests/helpers/layers.py: {missing}"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    dirs = {"fleetscope": "fleetscope", "fleetscope.server": "server",
            "fleetscope.agent": "agent", "fleetscope.dashboard": "dashboard"}  # fmt: skip
    (tmp_path / "pyproject.toml").write_text(
        "[tool.setuptools.package-dir]\n" + "".join(f'"{m}" = "{d}"\n' for m, d in dirs.items())
    )
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_checker_fails_on_a_deliberate_backwards_import(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "fleetscope/__init__.py": "",
        "fleetscope/schema.py": '"""core"""\nimport json\n\nfrom fleetscope.server.app import create_app\n',
        "server/__init__.py": "",
        "server/app.py": "def create_app(): ...\n",
        "server/diagnosis/__init__.py": "",
        "server/diagnosis/loop.py": "from ..alerts import outbox\n",
        "server/diagnosis/findings.py": "",
        "server/alerts/__init__.py": "",
        "server/alerts/outbox.py": "from fleetscope.server.diagnosis import findings\n",
        "server/alerts/rules.py": "from fleetscope.server.diagnosis.loop import run\n",
        "agent/__init__.py": "",
        "agent/nvml.py": "def f():\n    import torch  # lazy, still a dependency\n    return torch\n",
        "dashboard/__init__.py": "",
        "dashboard/app.py": "import fleetscope.topology\nimport fleetscope.server.store\n",
    })  # fmt: skip
    got = sorted(str(v) for v in check_tree(root))
    assert got == sorted([
        "agent/nvml.py:2: fleetscope.agent.nvml imports torch "
        "(fleetscope.agent may not depend on torch)",
        "dashboard/app.py:2: fleetscope.dashboard.app imports fleetscope.server.store "
        "(fleetscope.dashboard may not import fleetscope.server.store)",
        "fleetscope/schema.py:4: fleetscope.schema imports fleetscope.server.app.create_app "
        "(fleetscope may not import fleetscope.server)",
        "server/alerts/rules.py:1: fleetscope.server.alerts.rules imports "
        "fleetscope.server.diagnosis.loop.run "
        "(fleetscope.server.alerts may not import fleetscope.server.diagnosis)",
        "server/diagnosis/loop.py:1: fleetscope.server.diagnosis.loop imports "
        "fleetscope.server.alerts.outbox "
        "(fleetscope.server.diagnosis may not import fleetscope.server.alerts)",
    ])  # fmt: skip
    # alerts -> diagnosis.findings is allowed (DESIGN: "alerts -> diagnosis findings")


def test_clean_tree_has_no_violations(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "fleetscope/__init__.py": "",
        "fleetscope/topology.py": "import numpy\n",
        "server/__init__.py": "",
        "server/app.py": "import fastapi\nfrom fleetscope.server.store import Store\nfrom . import settings\n",
        "server/store/__init__.py": "from fleetscope.topology import Topology\n",
        "server/settings.py": "",
        "agent/__init__.py": "from fleetscope import topology\n",
    })  # fmt: skip
    assert check_tree(root) == []


def test_layer_is_the_longest_matching_prefix() -> None:
    assert layer_of("fleetscope.schema") == "fleetscope"
    assert layer_of("fleetscope.server.app") == "fleetscope.server"
    assert layer_of("fleetscope.server.diagnosis.loop") == "fleetscope.server.diagnosis"
    assert layer_of("fleetscope.server.diagnosis.hangs") == "fleetscope.server.diagnosis.hangs"
    assert layer_of("fleetscope.serverless") == "fleetscope"
    assert layer_of("numpy") is None
    assert REPO.joinpath("pyproject.toml").is_file()
