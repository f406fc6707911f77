"""`ragpipe init`: a project folder for a team's own documents."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from flows.cli_common import fail
from ragpipe.errors import ConfigError
from ragpipe.scaffold import scaffold


def init(
    folder: Annotated[Path, typer.Argument(help="The project folder (created if missing).")] = Path(
        "."
    ),
    roots: Annotated[
        list[str] | None,
        typer.Option(
            "--roots",
            help="A folder (or file) of documents to index, relative to FOLDER or absolute; "
            "repeat for several. Default: docs.",
        ),
    ] = None,
    name: Annotated[
        str, typer.Option(help="The golden set's name: eval/golden/NAME.yaml.")
    ] = "my-docs",
) -> None:
    """Write ragpipe.yaml, eval/golden/NAME.yaml and prefect.yaml into FOLDER.

    ragpipe.yaml names the documents (discover.roots), where the index, checkpoints and
    reports go, and the embedded defaults, each commented. The golden set is a template:
    replace its commented examples with questions your documents answer. prefect.yaml holds
    the nightly re-index and the evaluations as deployments that run in FOLDER on its
    ragpipe.yaml. Nothing is written when any of the three files exists (exit 2).
    """
    try:
        made = scaffold(folder, roots, name)
    except ConfigError as exc:
        fail(exc, 2)
    for path in made.files:
        print(f"wrote {path}")
    here = Path.cwd().resolve()
    cd = [] if made.folder == here else [f"cd {shlex.quote(str(made.folder))}"]
    golden = made.golden.relative_to(made.folder)
    steps = [
        *cd,
        "ragpipe ingest --config ragpipe.yaml          # index discover.roots",
        'ragpipe search "a question your documents answer" --config ragpipe.yaml',
        f"ragpipe eval retrieval --config ragpipe.yaml   # after writing {golden}",
    ]
    print("\nnext:\n" + "\n".join(f"  {s}" for s in steps))
