"""OpenAI-compatible providers against a real OpenAI-compatible server on loopback.

The server is llama.cpp's own (xllamacpp's ``Server`` with a port: the HTTP API
vLLM, LM Studio and llama.cpp's server speak) running the packaged SmolLM2:
one for chat completions with an API key, one in embedding mode. Asserted:
answers (whole and streamed), a reader that leaves stops the stream, JSON
schema replies, HyDE, a wrong key, retries on 429/503 through a loopback
proxy, and an index embedded through ``/v1/embeddings`` (ingest, search, a
dimension change refused).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from flows.cli import app as cli
from ragpipe.config import RagpipeConfig
from ragpipe.errors import StageError
from ragpipe.ingest.pipeline import run_ingest
from ragpipe.models.embedders import OpenAIEmbedder, make_embedder
from ragpipe.models.llm import GenerationCancelled, OpenAILLM, make_llm, resolve_gguf
from ragpipe.query.generate import answer
from ragpipe.query.results import Retrieved
from ragpipe.query.retrieve import Retriever
from tests.support.loopback import free_port
from tests.support.paths import QUERY_CORPUS

KEY = "sk-loopback-4711"


def _llama_server(**settings: Any) -> Any:
    import xllamacpp as xlc

    params = xlc.CommonParams()
    params.model.path = str(resolve_gguf("smollm2-135m"))  # module fixtures: no autouse pin
    params.n_ctx = 4096
    params.n_parallel = 1
    params.warmup = False
    params.verbosity = -1
    params.port = free_port()
    for name, value in settings.items():
        setattr(params, name, value)
    return xlc.Server(params)


@pytest.fixture(scope="module")
def chat_server() -> Iterator[str]:
    """llama.cpp's OpenAI-compatible server with an API key; yields its /v1 URL."""
    server = _llama_server(api_keys=[KEY])
    yield f"{server.listening_address}/v1"


@pytest.fixture(scope="module")
def embed_server() -> Iterator[str]:
    """The same server in embedding mode (mean pooling), no key; yields its /v1 URL."""
    import xllamacpp as xlc

    server = _llama_server(
        embedding=True,
        pooling_type=xlc.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN,
        n_batch=2048,
        n_ubatch=2048,
    )
    yield f"{server.listening_address}/v1"


def _llm(url: str, **options: Any) -> OpenAILLM:
    section = {"provider": "openai", "base_url": url, "model": "smollm2", "max_tokens": 24}
    config = RagpipeConfig.model_validate({"llm": {**section, "api_key": KEY, **options}})
    llm = make_llm(config.llm)
    assert isinstance(llm, OpenAILLM)
    return llm


HELLO = [{"role": "user", "content": "Say hello to the bakery."}]


def test_answers_whole_and_streamed_are_the_same_text(chat_server: str) -> None:
    llm = _llm(chat_server)
    whole = llm.chat(HELLO)
    assert whole.text.strip() and whole.tokens_in > 0 and 0 < whole.tokens_out <= 24
    pieces: list[str] = []
    streamed = llm.chat(HELLO, on_token=pieces.append)
    assert len(pieces) > 1 and "".join(pieces) == streamed.text == whole.text  # temperature 0
    assert streamed.finish_reason in ("length", "stop") and streamed.model == "smollm2"


def test_a_reader_that_leaves_stops_the_stream(chat_server: str) -> None:
    llm = _llm(chat_server, max_tokens=400)
    seen: list[str] = []

    def leave(piece: str) -> None:
        seen.append(piece)
        if len(seen) == 3:
            raise GenerationCancelled("the client went away")

    with pytest.raises(GenerationCancelled):
        llm.chat(HELLO, on_token=leave)
    assert len(seen) == 3
    assert llm.chat(HELLO, max_tokens=4).tokens_out <= 4  # the server took the next request


def test_a_json_schema_constrains_the_reply(chat_server: str) -> None:
    schema = {
        "type": "object",
        "properties": {"verdict": {"enum": ["yes", "no"]}},
        "required": ["verdict"],
    }
    reply = _llm(chat_server, max_tokens=32).chat(
        [{"role": "user", "content": "Is bread baked in an oven? Answer as JSON."}], schema=schema
    )
    assert json.loads(reply.text)["verdict"] in ("yes", "no")


def test_a_grammar_reaches_llama_cpps_server_only_when_it_is_said_to_take_one(
    chat_server: str,
) -> None:
    """llm.grammar: true sends llama.cpp's GBNF field (its server enforces it: the reply is
    exactly what the grammar allows); without it the provider refuses a grammar, and the
    answer path (generate.cite_grammar) does not ask for one."""
    told = _llm(chat_server, grammar=True, max_tokens=8)
    assert told.takes_grammar
    assert told.chat(HELLO, grammar='root ::= "[2]"').text == "[2]"
    plain = _llm(chat_server)
    assert not plain.takes_grammar
    with pytest.raises(ValueError, match=r"llm\.grammar"):
        plain.chat(HELLO, grammar='root ::= "[2]"')
    hits = [Retrieved("p1", 1.0, {"text": "Bread bakes 35 minutes.", "file_path": "bread.md"})]
    assert answer("How long does bread bake?", hits, plain).model == "smollm2"  # no grammar sent


def test_a_wrong_key_is_a_clear_error_that_never_shows_the_key(chat_server: str) -> None:
    with pytest.raises(StageError, match=r"refused the API key \(HTTP 401") as refused:
        _llm(chat_server, api_key="sk-wrong-key-0000").chat(HELLO)
    assert "sk-wrong-key-0000" not in str(refused.value) and "RAGPIPE_LLM__API_KEY" in str(
        refused.value
    )


def test_openai_needs_a_model_name() -> None:
    with pytest.raises(ValueError, match="provider openai needs the served model's name"):
        RagpipeConfig.model_validate({"llm": {"provider": "openai"}})
    with pytest.raises(ValueError, match="served embedding model's name"):
        RagpipeConfig.model_validate({"embed": {"provider": "openai"}})


class _Flaky:
    """A loopback proxy that answers the first ``failures`` requests with ``status`` (and
    Retry-After: 0), then forwards to ``upstream``; counts what it saw. ``refuses``: a
    request with that field gets a 400 naming it (as vLLM answers ``logprobs`` when its
    ``max_logprobs`` is 0). ``rewrite``: what a successful JSON reply becomes."""

    def __init__(
        self,
        upstream: str,
        failures: int,
        status: int = 503,
        refuses: str | None = None,
        rewrite: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.upstream, self.failures, self.status, self.seen = upstream, failures, status, 0
        self.refuses, self.rewrite = refuses, rewrite
        self.bodies: list[dict[str, Any]] = []
        flaky = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                flaky.seen += 1
                flaky.bodies.append(json.loads(body))
                if flaky.refuses is not None and flaky.refuses in flaky.bodies[-1]:
                    self.send_response(400)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    message = f"{flaky.refuses} is not supported by this server"
                    self.wfile.write(json.dumps({"error": {"message": message}}).encode())
                    return
                if flaky.seen <= flaky.failures:
                    self.send_response(flaky.status)
                    self.send_header("Retry-After", "0")
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "busy"}}')
                    return
                reply = httpx.post(
                    flaky.upstream + self.path.removeprefix("/v1"), content=body, timeout=60,
                    headers={"Authorization": self.headers["Authorization"],
                             "Content-Type": "application/json"},
                )  # fmt: skip
                content = reply.content
                if flaky.rewrite is not None and reply.status_code == 200:
                    content = json.dumps(flaky.rewrite(reply.json())).encode()
                self.send_response(reply.status_code)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(content)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_429_and_5xx_are_retried_then_a_clear_error(chat_server: str) -> None:
    flaky = _Flaky(chat_server, failures=2, status=429)
    try:
        assert _llm(flaky.url, retries=2).chat(HELLO).text.strip()
        assert flaky.seen == 3  # two 429s, then the answer
    finally:
        flaky.close()
    down = _Flaky(chat_server, failures=100)
    try:
        with pytest.raises(StageError, match=r"failed after 3 attempt\(s\).*HTTP 503: busy"):
            _llm(down.url, retries=2).chat(HELLO)
        assert down.seen == 3
    finally:
        down.close()


def _corpus(base: Path) -> Path:
    for name, text in QUERY_CORPUS.items():
        (base / "corpus" / name).parent.mkdir(parents=True, exist_ok=True)
        (base / "corpus" / name).write_text(text, encoding="utf-8")
    return base / "corpus"


def _embed_config(base: Path, url: str, **sections: Any) -> RagpipeConfig:
    return RagpipeConfig.model_validate(
        {
            "discover": {"roots": [str(_corpus(base))]},
            "chunk": {"size": 200, "overlap": 20},
            "embed": {"provider": "openai", "base_url": url, "model": "smollm2-embed",
                      "batch_size": 4, "max_concurrency": 2},
            "store": {"path": str(base / "store")},
            "paths": {"work_dir": str(base / "work")},
            **sections,
        }
    )  # fmt: skip


def test_an_index_embedded_through_v1_embeddings(tmp_path: Path, embed_server: str) -> None:
    cfg = _embed_config(tmp_path, embed_server)
    embedder = make_embedder(cfg.embed)
    assert isinstance(embedder, OpenAIEmbedder) and embedder.name == "openai:smollm2-embed"
    texts = ["Bake bread for 35 minutes.", "Ada Lovelace wrote the first program.", "x", "y", "z"]
    batched = embedder.embed_documents(texts)  # two batches of up to 4, two in flight
    one_by_one = np.vstack([embedder.embed_query(t) for t in texts])
    assert batched.shape == (5, 576) and np.allclose(batched, one_by_one, atol=1e-4)
    assert np.allclose(np.linalg.norm(batched, axis=1), 1, atol=1e-5)

    summary = run_ingest(cfg)
    assert summary.failed == 0 and summary.added == len(QUERY_CORPUS)
    with Retriever(cfg) as retriever:
        hits = retriever.search("How long should bread bake?", mode="dense").hits
    assert hits and all(h.score <= 1.0001 for h in hits)
    other = CliRunner().invoke(
        cli, ["search", "bread", "--store-path", str(cfg.store.path), "--embedder", "onnx"]
    )
    assert other.exit_code == 2 and "openai:smollm2-embed" in other.output  # not its embedder


def test_hyde_through_the_openai_llm(tmp_path: Path, embed_server: str, chat_server: str) -> None:
    cfg = _embed_config(
        tmp_path,
        embed_server,
        llm={"provider": "openai", "base_url": chat_server, "model": "smollm2",
             "api_key": KEY, "max_tokens": 24},
        retrieve={"hyde": "standard", "hyde_n": 1},
    )  # fmt: skip
    assert run_ingest(cfg).failed == 0
    with Retriever(cfg) as retriever:
        result = retriever.search("How long should bread bake?")
    assert result.hits and len(result.trace["hyde_documents"]) == 1


def test_a_server_that_changes_its_vectors_size_is_refused(embed_server: str) -> None:
    embedder = OpenAIEmbedder("smollm2-embed", embed_server)
    assert embedder.dim == 576
    embedder._dim = 384  # as if the first replies had been 384-d: another model now
    with pytest.raises(StageError, match="576-d vectors from smollm2-embed, 384-d before"):
        embedder.embed_query("bread")


def test_ask_from_the_cli_through_an_openai_server(indexed_edge: RagpipeConfig, chat_server: str):
    env = {"RAGPIPE_LLM__PROVIDER": "openai", "RAGPIPE_LLM__BASE_URL": chat_server,
           "RAGPIPE_LLM__MODEL": "smollm2", "RAGPIPE_LLM__API_KEY": KEY,
           "RAGPIPE_LLM__MAX_TOKENS": "32"}  # fmt: skip
    args = ["ask", "How long should bread bake?", "--store-path", str(indexed_edge.store.path),
            "--embedder", "onnx", "--json"]  # fmt: skip
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    reply = json.loads(result.output[result.output.index("{") :])
    assert reply["model"] == "smollm2" and reply["answer"].strip() and reply["sources"]
    assert KEY not in result.output


def test_eval_rag_with_an_openai_generator_and_judge(
    indexed_edge: RagpipeConfig, chat_server: str, tmp_path: Path
) -> None:
    from ragpipe.evaluation.golden import load_golden
    from ragpipe.evaluation.rag import run_rag_eval

    recorder = _Flaky(chat_server, failures=0)
    golden = tmp_path / "golden.yaml"
    golden.write_text(
        "name: mini\nitems:\n  - id: oven\n    query: How long should bread bake?\n"
        "    expected_files: [bread.md]\n    expected_answer: 35 minutes at 230 degrees.\n",
        encoding="utf-8",
    )
    model = {"provider": "openai", "base_url": recorder.url, "api_key": KEY, "max_tokens": 64}
    cfg = RagpipeConfig.model_validate(
        {**indexed_edge.model_dump(mode="python"),
         "llm": {**model, "model": "smollm2"},
         "eval": {**indexed_edge.eval.model_dump(mode="python"), "golden": golden,
                  "reports_dir": tmp_path / "reports", "judge": {**model, "model": "judge"},
                  "judge_max_tokens": 160}}
    )  # fmt: skip
    try:
        result = run_rag_eval(cfg, load_golden(golden), limit=1)
    finally:
        recorder.close()
    (row,) = result.rows
    assert row.answer and row.tokens_out > 0 and result.judge["model"] == "judge"
    models = [body["model"] for body in recorder.bodies]
    # The judge's calibration probe (its context and statement pairs), the answer, then the
    # judge's metrics.
    answered = models.index("smollm2")
    assert models.count("smollm2") == 1 and set(models[:answered]) <= {"judge"}
    assert models[answered + 1 :].count("judge") >= 4
    structured = [b for b in recorder.bodies if b["model"] == "judge" and "response_format" in b]
    assert structured and all(b["response_format"]["type"] == "json_schema" for b in structured)


def test_the_key_from_a_prefect_secret_block(
    chat_server: str, prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llm.api_key_block names a Prefect Secret block: the key is read from the Prefect API
    when the configuration loads, and the keyed server takes it. A block that does not exist
    is a clear error naming the field; outside ragpipe's flows and CLI there is no reader."""
    from prefect.blocks.system import Secret

    import flows  # installs the Prefect Secret reader
    from ragpipe.config import load_config, set_secret_reader
    from ragpipe.errors import ConfigError

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    Secret(value=KEY).save("loopback-llm-key", overwrite=True)
    config = tmp_path / "ragpipe.yaml"

    def write(block: str) -> Path:
        config.write_text(
            f"llm:\n  provider: openai\n  base_url: {chat_server}\n  model: smollm2\n"
            f"  max_tokens: 8\n  api_key_block: {block}\n",
            encoding="utf-8",
        )
        return config

    cfg = load_config(write("loopback-llm-key"))
    assert cfg.llm.api_key is not None and cfg.llm.api_key.get_secret_value() == KEY
    assert KEY not in repr(cfg.llm)
    assert make_llm(cfg.llm).chat(HELLO).tokens_out > 0  # a wrong key would be a 401
    with pytest.raises(ConfigError, match=r"llm\.api_key_block: cannot read the Prefect "
                       r"Secret block 'no-such-key'"):  # fmt: skip
        load_config(write("no-such-key"))
    set_secret_reader(None)
    try:
        with pytest.raises(ConfigError, match="RAGPIPE_LLM__API_KEY"):
            load_config(write("loopback-llm-key"))
    finally:
        set_secret_reader(flows._prefect_secret)


def test_the_first_tokens_log_probabilities_come_back_as_in_process(chat_server: str) -> None:
    from ragpipe.models.llm import LlamaCppLLM
    from ragpipe.query.llm_rerank import yes_probability

    question = [{"role": "user", "content": "Is Paris the capital of France? Answer yes or no."}]
    served = _llm(chat_server).chat(question, max_tokens=1, top_logprobs=10)
    local = LlamaCppLLM("smollm2-135m").chat(question, max_tokens=1, top_logprobs=10)
    assert served.top_logprobs is not None and local.top_logprobs is not None
    assert len(served.top_logprobs) == len(local.top_logprobs) == 10
    # The same model: the same likeliest token, the next two among the served ten, and the
    # same P(yes) within llama.cpp's numeric drift (near-equal tokens can swap places: the
    # second and third did once in a loaded full run).
    top = sorted(local.top_logprobs, key=lambda t: -local.top_logprobs[t])[:3]
    assert max(served.top_logprobs, key=lambda t: served.top_logprobs[t]) == top[0]
    assert set(top) <= set(served.top_logprobs)
    assert yes_probability(served.top_logprobs, served.text) == pytest.approx(
        yes_probability(local.top_logprobs, local.text), abs=0.02
    )
    assert _llm(chat_server).chat(question, max_tokens=1).top_logprobs is None  # not asked


def test_a_server_that_refuses_log_probabilities_gets_verdicts(
    chat_server: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 400 for ``logprobs`` does not fail the search: the request goes again without
    them, later ones do not ask, and the LLM rerank scores by the replies' verdicts."""
    from ragpipe.query.llm_rerank import LLMReranker

    proxy = _Flaky(chat_server, failures=0, refuses="logprobs")
    try:
        llm = _llm(proxy.url)
        reranker = LLMReranker(llm, tmp_path / "scores.sqlite")
        passages = ["Paris is the capital of France.", "Bread bakes 35 minutes."]
        scores, cost = reranker.score_with_cost("What is the capital of France?", passages)
        assert cost.kinds == {"verdict": 2} and cost.model_calls == 2
        assert all(s in (0.0, 0.5, 1.0) for s in scores)
        asked = ["logprobs" in body for body in proxy.bodies]
        assert asked == [True, False, False]  # refused once, then never asked again
        assert not llm.sends_logprobs
        assert "refused log-probabilities" in caplog.text
        # Verdicts are not cached: the same pair asks the model again.
        again = reranker.score_with_cost("What is the capital of France?", passages[:1])[1]
        assert again.model_calls == 1
        reranker.close()
    finally:
        proxy.close()
    other = _Flaky(chat_server, failures=0, refuses="messages")  # another 400 still fails
    try:
        with pytest.raises(StageError, match=r"HTTP 400: messages is not supported"):
            _llm(other.url).chat(HELLO, max_tokens=1, top_logprobs=5)
        # Asked once more without logprobs, which the server refused as well.
        assert ["logprobs" in body for body in other.bodies] == [True, False]
    finally:
        other.close()


@pytest.mark.parametrize(
    "mangled",
    [
        "yes",  # a string where the object goes
        {"content": "yes"},
        {"content": [{"top_logprobs": ["yes", "no"]}]},  # tokens without log-probabilities
        {"content": [{"top_logprobs": [{"token": "yes", "logprob": 2.5}]}]},  # P above 1
        {"content": [{"top_logprobs": [{"token": None, "logprob": "high"}]}]},
    ],
)
def test_log_probabilities_in_another_shape_give_the_verdict(
    chat_server: str, tmp_path: Path, mangled: Any
) -> None:
    """A server whose log-probabilities are malformed: the rerank scores by the reply's
    verdict (and caches nothing), instead of failing the search."""
    from ragpipe.query.llm_rerank import LLMReranker

    def rewrite(reply: dict[str, Any]) -> dict[str, Any]:
        for choice in reply.get("choices") or []:
            choice["logprobs"] = mangled
        return reply

    proxy = _Flaky(chat_server, failures=0, rewrite=rewrite)
    try:
        reranker = LLMReranker(_llm(proxy.url), tmp_path / "scores.sqlite")
        scores, cost = reranker.score_with_cost("Capital of France?", ["Paris is the capital."])
        assert cost.kinds == {"verdict": 1} and scores[0] in (0.0, 0.5, 1.0)
        again = reranker.score_with_cost("Capital of France?", ["Paris is the capital."])[1]
        assert again.model_calls == 1  # a verdict is not cached
        reranker.close()
    finally:
        proxy.close()


def _misbehaving(reply: bytes, content_type: str = "application/json") -> Any:
    """A loopback server answering every POST with ``reply`` as it stands (status 200): a
    stream cut short, a proxy's page, an error sent with 200."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.end_headers()
            self.wfile.write(reply)
            self.close_connection = True

        def log_message(self, *args: Any) -> None:
            pass

    from tests.support.loopback import serve

    return serve(Handler)


def _sse(*pieces: str) -> bytes:
    events = [{"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
              for p in pieces]  # fmt: skip
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


BREAD = [Retrieved("p1", 1.0, {"text": "Bread bakes 35 minutes at 230 degrees.",
                               "file_path": "bread.md"})]  # fmt: skip


def test_a_stream_cut_short_is_an_error_never_a_trusted_answer() -> None:
    """A stream that ended before [DONE] (a proxy's timeout, a server restarted mid-answer)
    was shown as the answer, with no flag: serve cached it for everyone who asked again."""
    cut = _sse("Bread bakes 35 minutes [1]. ", "Then bake it at 230 degrees for only")
    with _misbehaving(cut, "text/event-stream") as url:
        shown: list[str] = []
        with pytest.raises(StageError, match=r"no finish_reason, no \[DONE\]"):
            answer("How long does bread bake?", BREAD, _llm(f"{url}/v1"), on_token=shown.append)
    assert shown  # what went out before the stream ended is not an answer
    whole = _sse("Bread bakes 35 minutes [1].") + b"data: [DONE]\n\n"
    with _misbehaving(whole, "text/event-stream") as url:
        reply = answer("How long does bread bake?", BREAD, _llm(f"{url}/v1"))
    assert reply.text == "Bread bakes 35 minutes [1]." and reply.trusted
    # A stream that says why it finished, then closes with no [DONE] (llama.cpp's server
    # before 2024-09, TGI before 2024-07, ik_llama.cpp) is whole.
    stop = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "error": None}
    said = _sse("Bread bakes 35 minutes [1].") + b"data: " + json.dumps(stop).encode() + b"\n\n"
    with _misbehaving(said, "text/event-stream") as url:
        reply = answer("How long does bread bake?", BREAD, _llm(f"{url}/v1"))
    assert reply.text == "Bread bakes 35 minutes [1]." and reply.trusted


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"<html>502 Bad Gateway</html>", "not a JSON object"),
        (b'["a list"]', "not a JSON object"),
        (b'{"error": {"message": "model overloaded"}}', "model overloaded"),
        (b'{"choices": []}', "sent no choices"),
        (b'{"object": "chat.completion"}', "sent no choices"),
    ],
)
def test_a_reply_that_is_no_completion_is_an_error_not_an_empty_text(
    tmp_path: Path, body: bytes, said: str
) -> None:
    """Read as an empty completion, a failing server gave every passage of an LLM rerank
    the score 0.5 (exit 0, a ranking made of nothing); a proxy's HTML page was a raw
    JSONDecodeError traceback."""
    from ragpipe.query.llm_rerank import LLMReranker

    with _misbehaving(body) as url:
        reranker = LLMReranker(_llm(f"{url}/v1"), tmp_path / "scores.sqlite")
        with pytest.raises(StageError, match=said):
            reranker.score_with_cost("Capital of France?", ["Paris is the capital."])
        reranker.close()


def test_a_connection_broken_mid_stream_is_a_clear_error() -> None:
    """A server that closed the connection mid-chunk escaped as httpx's
    RemoteProtocolError: a traceback after the partial text."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", "100000")  # promised, never sent
            self.end_headers()
            self.wfile.write(_sse("Paris is the "))
            self.close_connection = True

        def log_message(self, *args: Any) -> None:
            pass

    from tests.support.loopback import serve

    with serve(Handler) as url, pytest.raises(StageError, match="broke off its stream"):
        _llm(f"{url}/v1").chat(HELLO, on_token=lambda piece: None)


def test_ask_says_a_stream_cut_short_was_no_answer(indexed_edge: RagpipeConfig) -> None:
    """The cut text stayed on the terminal with the error appended to its line; nothing
    said the text above was not an answer."""
    cut = _sse("Bread bakes thirty-five ", "minutes at")
    with _misbehaving(cut, "text/event-stream") as url:
        env = {"RAGPIPE_LLM__PROVIDER": "openai", "RAGPIPE_LLM__BASE_URL": f"{url}/v1",
               "RAGPIPE_LLM__MODEL": "m", "RAGPIPE_GENERATE__MIN_RELEVANCE": "0"}  # fmt: skip
        args = ["ask", "How long should bread bake?", "--store-path",
                str(indexed_edge.store.path), "--embedder", "onnx"]  # fmt: skip
        result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "Bread bakes thirty-five minutes at (the text above is not an answer" in said
    assert "no finish_reason" in said
