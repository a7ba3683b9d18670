"""Load a script of ``bench/`` as a module, for tests of its figures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_bench(script: str, module_name: str) -> ModuleType:
    """``bench/<script>.py`` as module ``module_name``, registered in ``sys.modules``
    (its dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(module_name, BENCH / f"{script}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = mod
    spec.loader.exec_module(mod)
    return mod
