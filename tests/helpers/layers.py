"""Import-direction checker: the dependency rules of DESIGN.md as data, checked on the AST.

Every ``import`` / ``from ... import`` in the package sources (module level or inside a
function: a lazy import is still a dependency) is resolved to an absolute module name
and classified by the *layer* it belongs to: the longest prefix in :data:`LAYERS`.
An import is legal when the target is in the importer's own layer, or matches one of
the importer's allowed prefixes (``"core"`` means the ``fleetscope`` core itself).
Third-party packages a layer must not pull in are listed in :data:`FORBIDDEN_EXTERNAL`.

Run ``python -m tests.helpers.layers`` to print today's violations (``file:line``).
The rules table is documented for people in ``docs/architecture.md``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]

CORE = "core"
_S = "fleetscope.server"
_D = "fleetscope.server.diagnosis"

#: The pure detectors: data frames / arrays in, typed findings out. They import the
#: core and each other, never the store, the SQL DB or anything doing I/O.
PURE_DETECTORS: tuple[str, ...] = tuple(
    f"{_D}.{m}"
    for m in ("breakdown", "findings", "hangs", "health", "mfu", "progress", "robust",
              "sequential", "story", "stragglers", "whatif")
)  # fmt: skip

#: layer (module prefix) -> prefixes it may import, besides its own layer.
LAYERS: dict[str, tuple[str, ...]] = {
    # the core (schema, topology, codec, spool, config, the CLI dispatcher) imports no component
    "fleetscope": (),
    "fleetscope.trainer_hooks": (CORE,),
    "fleetscope.trainer": (CORE, "fleetscope.trainer_hooks"),
    "fleetscope.kernels": (CORE,),
    "fleetscope.agent": (CORE,),
    "fleetscope.collector": (CORE, f"{_S}.store", f"{_S}.db"),
    # server top level (app factory, settings, services, CLIs, demo, metrics, tokens):
    # the composition root, may use any part of the server and the collector; the demo
    # posts a job the simulator generates (fleetscope.sim.offline)
    _S: (CORE, "fleetscope.collector", _S, "fleetscope.sim"),
    f"{_S}.api": (CORE, "fleetscope.collector", _S),
    f"{_S}.store": (CORE,),
    f"{_S}.db": (CORE,),
    # DESIGN lists core + store; incidents, leases and diagnosis state live in the SQL DB,
    # so the non-pure diagnosis modules (loop, worker, incidents) may use server.db too.
    _D: (CORE, f"{_S}.store", f"{_S}.db", _D),
    **{m: (CORE, *PURE_DETECTORS) for m in PURE_DETECTORS},
    f"{_S}.alerts": (CORE, f"{_S}.db", f"{_D}.findings"),
    f"{_S}.views": (CORE, f"{_S}.store"),
    # trace / Flight Recorder importers write into the store and reuse diagnosis parsers
    f"{_S}.importers": (CORE, f"{_S}.store", f"{_S}.db", _D),
    "fleetscope.dashboard": (CORE,),
    # the simulator drives the real agent protocol and reuses the trainer's fault parser
    # (torch-free at import); it never imports the server: it talks to it over HTTP
    "fleetscope.sim": (CORE, "fleetscope.agent", "fleetscope.trainer.faults"),
    # the RCA command line is a REST client
    "fleetscope.rca": (CORE,),
}

_HEAVY = ("torch", "fastapi", "starlette", "sqlalchemy", "dash", "plotly", "flask", "chdb",
          "clickhouse_connect", "pandas", "uvicorn", "pydantic", "pydantic_settings")  # fmt: skip

#: layer -> third-party top-level packages it must not import (exactly that layer, not
#: the layers below it: ``fleetscope``'s list is the core's own).
FORBIDDEN_EXTERNAL: dict[str, tuple[str, ...]] = {
    # the core installs with pyarrow + numpy only
    "fleetscope": (*_HEAVY, "httpx", "rich"),
    "fleetscope.trainer_hooks": tuple(p for p in _HEAVY if p != "torch") + ("httpx",),
    "fleetscope.agent": _HEAVY,
    "fleetscope.rca": _HEAVY,
    "fleetscope.sim": _HEAVY,
    "fleetscope.dashboard": ("torch", "sqlalchemy", "chdb", "clickhouse_connect"),
    "fleetscope.kernels": ("fastapi", "starlette", "sqlalchemy", "dash", "chdb",
                           "clickhouse_connect"),  # fmt: skip
    # FastAPI response models belong under server/api, not in the diagnosis package
    _D: ("fastapi", "starlette", "dash", "plotly", "torch"),
    # pure detectors may use numpy / pandas, nothing that does I/O or serves HTTP
    **{m: (*(p for p in _HEAVY if p != "pandas"), "httpx") for m in PURE_DETECTORS},
}


@dataclass(frozen=True)
class Violation:
    path: str  # relative to the scanned root
    line: int
    importer: str  # module name of the importing file
    imported: str  # module (or third-party package) it imports
    rule: str  # which rule it breaks, in words

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.imported} ({self.rule})"


def package_dirs(root: Path = REPO) -> dict[str, str]:
    """``[tool.setuptools.package-dir]`` of ``root/pyproject.toml``: module -> folder."""
    data = tomllib.loads((root / "pyproject.toml").read_text())
    return dict(data["tool"]["setuptools"]["package-dir"])


def layer_of(module: str, layers: Iterable[str] = LAYERS) -> str | None:
    """The longest layer prefix of ``module`` (``None`` outside ``fleetscope``)."""
    best = None
    for prefix in layers:
        if (module == prefix or module.startswith(prefix + ".")) and (
            best is None or len(prefix) > len(best)
        ):
            best = prefix
    return best


def _iter_sources(root: Path, dirs: Mapping[str, str]) -> Iterator[tuple[Path, str, bool]]:
    """(file, module name, is-package-init) for every .py under the mapped folders."""
    # a folder mapped to a longer module name (server -> fleetscope.server) is skipped when
    # walking a shorter one, so each file is scanned once under its real name
    folders = {(root / d).resolve(): m for m, d in dirs.items()}
    for module, folder in dirs.items():
        base = (root / folder).resolve()
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            owner = max((f for f in folders if path.is_relative_to(f)), key=lambda f: len(f.parts))
            if folders[owner] != module:
                continue
            rel = path.relative_to(base).with_suffix("").parts
            is_init = rel[-1] == "__init__"
            name = ".".join((module, *(rel[:-1] if is_init else rel)))
            yield path, name, is_init


def _imports(tree: ast.AST, module: str, is_init: bool) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in ``tree``. ``from m import x`` yields
    ``m.x`` (``x`` may be a submodule, so the most specific name is the one judged)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = module.split(".") if is_init else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                yield node.lineno, base if alias.name == "*" else f"{base}.{alias.name}"


def _allowed(importer_layer: str, target: str, target_layer: str) -> bool:
    if target_layer == importer_layer:
        return True
    for prefix in LAYERS[importer_layer]:
        if prefix == CORE:
            if target_layer == "fleetscope":
                return True
        elif target == prefix or target.startswith(prefix + "."):
            return True
    return False


def check_tree(root: Path = REPO, dirs: Mapping[str, str] | None = None) -> list[Violation]:
    """Every import under ``root`` that breaks :data:`LAYERS` / :data:`FORBIDDEN_EXTERNAL`."""
    dirs = package_dirs(root) if dirs is None else dirs
    out: list[Violation] = []
    for path, module, is_init in _iter_sources(root, dirs):
        rel = str(path.relative_to(root.resolve()))
        src_layer = layer_of(module)
        if src_layer is None:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        seen: set[tuple[int, str]] = set()  # one report per line and target layer
        for line, target in _imports(tree, module, is_init):
            top = target.split(".")[0]
            if top == "fleetscope":
                tgt_layer = layer_of(target)
                assert tgt_layer is not None
                if _allowed(src_layer, target, tgt_layer) or (line, tgt_layer) in seen:
                    continue
                seen.add((line, tgt_layer))
                out.append(Violation(rel, line, module, target,
                                     f"{src_layer} may not import {tgt_layer}"))  # fmt: skip
            else:
                forbidden = FORBIDDEN_EXTERNAL.get(src_layer, ())
                if top in forbidden and (line, top) not in seen:
                    seen.add((line, top))
                    out.append(Violation(rel, line, module, top,
                                         f"{src_layer} may not depend on {top}"))  # fmt: skip
    return out


def main() -> int:
    violations = check_tree()
    for v in violations:
        print(v)
    print(f"{len(violations)} import(s) against the dependency rules", file=sys.stderr)
    return 1 if violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
