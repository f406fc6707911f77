"""The ``ragpipe`` command line.

Commands parse arguments, build the one configuration (options over
``RAGPIPE_*`` over the file), and run the same flows a deployment runs (the
query side, ``search``, ``ask``, ``serve``, ``mcp`` and ``eval retrieval`` without
``--flow``, calls the library directly and never imports Prefect):
``cli_ingest`` (ingest), ``cli_query`` (search, ask), ``cli_serve`` (serve, mcp),
``cli_eval`` (eval ..., report); ``cli_common`` holds what they share.
Exit codes: 0 all good, 1 some
documents failed, 2 bad configuration or a stage that cannot run, 3
deletions held by the mass-deletion guard (additions were applied), 4 an
eval gate failed or the index gate held a new version, 130 interrupted (Ctrl-C,
or SIGTERM, which every command turns into the same). Expected errors print one
line (``cli_common.fail``), and so does an interrupted long command
(``cli_common.interruptible``).
"""

from __future__ import annotations

from typing import Annotated

import typer

from flows.cli_common import sigterm_unwinds
from flows.cli_deploy import deploy
from flows.cli_eval import eval_app, report
from flows.cli_golden import golden_app
from flows.cli_index import index_app
from flows.cli_ingest import ingest
from flows.cli_init import init
from flows.cli_inspect import inspect_app
from flows.cli_query import ask, search
from flows.cli_serve import mcp, serve

app = typer.Typer(
    help="ragpipe: keep a retrieval index fresh and measure RAG quality honestly.",
    no_args_is_help=True,
    rich_markup_mode="markdown",  # docstring paragraphs re-flow to the terminal width
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"ragpipe {version('ragpipe')}")
        except PackageNotFoundError:
            print("ragpipe (not installed as a package)")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """ragpipe: keep a retrieval index fresh and measure RAG quality honestly."""
    # Before any command runs: SIGTERM unwinds like Ctrl-C in every one, so that what it
    # holds (a reader's copy of the index, a lock) is given back, not left behind.
    sigterm_unwinds()


app.command()(init)
app.command()(ingest)
app.command()(search)
app.command()(ask)
app.command()(serve)
app.command()(mcp)
app.add_typer(eval_app, name="eval")
app.add_typer(golden_app, name="golden")
app.add_typer(index_app, name="index")
app.add_typer(inspect_app, name="inspect")
app.command()(report)
app.command()(deploy)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
