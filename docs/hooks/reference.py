"""mkdocs hook: the reference pages are generated from the code when the site is built.

A page that holds ``<!-- generated: config -->`` gets the configuration reference
(``ragpipe.reference.config_reference``, from the pydantic models); one that holds
``<!-- generated: cli -->`` gets the command-line reference
(``flows.cli_reference.cli_reference``, from the Typer app). Nothing generated is
committed, so the pages cannot drift from the code.
"""

from __future__ import annotations

from typing import Any

MARKERS = {
    "<!-- generated: config -->": ("ragpipe.reference", "config_reference"),
    "<!-- generated: cli -->": ("flows.cli_reference", "cli_reference"),
}


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    import importlib

    for marker, (module, function) in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(
                marker, getattr(importlib.import_module(module), function)()
            )
    return markdown
