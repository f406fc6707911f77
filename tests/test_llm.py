"""The LLM providers on real models: SmolLM2 in-process through llama.cpp, and the
real ollama client against the loopback Ollama-API server backed by that model."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from ragpipe.config import LLMConfig
from ragpipe.errors import ConfigError, StageError
from ragpipe.models.llm import LlamaCppLLM, OllamaLLM, make_llm
from tests.support.ollama_server import ollama_server

pytestmark = pytest.mark.integration

QUESTION = [{"role": "user", "content": "Name three colours of the rainbow."}]
SCHEMA = {
    "type": "object",
    "properties": {"colours": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
    "required": ["colours"],
}


def test_llamacpp_reply_stream_and_schema(smollm: LlamaCppLLM) -> None:
    reply = smollm.chat(QUESTION, max_tokens=24)
    assert reply.text.strip() and reply.model == "SmolLM2-135M-Instruct.Q4_1"
    assert reply.tokens_in > 5 and 0 < reply.tokens_out <= 24
    pieces: list[str] = []
    streamed = smollm.chat(QUESTION, max_tokens=24, on_token=pieces.append)
    assert len(pieces) > 1 and "".join(pieces) == streamed.text
    assert streamed.text == reply.text  # temperature 0: the same greedy reply
    structured = smollm.chat(QUESTION, schema=SCHEMA, max_tokens=64)
    data = json.loads(structured.text)  # the grammar makes it valid JSON of that shape
    assert isinstance(data["colours"], list) and len(data["colours"]) <= 3


def test_missing_gguf_is_a_config_error(tmp_path: Path) -> None:
    gguf = tmp_path / "model.gguf"
    with pytest.raises(ValueError, match=r"GGUF file .*model\.gguf does not exist"):
        LLMConfig(model=str(gguf))  # refused when the config is loaded
    gguf.write_bytes(b"")
    config = LLMConfig(model=str(gguf))
    gguf.unlink()  # and if it vanishes between loading the config and using it
    with pytest.raises(ConfigError, match=r"llm\.model: GGUF file .*model\.gguf does not exist"):
        make_llm(config)


def _ollama(host: str, **kwargs: Any) -> OllamaLLM:
    return OllamaLLM("smollm", host=host, **kwargs)


def test_ollama_chat_streams_the_models_reply(smollm: LlamaCppLLM) -> None:
    direct = smollm.chat(QUESTION, max_tokens=24)
    with ollama_server({}, {"smollm": smollm}) as (host, state):
        llm = make_llm(
            LLMConfig(provider="ollama", model="smollm", host=host, api_key="k3y", max_tokens=24)  # type: ignore[arg-type]
        )
        pieces: list[str] = []
        reply = llm.chat(QUESTION, on_token=pieces.append)
        structured = llm.chat(QUESTION, schema=SCHEMA, max_tokens=64)
    assert reply.text == direct.text and "".join(pieces) == reply.text
    assert (reply.tokens_in, reply.tokens_out) == (direct.tokens_in, direct.tokens_out)
    assert isinstance(json.loads(structured.text)["colours"], list)
    chats = [r for r in state.requests if r["path"] == "/api/chat"]
    assert chats[0]["auth"] == "Bearer k3y" and chats[0]["body"]["stream"] is True
    assert chats[0]["body"]["options"]["temperature"] == 0.0
    assert chats[1]["body"]["format"] == SCHEMA


def test_ollama_chat_retries_then_gives_up(smollm: LlamaCppLLM) -> None:
    with ollama_server({}, {"smollm": smollm}) as (host, state):
        state.fail_next = [503, 500]
        assert _ollama(host, retries=2, max_tokens=8).chat(QUESTION).text
        state.fail_next = [503, 503, 503]
        with pytest.raises(StageError, match=r"failed after 3 attempt\(s\): ResponseError"):
            _ollama(host, retries=2, max_tokens=8).chat(QUESTION)
        with pytest.raises(StageError, match="ollama pull gemma3:1b"):
            OllamaLLM("gemma3:1b", host=host).chat(QUESTION)


def test_an_ollama_stream_cut_short_is_an_error_not_an_answer(smollm: LlamaCppLLM) -> None:
    """A stream that ended without its final line was an answer like any other: shown,
    trusted, and cached by serve for everyone who asked again."""
    with ollama_server({}, {"smollm": smollm}) as (host, state):
        state.cut_streams = True
        pieces: list[str] = []
        with pytest.raises(StageError, match=r"ended its stream after [1-9][0-9]* pieces"):
            _ollama(host, max_tokens=8).chat(QUESTION, on_token=pieces.append)
        assert pieces  # the text went out before the stream ended: never retried
        state.cut_streams = False
        assert _ollama(host, max_tokens=8).chat(QUESTION).finish_reason in ("stop", "length")


def test_ollama_gets_the_window_the_sources_are_budgeted_to(smollm: LlamaCppLLM) -> None:
    """Ollama's default window (2048 or 4096 tokens) cut a longer prompt from its start in
    silence: the instructions and the first sources went, and the answer cited sources the
    model never read. llm.context_size is sent as num_ctx, and the sources fit it."""
    from ragpipe.query.generate import PROMPT_MARGIN, answer
    from ragpipe.query.results import Retrieved

    text = "bread " * 120
    hits = [Retrieved(f"p{i}", 1 - i / 100, {"text": f"Fact {i}: {text}", "file_path": f"f{i}.md"})
            for i in range(30)]  # fmt: skip
    with ollama_server({}, {"smollm": smollm}) as (host, state):
        llm = make_llm(LLMConfig(provider="ollama", model="smollm", host=host,  # type: ignore[arg-type]
                                 context_size=1024, max_tokens=8))  # fmt: skip
        reply = answer("What is fact 3?", hits, llm)
    (chat,) = [r["body"] for r in state.requests if r["path"] == "/api/chat"]
    assert chat["options"]["num_ctx"] == 1024
    prompt = sum(llm.count_tokens(str(m["content"])) for m in chat["messages"])
    assert 0 < len(reply.sources) < 30 and prompt <= 1024 - 8 - PROMPT_MARGIN + 64
    assert llm.count_tokens("bread " * 10) == 20  # 2 a word of 5 letters: never under
    # ask, serve and eval rag load it lazily: the same window before it is loaded.
    from ragpipe.models.llm import LazyLLM
    from ragpipe.query.generate import source_budget

    lazy = LazyLLM(
        LLMConfig(
            provider="ollama",
            model="smollm",
            host=host,
            context_size=1024,  # type: ignore[arg-type]
            max_tokens=8,
        )
    )
    assert (
        source_budget("What is fact 3?", lazy, 2800)
        == source_budget("What is fact 3?", llm, 2800)
        < 1024
    )


def test_ollama_chat_unreachable_is_clear_and_fast() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(StageError, match="ollama serve"):
        _ollama(f"http://127.0.0.1:{port}", retries=1).chat(QUESTION)
    assert time.monotonic() - started < 5


def test_ollama_sends_the_first_tokens_log_probabilities(smollm: LlamaCppLLM) -> None:
    direct = smollm.chat(QUESTION, max_tokens=1, top_logprobs=5)
    with ollama_server({}, {"smollm": smollm}) as (host, state):
        reply = _ollama(host).chat(QUESTION, max_tokens=1, top_logprobs=5)
        plain = _ollama(host).chat(QUESTION, max_tokens=1)
    assert direct.top_logprobs is not None and len(direct.top_logprobs) == 5
    assert reply.top_logprobs is not None
    assert reply.top_logprobs.keys() == direct.top_logprobs.keys()
    assert plain.top_logprobs is None
    chats = [r["body"] for r in state.requests if r["path"] == "/api/chat"]
    assert chats[0]["logprobs"] is True and chats[0]["top_logprobs"] == 5
    assert "logprobs" not in chats[1]


# -- found by attack: what Ollama's estimate missed ---------------------------------------

_TABLE = "| date | order | amount | qty |\n|---|---|---|---|\n" + "".join(
    f"| 2021-03-{d:02d} | {40000 + d * 7} | {d * 13.37:.2f} | {d * 3} |\n" for d in range(1, 29)
)


def _qwen_count() -> Any:
    """Tokens of a text for the default model, Qwen2.5 (its GGUF file's own vocabulary)."""
    from ragpipe.models.gguf_vocab import gguf_tokenizer
    from ragpipe.models.llm import resolve_gguf

    tokenizer = gguf_tokenizer(resolve_gguf("qwen2.5-coder-1.5b"))
    assert tokenizer is not None
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def test_the_estimate_without_a_tokenizer_does_not_fall_short() -> None:
    """Ollama and OpenAI-compatible servers expose no tokenizer. 3 characters a token (4 for
    OpenAI) counted a numeric table, hex and Greek at 0.37-0.4 of Qwen2.5's own count and
    Chinese at 0.55. The estimate against that tokenizer: at least 0.95 of the true count
    on English, code, numbers and CJK text, and under twice it on English."""
    from ragpipe.models.llm import OpenAILLM, estimate_tokens
    from tests.support.paths import REPO

    qwen = _qwen_count()
    texts = {
        "english": (REPO / "docs" / "tutorial.md").read_text("utf-8"),
        "code": (REPO / "src" / "ragpipe" / "models" / "gguf_vocab.py").read_text("utf-8"),
        "table": _TABLE,
        "hex": "sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n" * 10,
        "json": json.dumps([{"id": i, "price": i * 1.25, "tags": ["a", "b"]} for i in range(30)]),
        "chinese": "数据库连接池在高并发场景下可以显著降低延迟，但需要设置最大连接数。" * 10,
        "japanese": "このライブラリは設定ファイルを読み込み、各ステージの結果を保存します。" * 10,
        "greek": "Η βάση δεδομένων αποθηκεύει τα αντίγραφα ασφαλείας κάθε νύχτα." * 10,
    }
    ratios = {name: estimate_tokens(text) / qwen(text) for name, text in texts.items()}
    assert min(ratios.values()) >= 0.95, ratios
    assert ratios["english"] < 2 and ratios["code"] < 2, ratios
    old = {name: -(-len(text) // 3) / qwen(text) for name, text in texts.items()}
    assert old["table"] < 0.4 and old["hex"] < 0.4 and old["chinese"] < 0.6  # as measured
    # Counted by hand: a digit, a mark and white space before a digit one each, a word one
    # per 4 letters and its one space none, a CJK character one, an emoji 3.
    assert estimate_tokens("| 2021-03-05 | 15 |\n") == 1 + 1 + 10 + 1 + 1 + 2 + 1 + 1
    assert estimate_tokens("The configuration") == 1 + 4
    assert estimate_tokens("getUserById") == 1 + 1 + 1 + 1
    assert estimate_tokens("数据库 🚀") == 3 + 3
    assert estimate_tokens("") == 0
    text = texts["table"]
    assert OllamaLLM("x").count_tokens(text) == estimate_tokens(text)
    assert OpenAILLM("x", "http://127.0.0.1:9/v1").count_tokens(text) == estimate_tokens(text)


def test_ten_table_sources_fit_ollamas_window() -> None:
    """The attack's sources: ten hits of a numeric table, budgeted to 2800 tokens at 3
    characters a token, were 6547 of Qwen2.5's tokens against num_ctx 4096 (Ollama cut the
    prompt from its start: the instructions went). Now the prompt and the reply fit."""
    from ragpipe.query.generate import build_messages, select_sources, source_budget
    from ragpipe.query.results import Retrieved

    qwen = _qwen_count()
    llm = OllamaLLM("qwen2.5:1.5b")  # no server: the prompt is only built
    question = "What was ordered on 2021-03-05?"
    payload = {"text": _TABLE, "heading_path": ["T"]}
    hits = [
        Retrieved(f"p{i}", 1 - i / 100, {**payload, "file_path": f"t{i}.md"}) for i in range(10)
    ]
    sources, dropped = select_sources(hits, source_budget(question, llm, 2800), llm.count_tokens)
    prompt = "".join(str(m["content"]) for m in build_messages(question, sources))
    assert sources and dropped == 10 - len(sources)
    assert qwen(prompt) + llm.max_tokens <= llm.context_size
    assert llm.count_tokens(prompt) >= qwen(prompt)


def test_a_full_ollama_window_is_said_and_flags_the_answer(
    smollm: LlamaCppLLM, caplog: pytest.LogCaptureFixture
) -> None:
    """Ollama cuts a prompt past num_ctx from its start and says nothing; its counts then
    fill the window. An answer from such a prompt was shown as any other."""
    from ragpipe.query.generate import WINDOW_FULL, answer, flag_warnings
    from ragpipe.query.results import Retrieved

    class Undercounting(OllamaLLM):
        def count_tokens(self, text: str) -> int:  # what 3 characters a token did to tables
            return len(text) // 12

    hits = [Retrieved(f"p{i}", 1 - i / 100, {"text": f"Fact {i}: the oven bakes bread at "
                                             f"{200 + i} degrees. " * 6, "file_path": f"f{i}.md"})
            for i in range(12)]  # fmt: skip
    question = "At what heat does the oven bake bread?"
    with ollama_server({}, {"smollm": smollm}) as (host, _):
        small = Undercounting("smollm", host=host, context_size=512, max_tokens=8)
        with caplog.at_level("WARNING", logger="ragpipe.models.llm"):
            full = answer(question, hits, small)
        roomy = answer(question, hits, OllamaLLM("smollm", host=host, context_size=4096,
                                                 max_tokens=8))  # fmt: skip
    assert full.tokens_in + full.tokens_out >= 512
    assert WINDOW_FULL in full.flags and not full.trusted
    assert any("filled the model's window" in line for line in flag_warnings(full))
    (said,) = [r.getMessage() for r in caplog.records if "window was full" in r.getMessage()]
    assert f"{full.tokens_in} prompt + {full.tokens_out} reply tokens >= num_ctx 512" in said
    assert "llm.context_size" in said
    assert roomy.tokens_in + roomy.tokens_out < 4096 and WINDOW_FULL not in roomy.flags
