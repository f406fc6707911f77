"""`ragpipe search` and `ragpipe ask`: read the published index."""

from __future__ import annotations

import json
import logging
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from flows.cli_common import (
    ConfigOption,
    EmbedderOption,
    FilterOption,
    KOption,
    ModeOption,
    RerankOption,
    StorePathOption,
    console,
    fail,
    index_overrides,
)
from ragpipe.config import (
    EmbedProvider,
    LLMProvider,
    RagpipeConfig,
    load_config,
)
from ragpipe.errors import ConfigError, RagpipeError


class OutputFormat(StrEnum):
    TEXT = "text"
    JSON = "json"
    XML = "xml"


def _query_config(
    config: Path | None,
    store_path: Path | None,
    retrieve: dict[str, Any],
    filters: list[str] | None,
    embedder: EmbedProvider | None = None,
    llm: dict[str, Any] | None = None,
) -> RagpipeConfig:
    overrides: dict[str, Any] = {"retrieve": {k: v for k, v in retrieve.items() if v is not None}}
    for item in filters or []:
        key, sep, value = item.partition("=")
        field = {"file": "filter_file", "heading": "filter_heading", "sha": "filter_source_sha"}
        if not sep or key.strip() not in field:
            raise ConfigError(
                f"--filter {item!r}: use file=SUFFIX, heading=TEXT or sha=SOURCE_SHA256 "
                "(repeat --filter to AND different ones)"
            )
        name = field[key.strip()]
        if not value.strip():  # it was ignored: every chunk matched
            raise ConfigError(f"--filter {item!r}: give a value after '='")
        if name in overrides["retrieve"]:  # the last one won, silently
            raise ConfigError(
                f"--filter {key.strip()}= is given twice; each of file, heading and sha "
                "takes one value (repeat --filter to AND different ones)"
            )
        overrides["retrieve"][name] = value.strip()
    overrides.update(index_overrides(store_path, embedder))
    if llm:
        overrides["llm"] = {k: v for k, v in llm.items() if v is not None}
    return load_config(config, overrides)


def search(
    query: Annotated[str, typer.Argument(help="The question or keywords.")],
    mode: ModeOption = None,
    k: KOption = None,
    rerank: RerankOption = None,
    filters: FilterOption = None,
    output: Annotated[
        OutputFormat,
        typer.Option(
            "--format",
            help="text (readable), json (with every stage's scores), xml "
            "(a <retrieved_context> block for prompts).",
        ),
    ] = OutputFormat.TEXT,
    version: Annotated[
        str | None,
        typer.Option(
            "--version",
            help="Read this index version (or a unique prefix; `ragpipe index list`) instead "
            "of the live one: a version the gate held, or an older one (the Edge store, or a "
            "Qdrant server with index.gate).",
        ),
    ] = None,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
    embedder: EmbedderOption = None,
) -> None:
    """Print the chunks the index returns for QUERY, ranked, with file, page, heading, scores."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from ragpipe.query.render import to_json, to_text, to_xml
    from ragpipe.query.retrieve import Retriever

    try:
        cfg = _query_config(
            config, store_path, {"mode": mode, "top_k": k, "rerank": rerank}, filters, embedder
        )
        store = None
        if version is not None:
            from ragpipe.models.embedders import embedder_name
            from ragpipe.store import open_reader

            store = open_reader(cfg.store, embedder_name(cfg.embed), version)
        with Retriever(cfg, store=store) as retriever:
            result = retriever.search(query)
    except RagpipeError as exc:
        fail(exc, 2)
    render = {OutputFormat.TEXT: to_text, OutputFormat.JSON: to_json, OutputFormat.XML: to_xml}
    print(render[output](result))


def ask(
    question: Annotated[str, typer.Argument(help="The question to answer from the index.")],
    mode: ModeOption = None,
    k: KOption = None,
    rerank: RerankOption = None,
    filters: FilterOption = None,
    llm: Annotated[
        LLMProvider | None,
        typer.Option(help="llamacpp (in-process GGUF, default), ollama or openai (llm.base_url)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="llm.model: a packaged model (qwen2.5-coder-1.5b, the default; "
            "qwen2.5-coder-0.5b; smollm2-135m) or a .gguf path; an Ollama model, or an "
            "OpenAI-compatible server's model."
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the answer object as JSON (no streaming).")
    ] = False,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
    embedder: EmbedderOption = None,
) -> None:
    """Answer QUESTION from the index, streaming a cited answer, then list the sources.

    The model is told to cite sources as [1], [2] and to answer exactly "Not found in the
    provided documents." when they do not support an answer. Below generate.min_relevance
    the model is not asked. Citations to sources that were not given are removed, and an
    answer that cites nothing, loops (stopped as it starts) or is cut short is flagged.
    """
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from ragpipe.models.embedders import embedder_name
    from ragpipe.query.generate import BELOW_FLOOR, configured_answer, flag_warnings
    from ragpipe.query.render import one_line, terminal_safe
    from ragpipe.query.retrieve import Retriever

    streamed: list[str] = []
    try:
        cfg = _query_config(
            config,
            store_path,
            {"mode": mode, "top_k": k, "rerank": rerank},
            filters,
            embedder,
            {"provider": llm.value if llm else None, "model": model},
        )
        with Retriever(cfg) as retriever:
            result = retriever.search(question)

            def stream(piece: str) -> None:
                streamed.append(piece)
                print(terminal_safe(piece), end="", flush=True)

            reply = configured_answer(question, result.hits, retriever.llm, cfg.generate,
                                      embedder_name(cfg.embed),
                                      None if as_json else stream)  # fmt: skip
    except RagpipeError as exc:
        if streamed:  # the error ended a line of answer: say that line is none
            print("\n\n(the text above is not an answer: it was cut off)", flush=True)
        fail(exc, 2)
    if as_json:
        print(json.dumps({**reply.as_dict(), "retrieval": result.trace}, indent=2))
        return
    if not result.hits or BELOW_FLOOR in reply.flags:  # nothing was streamed
        print(terminal_safe(reply.text), end="")
    elif "".join(streamed).strip() != reply.text:  # citations taken out, or withdrawn
        print("\n\nthe answer, as checked (it replaces the text above):")
        print(terminal_safe(reply.text), end="")
    print("\n")
    shown = reply.cited or ([] if reply.not_found else reply.sources)
    title = "cited sources" if reply.cited else "sources given to the model (none cited)"
    if shown:
        print(title + ":")
        for s in shown:
            where = s.file_path + (f" p.{s.page}" if s.page is not None else "")
            line = f"  [{s.number}] {where}" + (f" — {s.heading}" if s.heading else "")
            print(one_line(line))
    for warning in flag_warnings(reply):
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
    first = f", first token {reply.first_token_s:.1f}s" if reply.first_token_s is not None else ""
    console.print(
        f"{reply.model}: {reply.tokens_in} tokens in, {reply.tokens_out} out, "
        f"{reply.seconds:.1f}s{first}",
        highlight=False,
    )
