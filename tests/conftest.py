"""Suite-wide fixtures and the unit / integration split behind ``make test-fast``.

Every test is either a *unit* test (in one process: no subprocess, no server socket, no
browser) or an *integration* test. The ``integration`` marker is applied here, at
collection, so a new test lands in the right bucket without anyone remembering to mark
it: a test is integration when it lives under ``tests/browser``, or when its body, its
fixtures or the test helpers they call (followed through the names they use, into
``tests.*`` modules) reach a process- or server-starting API (``subprocess``,
``multiprocessing``, ``http.server``, uvicorn, selenium, the trainer's launcher, ...).
An explicit ``@pytest.mark.integration`` or ``@pytest.mark.unit`` wins over the guess.

    make test-fast      # pytest -m "not integration": unit tests, < 60 s
    make test           # everything
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.webhooks import WebhookReceiver

TESTS = Path(__file__).resolve().parent

#: Modules (and their submodules) whose use makes a test an integration test.
SPAWNING_MODULES: tuple[str, ...] = (
    "subprocess", "multiprocessing", "torch.multiprocessing", "concurrent.futures.process",
    "http.server", "socketserver", "uvicorn", "selenium",
    # the product's own process starters (grep: subprocess / multiprocessing / uvicorn)
    "fleetscope.trainer.launcher", "fleetscope.kernels.launch", "fleetscope.server.cli",
    "fleetscope.server.demo",
)  # fmt: skip


def _in(module: str | None, prefixes: tuple[str, ...]) -> bool:
    return bool(module) and any(module == p or module.startswith(p + ".") for p in prefixes)  # type: ignore[union-attr]


def _is_suite_code(module: str | None) -> bool:
    """Whether ``module`` is a file of the test suite (test modules are imported under
    their base name, helpers as ``tests.helpers.*``)."""
    file = getattr(sys.modules.get(module or ""), "__file__", None)
    return bool(file) and TESTS in Path(file).resolve().parents  # type: ignore[arg-type]


def _code_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:  # lambdas, nested functions, comprehensions
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def _reaches_spawn(obj: Any, seen: set[int], depth: int = 0) -> bool:
    """Whether ``obj`` is, or (for test-suite code) uses, a process/server-starting API."""
    if id(obj) in seen or depth > 12:
        return False
    seen.add(id(obj))
    if isinstance(obj, types.ModuleType):
        return _in(obj.__name__, SPAWNING_MODULES)
    module = getattr(obj, "__module__", None)
    if _in(module, SPAWNING_MODULES):
        return True
    if not _is_suite_code(module):
        return False  # library code: judged by its module only
    if isinstance(obj, type):
        if any(_in(base.__module__, SPAWNING_MODULES) for base in obj.__mro__):
            return True  # e.g. a ThreadingHTTPServer subclass defined in a test
        return any(_reaches_spawn(v, seen, depth + 1) for v in vars(obj).values()
                   if isinstance(v, (types.FunctionType, classmethod, staticmethod, property, type)))  # fmt: skip
    if isinstance(obj, (classmethod, staticmethod)):
        return _reaches_spawn(obj.__func__, seen, depth + 1)
    if isinstance(obj, property):
        return any(_reaches_spawn(f, seen, depth + 1) for f in (obj.fget, obj.fset) if f)
    func = inspect.unwrap(obj) if callable(obj) else obj
    code = getattr(func, "__code__", None)
    if code is None:
        return False
    env = getattr(func, "__globals__", {})
    for name in set(_code_names(code)):
        if _in(name, SPAWNING_MODULES):  # an import inside the function (`from m import f`)
            return True
        if name in env and _reaches_spawn(env[name], seen, depth + 1):
            return True
    return False


_SPAWNS: dict[int, tuple[Any, bool]] = {}
"""Whether a test function or fixture function reaches a spawning API, by ``id`` (the
object is kept too, so its id is never reused): the parametrised cases of one test and
the tests sharing a fixture ask about the same function many times."""


def _spawns(func: Any) -> bool:
    hit = _SPAWNS.get(id(func))
    if hit is None or hit[0] is not func:
        hit = _SPAWNS[id(func)] = (func, _reaches_spawn(func, set()))
    return hit[1]


def _is_integration(item: pytest.Item) -> bool:
    path = Path(str(item.fspath)).resolve()
    if TESTS / "browser" in path.parents:
        return True
    func = getattr(item, "function", None)
    if func is not None and _spawns(func):
        return True
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        for fixturedef in (info.name2fixturedefs.get(name, ()) if info else ()):
            if _spawns(fixturedef.func):
                return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "integration: starts processes, servers or a browser (set automatically)"
    )
    config.addinivalue_line("markers", "unit: force a test into the unit bucket (make test-fast)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("unit") or item.get_closest_marker("integration"):
            continue
        if item.get_closest_marker("slow") or item.get_closest_marker("browser") or _is_integration(item):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def webhook_receiver() -> Iterator[WebhookReceiver]:
    """A fresh loopback :class:`WebhookReceiver` answering 200, closed after the test."""
    with WebhookReceiver() as rx:
        yield rx
