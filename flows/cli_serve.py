"""`ragpipe serve`: the search and answer API over the published index."""

from __future__ import annotations

import logging
import signal
from typing import Annotated, Any

import typer

from flows.cli_common import (
    ConfigOption,
    EmbedderOption,
    StorePathOption,
    console,
    fail,
    index_overrides,
    plain_env,
)
from ragpipe.config import load_config
from ragpipe.errors import RagpipeError


def serve(
    host: Annotated[
        str | None,
        typer.Option(help="serve.host: address to bind (default 127.0.0.1, this machine only)."),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="serve.port: TCP port (default 8080; 0 picks a free one).")
    ] = None,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
    embedder: EmbedderOption = None,
) -> None:
    """Serve search and cited answers over HTTP from the published index, read-only.

    POST /search and POST /ask (streamed as server-sent events or NDJSON, or one JSON
    object), GET /healthz, GET /metrics (Prometheus), API docs at /docs. The embedder and
    the index are loaded once; a version published by a later `ragpipe ingest` is picked
    up without a restart (serve.reload_seconds). Answers are cached by question meaning
    (serve.cache_threshold). Set RAGPIPE_SERVE__API_KEY to require a bearer token. Stop
    with Ctrl-C: requests in flight finish first.
    """
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    from ragpipe.serve.app import create_app
    from ragpipe.serve.server import is_loopback, serve_forever

    overrides: dict[str, Any] = {"serve": {}, **index_overrides(store_path, embedder)}
    if host is not None:
        overrides["serve"]["host"] = host
    if port is not None:
        overrides["serve"]["port"] = port
    try:
        cfg = load_config(config, overrides)
        console.print("loading the embedder and opening the published index…", highlight=False)
        app = create_app(cfg)
    except RagpipeError as exc:
        fail(exc, 2)
    if not is_loopback(cfg.serve.host) and cfg.serve.api_key is None:
        console.print(
            f"[yellow]warning:[/yellow] serving on {cfg.serve.host} without a token: anyone "
            "who can reach this port can search the index; set RAGPIPE_SERVE__API_KEY",
            highlight=False,
        )
    # While loading, SIGTERM unwound like Ctrl-C (flows.cli). From here uvicorn handles it:
    # requests in flight finish and the index copy goes, then it ends the process by the
    # signal it caught, which needs the default handler (-15, as systemd expects; ours would
    # make that a KeyboardInterrupt that uvicorn.run swallows: exit 0).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    serve_forever(app, cfg.serve.host, cfg.serve.port)


def mcp(
    config: ConfigOption = None,
    store_path: StorePathOption = None,
    embedder: EmbedderOption = None,
) -> None:
    """Serve the index to an AI agent over MCP (the Model Context Protocol) on stdin/stdout.

    Tools: `search` (query, k, mode, file, heading: ranked chunks with file, heading, page,
    score and text, as `ragpipe search --format json`) and `ask` (question, ...: the cited
    answer and its sources, as `ragpipe ask --json`); resource ragpipe://index (the version
    served). An agent's client starts this command itself, e.g. a client configuration of
    {"command": "ragpipe", "args": ["mcp", "--config", "/path/to/ragpipe.yaml"]}. Logs go
    to stderr. Over HTTP, `ragpipe serve` offers the same at /mcp (streamable HTTP).
    """
    plain_env(verbose=False)  # warnings to stderr; SIGTERM unwinds (the reader copy goes)
    from ragpipe.serve.index import LiveIndex
    from ragpipe.serve.mcp_tools import IndexTools, build_server, serve_stdio

    try:
        cfg = load_config(config, index_overrides(store_path, embedder))
        index = LiveIndex(cfg)
    except RagpipeError as exc:
        fail(exc, 2)
    index.start()
    try:
        server = build_server(IndexTools(index, cfg))
        serve_stdio(server)
    finally:
        index.close()
