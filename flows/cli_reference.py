"""The command-line reference, generated from the Typer app itself.

``cli_reference()`` walks every command and group of ``ragpipe`` (as Click sees them, so
what is documented is what parses) and renders its usage, help text, arguments and
options as Markdown. The documentation site builds its CLI page from it
(``docs/hooks/reference.py``); a test holds every command to appearing in it. Typer
carries its own copy of Click, so commands and parameters are read by their attributes.
"""

from __future__ import annotations

from typing import Any

import typer

from flows.cli import app
from ragpipe.reference import markdown_text


def _cell(text: str) -> str:
    return markdown_text(" ".join(text.split())).replace("|", "\\|")


def _help(command: Any) -> str:
    """The command's help, its paragraphs kept (Typer takes it from the docstring)."""
    text = (command.help or command.short_help or "").strip()
    return "\n\n".join(markdown_text(" ".join(p.split())) for p in text.split("\n\n") if p.strip())


def _is_option(param: Any) -> bool:
    return bool(param.param_type_name == "option")


def _subcommands(command: Any) -> dict[str, Any]:
    """A group's visible commands ({} for a command)."""
    return {n: c for n, c in (getattr(command, "commands", None) or {}).items() if not c.hidden}


def _context(command: Any, name: str, parent: Any = None) -> Any:
    return command.context_class(command, info_name=name, parent=parent)


def _param_row(param: Any, ctx: Any) -> str:
    if _is_option(param):
        names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
        help_text = param.help or ""
    else:
        names = f"`{(param.human_readable_name or param.name or '').upper()}`"
        help_text = getattr(param, "help", None) or ""
    kind = "flag" if _is_option(param) and param.is_flag else str(param.type.name)
    choices = getattr(param.type, "choices", None)
    if choices:
        kind = " \\| ".join(f"`{c}`" for c in choices)
    default = param.get_default(ctx, call=True) if not param.required else None
    shown = "required" if param.required else ("" if default in (None, "", ()) else f"`{default}`")
    return f"| {names} | {kind} | {shown} | {_cell(help_text)} |"


def _command(name: str, command: Any, parent: Any, out: list[str]) -> None:
    ctx = _context(command, name, parent)
    params = [p for p in command.get_params(ctx) if p.name != "help"]
    depth = name.count(" ")
    out += [f"{'#' * min(1 + depth, 4)} `{name}`", ""]
    usage = f"Usage: {name} {' '.join(command.collect_usage_pieces(ctx))}".rstrip()
    out += ["```text", usage, "```", ""]
    help_text = _help(command)
    if help_text:
        out += [help_text, ""]
    if params:
        out += ["| argument / option | type | default | description |", "|---|---|---|---|"]
        out += [_param_row(p, ctx) for p in params]
        out.append("")
    for sub_name, sub in _subcommands(command).items():
        _command(f"{name} {sub_name}", sub, ctx, out)


def cli_reference() -> str:
    """Markdown: every command of ``ragpipe`` with its arguments and options."""
    root = typer.main.get_command(app)
    ctx = _context(root, "ragpipe")
    out = [
        "Every command of `ragpipe`, generated from the command line itself (`flows/cli.py`) "
        "when the site is built; `ragpipe COMMAND --help` prints the same. Exit codes: 0 all "
        "good, 1 some documents failed, 2 bad configuration or a stage that cannot run, 3 "
        "deletions held by the mass-deletion guard, 4 an eval gate failed or the index gate "
        "held a new version.",
        "",
    ]
    for name, command in _subcommands(root).items():
        _command(f"ragpipe {name}", command, ctx, out)
    return "\n".join(out)


def all_commands() -> list[str]:
    """Every command's full name (``ragpipe eval retrieval``, ...)."""
    names: list[str] = []

    def walk(prefix: str, command: Any) -> None:
        for sub_name, sub in _subcommands(command).items():
            names.append(f"{prefix} {sub_name}")
            walk(f"{prefix} {sub_name}", sub)

    walk("ragpipe", typer.main.get_command(app))
    return names
