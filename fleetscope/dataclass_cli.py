"""Command-line flags generated from a config dataclass, so each setting is defined once.

A field opts in with ``metadata=flag("--name", group=..., ...)``; its help is the field's
docstring (the string literal under it, torchtitan style) and its default is the
dataclass default, shown as ``(default X)``. :func:`add_arguments` adds the flags,
:func:`config_kwargs` turns parsed arguments back into constructor keywords (a flag
left out keeps the dataclass default).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

FLAG = "fleetscope.flag"


def flag(
    name: str,
    *,
    group: str | None = None,
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    default_text: str | None = None,
    choices: tuple[str, ...] | None = None,
    negate: bool = False,
) -> dict[str, Any]:
    """Field metadata declaring the field's command-line flag.

    Args:
        name: the flag, e.g. ``"--batch-delay"``.
        group: argparse argument group title (``None``: the parser itself).
        metavar: placeholder in ``--help``.
        parse: converts the flag's text (e.g. ``"4M"`` -> bytes); default: the field's
            type for int/float/str, else the text itself.
        default_text: how the default is shown (e.g. ``"4M"`` for ``4 << 20``).
        choices: allowed values.
        negate: a boolean field that defaults to true and is switched off by ``name``
            (e.g. ``--no-gpu`` for ``gpu``).
    """
    spec = dict(name=name, group=group, metavar=metavar, parse=parse,
                default_text=default_text, choices=choices, negate=negate)  # fmt: skip
    return {FLAG: spec}


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` (read from its source)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (frozen app): flags still work, help is terse
        return {}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    docs: dict[str, str] = {}
    for node, nxt in zip(body.body, body.body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):  # fmt: skip
            docs[node.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return docs


def _plain(text: str) -> str:
    """Docstring markup -> --help text (argparse %-formats help strings)."""
    return text.replace("``", "'").replace("%", "%%")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return dataclasses.MISSING


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one flag per field of ``cls`` that declares one with :func:`flag`."""
    docs = field_docs(cls)
    groups: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(FLAG)
        if spec is None:
            continue
        target: Any = parser
        if spec["group"]:
            target = groups.get(spec["group"]) or groups.setdefault(
                spec["group"], parser.add_argument_group(spec["group"])
            )
        doc = _plain(docs.get(f.name, ""))
        default = _default(f)
        if spec["negate"]:
            target.add_argument(spec["name"], dest=f.name, action="store_false", default=None,
                                help=doc)  # fmt: skip
            continue
        if default is False:
            target.add_argument(spec["name"], dest=f.name, action="store_true", default=None,
                                help=doc)  # fmt: skip
            continue
        shown = spec["default_text"] or ("none" if default is None else default)
        if default is not dataclasses.MISSING or spec["default_text"]:
            doc = f"{doc} (default {shown})" if doc else f"default {shown}"
        target.add_argument(
            spec["name"], dest=f.name, default=None, metavar=spec["metavar"],
            choices=spec["choices"], help=doc, type=_converter(f, spec),
        )  # fmt: skip


def _converter(f: dataclasses.Field, spec: Mapping[str, Any]) -> Callable[[str], Any] | None:
    if spec["parse"] is not None or spec["choices"]:
        return None  # parsed in config_kwargs (so a parse error can name the flag)
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
    return {"int": int, "float": float}.get(kind.replace(" | None", ""), None)


def config_kwargs(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """Constructor keywords for ``cls`` from the flags that were given."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(FLAG)
        if spec is None:
            continue
        value = getattr(args, f.name, None)
        if value is None:
            continue
        out[f.name] = spec["parse"](value) if spec["parse"] and isinstance(value, str) else value
    return out


def flag_name(cls: type, field_name: str) -> str:
    """The flag of ``field_name`` (for error messages), or the field name itself."""
    for f in dataclasses.fields(cls):
        if f.name == field_name and FLAG in f.metadata:
            return str(f.metadata[FLAG]["name"])
    return field_name
