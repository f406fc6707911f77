"""`ragpipe golden draft`: draft golden items from the index, for a person to review."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from flows.cli_common import (
    ConfigOption,
    StorePathOption,
    fail,
    index_overrides,
    interruptible,
    plain_env,
)
from ragpipe.errors import RagpipeError

golden_app = typer.Typer(
    help="Golden sets: draft one from the index (then review it, and evaluate).",
    no_args_is_help=True,
)


@golden_app.command("draft")
def draft(
    out: Annotated[
        Path, typer.Option(help="The draft golden set to write (never over a file).")
    ] = Path("eval/golden/draft.yaml"),
    sample: Annotated[
        int,
        typer.Option(
            min=0,
            help="Chunks the LLM writes a question for (a stratified sample over files and "
            "positions); 0: question headings only, no model.",
        ),
    ] = 20,
    seed: Annotated[int, typer.Option(help="The sample's seed.")] = 0,
    model: Annotated[
        str | None,
        typer.Option(help="llm.model for the questions (default: the configured model)."),
    ] = None,
    name: Annotated[str | None, typer.Option(help="The set's name (default: OUT's stem).")] = None,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Draft golden items from the live index, each marked `draft: true` for review.

    Question headings (a section titled "How do I ...?") become items targeting their
    section. Then the configured LLM writes a question for each of SAMPLE chunks; one is kept
    only when the model judges that its chunk answers it, it does not copy 6+ words of the
    chunk, and it is no near-duplicate of a kept one. Every item records how it was made.
    Evaluations refuse draft items (unless --allow-draft): read each, fix or delete it, and
    remove its `draft: true` line; `ragpipe eval check OUT` checks the targets.
    """

    from ragpipe.config import load_config
    from ragpipe.evaluation.draft import HEADING_ITEMS_NOTE, draft_golden, write_draft
    from ragpipe.models.embedders import embedder_name
    from ragpipe.store import require_reader

    plain_env(verbose)
    if os.path.lexists(out):
        fail(RagpipeError(f"{out} exists; give another --out (drafts never overwrite a file)"), 2)

    written: list[Path] = []  # write_draft notes the file with its writing

    def kept() -> str:  # the draft is whole or absent
        if written:
            return f"the draft stopped after writing {written[0]}"
        return f"the draft stopped; {out} was not written"

    with interruptible(kept):
        try:
            overrides = index_overrides(store_path, None)
            if model is not None:
                overrides["llm"] = {"model": model}
            cfg = load_config(config, overrides)
            store = require_reader(cfg.store, embedder_name(cfg.embed))
            llm = None
            if sample > 0:
                from ragpipe.models.llm import make_llm

                llm = make_llm(cfg.llm)

            def progress(done: int, total: int) -> None:
                print(f"  question {done} of {total} ...", file=sys.stderr, flush=True)

            try:
                golden, drafted = draft_golden(store, llm, sample, seed, name or out.stem, progress)
            finally:
                store.close()
        except RagpipeError as exc:
            fail(exc, 2)
        if not golden["items"]:
            fail(RagpipeError("nothing to draft: no question headings, and no question kept"), 2)
        try:
            out = write_draft(golden, out, written)
        except RagpipeError as exc:  # a full disk: nothing was written
            fail(exc, 2)
        except OSError as exc:
            fail(RagpipeError(f"cannot write {out}: {exc}"), 2)
    methods = [str(i["provenance"]["method"]) for i in golden["items"]]
    print(f"wrote {out}: {methods.count('heading')} question headings, "
          f"{methods.count('llm')} of {drafted.asked} model questions kept")  # fmt: skip
    for reason, count in sorted(drafted.dropped.items(), key=lambda kv: -kv[1]):
        print(f"  dropped {count}: {reason}")
    if "heading" in methods:
        print(f"note: the {methods.count('heading')} {HEADING_ITEMS_NOTE}")
    print(f"next: review every item, then `ragpipe eval check {out}`")
