"""The configuration reference, generated from the pydantic models themselves.

``config_reference()`` renders every field of ``RagpipeConfig`` (section by section,
nested models as their own tables) with its type, default, environment variable and
description, as Markdown. The documentation site builds its reference page from it
(``docs/hooks/reference.py``), so the page cannot drift from the code; a test holds every
field to appearing in it.
"""

from __future__ import annotations

import enum
import html
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from ragpipe.config import RagpipeConfig

ENV_PREFIX = "RAGPIPE_"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (``X``, ``X | None``, ``list[X]``...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def type_name(annotation: Any) -> str:
    """A reader's name for a field's type: ``int``, ``list[str]``, ``"rrf" | "dbsf"``."""
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(f'"{m.value}"' for m in annotation)
    if isinstance(annotation, type) and issubclass(annotation, SecretStr):
        return "secret string"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping (below)"
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return " | ".join(repr(a).replace("'", '"') for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]" if args else name
    return getattr(annotation, "__name__", str(annotation))


def default_text(field: FieldInfo) -> str:
    """The default as YAML would spell it, or ``required``."""
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    return _yaml(value)


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, BaseModel):
        return "(below)"
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return str(value)


def markdown_text(text: str) -> str:
    """Help text as literal Markdown: outside `code spans`, '<' and '&' are not HTML and
    '_' and '*' not emphasis (``qrels/<split>.tsv`` and ``__init__.py`` stay as written);
    code spans are kept (Markdown shows their content as is)."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: no code spans at all
        parts = [text.replace("`", "\\`")]
    for i in range(0, len(parts), 2):
        plain = html.escape(parts[i], quote=False)
        parts[i] = re.sub(r"([_*\[\]])", r"\\\1", plain)
    return "`".join(parts)


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return markdown_text(" ".join(text.split())).replace("|", "\\|")


def fields(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, FieldInfo]]:
    """Every field of ``model`` under ``prefix`` (dotted), nested models' fields included."""
    for name, field in model.model_fields.items():
        dotted = f"{prefix}.{name}"
        yield dotted, field
        for nested in _models_in(field.annotation):
            yield from fields(nested, dotted)


def _table(model: type[BaseModel], prefix: str, out: list[str], heading: bool = True) -> None:
    doc = " ".join((model.__doc__ or "").split())
    if heading:
        out += [f"### `{prefix}`", ""]
    if doc:
        out += [doc, ""]
    out += ["| field | type | default | description |", "|---|---|---|---|"]
    nested: list[tuple[type[BaseModel], str]] = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}.{name}"
        description = field.description or ""
        out.append(
            f"| `{name}` | {_cell(type_name(field.annotation))} | "
            f"`{_cell(default_text(field))}` | {_cell(description)} |"
        )
        nested += [(m, dotted) for m in _models_in(field.annotation)]
    out.append("")
    for sub, dotted in nested:
        _table(sub, dotted, out)


def config_reference() -> str:
    """Markdown: every section and field of the configuration."""
    out = [
        "Every setting of `ragpipe.yaml`, generated from the code (`ragpipe.config`) when the "
        "site is built. A field `section.name` is set in the file as",
        "",
        "```yaml",
        "section:",
        "  name: value",
        "```",
        "",
        f"or in the environment as `{ENV_PREFIX}SECTION__NAME` (the environment wins over the "
        "file, command-line options win over both; a list is set whole, as JSON: "
        f"`{ENV_PREFIX}DISCOVER__ROOTS='[\"docs\"]'`). Unknown fields are refused at load, "
        "with the field named, and so is `true` or `false` where a number goes.",
        "",
    ]
    for name, field in RagpipeConfig.model_fields.items():
        for model in _models_in(field.annotation):
            out += [f"## `{name}`", ""]
            _table(model, name, out, heading=False)
            out += [f"Environment: `{ENV_PREFIX}{name.upper()}__<FIELD>`.", ""]
    return "\n".join(out)


def all_fields() -> list[str]:
    """Every dotted field name of the configuration."""
    return [
        dotted
        for name, field in RagpipeConfig.model_fields.items()
        for model in _models_in(field.annotation)
        for dotted, _ in fields(model, name)
    ]
