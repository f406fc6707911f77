"""Language models behind one protocol: llama.cpp in-process (xllamacpp), Ollama, and
any OpenAI-compatible server.

The generator, HyDE, the LLM chunk filter and the RAGAS judge all talk to an
``LLM``: chat messages in, a ``Completion`` out, optionally streamed token by
token and optionally constrained to a JSON schema (llama.cpp turns the schema
into a grammar; Ollama takes it as ``format``).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ragpipe.config import LLMConfig, LLMProvider, expand_home
from ragpipe.errors import ConfigError, StageError
from ragpipe.models.ollama_api import call_with_retries, ollama_client
from ragpipe.models.openai_api import OpenAIClient, RequestRefused, api_key

logger = logging.getLogger(__name__)

OLLAMA_DEFAULT_MODEL = "gemma3:1b"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

Message = dict[str, str]


class GenerationCancelled(Exception):
    """Raised by an ``on_token`` callback to stop a generation (its reader has gone)."""


@dataclass
class Completion:
    """One model reply and what it cost."""

    text: str
    tokens_in: int
    tokens_out: int
    model: str
    seconds: float
    finish_reason: str | None = None
    # The first generated token's most likely alternatives (token text -> log-probability),
    # when asked for with ``top_logprobs`` and the runtime exposes them; else None.
    top_logprobs: dict[str, float] | None = None
    # The prompt and the reply filled the model's window (Ollama's num_ctx): Ollama then
    # cuts the prompt from its start, the instructions first, and says nothing.
    window_full: bool = False


# The pieces a BPE tokenizer never merges across, each counted on its own: an ASCII digit
# (Qwen and SmolLM write every digit as a token) and the white space before one, a
# non-ASCII character, a run of ASCII letters (cut where a capital follows a small letter),
# a run of white space (one space before a word or a mark rides with it), a mark.
_PIECES = re.compile(
    r"(?P<digit>[0-9]|\s+(?=[0-9]))|(?P<wide>[^\x00-\x7f])"
    r"|(?P<word>[A-Z]?[a-z]+|[A-Z]+(?![a-z]))|(?P<space>\s+)|(?P<mark>.)",
    re.DOTALL,
)


def estimate_tokens(text: str) -> int:
    """Tokens ``text`` takes in a model whose tokenizer cannot be asked (Ollama, an
    OpenAI-compatible server): an estimate meant never to fall short by much, so that
    sources budgeted with it fit the window.

    Each digit, punctuation mark and non-ASCII character is a token (a CJK character; a
    Latin, Greek, Cyrillic, Hebrew or Arabic letter; 1.5 for other scripts' letters, which
    the models' vocabularies hold few of; 3 past the Basic Multilingual Plane: emoji), so
    is white space before a digit, and other white space but a word's one space; a run of
    ASCII letters is one per 4. Measured against Qwen2.5's own tokenizer in
    docs/explanation/benchmarks.md ("Counting tokens without the model's tokenizer").
    """
    n = 0.0
    for _digit, wide, word, space, _mark in _PIECES.findall(text):
        if word:
            n += -(-len(word) // 4)
        elif space:
            n += space != " "
        elif wide:
            code = ord(wide)
            if code < 0x800 or _cjk(code):
                n += 1
            else:
                n += 1.5 if code <= 0xFFFF else 3
        else:  # a digit (or the white space before one), a mark
            n += 1
    return math.ceil(n)


def _cjk(code: int) -> bool:
    """CJK ideographs, kana, Hangul, CJK punctuation and full-width forms: one token or
    less a character in the models' vocabularies."""
    return (0x2E80 <= code <= 0x9FFF or 0xAC00 <= code <= 0xD7AF or 0xF900 <= code <= 0xFAFF
            or 0xFF00 <= code <= 0xFFEF)  # fmt: skip


class LLM(Protocol):
    """What the pipeline needs from a language model."""

    @property
    def name(self) -> str:
        """The model's name, as reports record it."""
        ...

    @property
    def takes_grammar(self) -> bool:
        """Whether ``chat`` takes a llama.cpp GBNF ``grammar`` that constrains the reply."""
        ...

    def chat(
        self,
        messages: Sequence[Message],
        *,
        schema: dict[str, Any] | None = None,
        on_token: Callable[[str], None] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        grammar: str | None = None,
        top_logprobs: int | None = None,
    ) -> Completion:
        """Reply to ``messages``; ``on_token`` receives the text as it is generated;
        ``grammar`` (GBNF, only where ``takes_grammar``) constrains what it may write;
        ``top_logprobs`` asks for the first token's most likely alternatives
        (``Completion.top_logprobs``, None where the runtime exposes none)."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` in this model's vocabulary (an estimate where none is exposed)."""
        ...


# The packaged model ask, eval rag and the judge use when llm.model is unset: chosen by
# measurement (bench/llm_choice.py, README "Language models"); SmolLM2 runs the tests'
# plumbing.
DEFAULT_PACKAGED = "qwen2.5-coder-1.5b"


def default_gguf() -> Path:
    """The default packaged model's GGUF file (found without importing its package)."""
    return resolve_gguf(None)


def resolve_gguf(model: str | Path | None) -> Path:
    """A packaged model's name (``qwen2.5-coder-1.5b``: assembled from its packages once),
    a .gguf path, or None for the default packaged model."""
    from ragpipe.models.packaged import PACKAGED, gguf_path

    name = DEFAULT_PACKAGED if model is None else str(model)
    if name in PACKAGED:
        return gguf_path(name)
    return expand_home(Path(name))


class LlamaCppLLM:
    """A GGUF model in-process through xllamacpp (llama.cpp's server core, no HTTP)."""

    takes_grammar = True
    # A chat ending in an assistant message is continued, not answered (llama.cpp's
    # prefill_assistant, on by default): the reply's text starts with that message.
    continues_reply = True

    def __init__(
        self,
        model: str | Path | None = None,
        context_size: int = 4096,
        threads: int | None = None,
        max_tokens: int = 384,
        temperature: float = 0.0,
        seed: int = 0,
    ) -> None:
        path = resolve_gguf(model)
        self._server, self._lock = _load_gguf(str(path), context_size, threads)
        self.name = path.stem
        self.path = path
        self.identity = gguf_identity(path)  # which weights, for caches keyed by model
        self.context_size = context_size
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.seed = seed

    def _request(
        self,
        messages: Sequence[Message],
        schema: dict[str, Any] | None,
        max_tokens: int | None,
        temperature: float | None,
        seed: int | None,
        grammar: str | None = None,
        top_logprobs: int | None = None,
    ) -> dict[str, Any]:
        request: dict[str, Any] = {
            "messages": list(messages),
            "max_tokens": max_tokens or self.max_tokens,
            "temperature": self.temperature if temperature is None else temperature,
            "seed": self.seed if seed is None else seed,
        }
        if schema is not None:
            request["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
        if grammar is not None:
            request["grammar"] = grammar
        if top_logprobs:
            request.update(logprobs=True, top_logprobs=top_logprobs)
        return request

    def chat(
        self,
        messages: Sequence[Message],
        *,
        schema: dict[str, Any] | None = None,
        on_token: Callable[[str], None] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        grammar: str | None = None,
        top_logprobs: int | None = None,
    ) -> Completion:
        request = self._request(
            messages, schema, max_tokens, temperature, seed, grammar, top_logprobs
        )
        started = time.perf_counter()
        alternatives = None
        with self._lock:
            if on_token is None:
                reply = self._server.handle_chat_completions(request)
                _raise_on_error(reply, self.name)
                choice = reply["choices"][0]
                text = choice["message"].get("content") or ""
                usage = reply.get("usage", {})
                finish = choice.get("finish_reason")
                tokens_in = int(usage.get("prompt_tokens", 0))
                tokens_out = int(usage.get("completion_tokens", 0))
                alternatives = first_token_logprobs(choice)
            else:
                pieces: list[str] = []
                last: dict[str, Any] = {}
                # xllamacpp drops what a callback raises: the reader's own stop (gone, or
                # looping) and llama.cpp's errors (a prompt past the context: an empty
                # answer and exit 0) are kept here and raised again after the call, as is.
                cancelled: BaseException | None = None

                def receive(chunk: Any) -> bool:
                    nonlocal last, cancelled
                    data = json.loads(chunk) if isinstance(chunk, str | bytes) else chunk
                    try:
                        _raise_on_error(data, self.name)
                    except StageError as error:
                        cancelled = error
                        return True
                    last = data
                    for choice in data.get("choices", []):
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            pieces.append(piece)
                            try:
                                on_token(piece)
                            except GenerationCancelled as stop:  # raised again below, as is
                                cancelled = stop
                                return True  # xllamacpp stops generating when told True
                    return False

                _raise_on_error(
                    self._server.handle_chat_completions({**request, "stream": True}, receive),
                    self.name,
                )
                if cancelled is not None:
                    raise cancelled
                text = "".join(pieces)
                timings = last.get("timings", {})
                finish = (last.get("choices") or [{}])[0].get("finish_reason")
                tokens_out = int(timings.get("predicted_n", 0))
                tokens_in = int(timings.get("prompt_n", 0)) + int(timings.get("cache_n", 0))
        return Completion(
            text,
            tokens_in,
            tokens_out,
            self.name,
            time.perf_counter() - started,
            finish,
            alternatives,
        )

    def count_tokens(self, text: str) -> int:
        # xllamacpp exposes no tokenizer call: the model's own BPE, rebuilt from the GGUF
        # file's vocabulary, counts exactly what llama.cpp counts (gguf_vocab); for a
        # vocabulary it cannot rebuild, the estimate (4 characters a token under-counted
        # code, tables and non-English text).
        from ragpipe.models.gguf_vocab import gguf_tokenizer

        tokenizer = gguf_tokenizer(self.path)
        if tokenizer is None:
            return estimate_tokens(text)
        return len(tokenizer.encode(text, add_special_tokens=False).ids)


@functools.lru_cache(maxsize=2)
def _load_gguf(path: str, context_size: int, threads: int | None) -> tuple[Any, threading.Lock]:
    """Load a GGUF model once per process; the lock serialises requests to it."""
    import xllamacpp as xlc

    if not Path(path).is_file():
        raise ConfigError(
            f"llm.model: GGUF file {path} does not exist (set llm.model to a .gguf path, or "
            "a packaged model: qwen2.5-coder-1.5b (the default), qwen2.5-coder-0.5b, smollm2-135m)"
        )
    params = xlc.CommonParams()
    params.model.path = path
    params.n_ctx = context_size
    params.n_parallel = 1
    params.warmup = False
    params.verbosity = -1
    if threads is not None:
        params.cpuparams.n_threads = threads
        params.cpuparams_batch.n_threads = threads
    try:
        server = xlc.Server(params)
    except Exception as exc:
        raise ConfigError(f"llm.model: llama.cpp cannot load {path}: {exc}") from exc
    return server, threading.Lock()


def _raise_on_error(reply: Any, model: str) -> None:
    if isinstance(reply, dict) and "error" in reply:
        error = reply["error"]
        message = error.get("message") if isinstance(error, dict) else str(error)
        raise StageError(f"llama.cpp ({model}) refused the request: {message}")


def first_token_logprobs(choice: dict[str, Any]) -> dict[str, float] | None:
    """The first generated token's alternatives from an OpenAI-shaped choice (llama.cpp's
    server core and OpenAI-compatible servers write ``logprobs.content[0].top_logprobs``);
    None when there are none. A token text listed twice keeps its higher log-probability."""
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content or not isinstance(content[0], dict):
        return None  # none sent, or not in the shape servers send: as if none
    alternatives = content[0].get("top_logprobs")
    found: dict[str, float] = {}
    for alt in alternatives if isinstance(alternatives, list) else []:
        token = alt.get("token") if isinstance(alt, dict) else None
        logprob = alt.get("logprob") if isinstance(alt, dict) else None
        if isinstance(token, str) and isinstance(logprob, int | float) and logprob <= 0:
            found[token] = max(float(logprob), found.get(token, -math.inf))
    return found or None


class OllamaLLM:
    """An Ollama server's ``/api/chat`` (streamed), with bounded retries."""

    takes_grammar = False  # Ollama constrains replies by JSON schema only

    def __init__(
        self,
        model: str = OLLAMA_DEFAULT_MODEL,
        host: str = "http://127.0.0.1:11434",
        timeout_s: float = 120.0,
        retries: int = 2,
        api_key: str | None = None,
        max_tokens: int = 384,
        temperature: float = 0.0,
        seed: int = 0,
        context_size: int = 4096,
    ) -> None:
        self._client = ollama_client(host, timeout_s, api_key)
        # Sent as num_ctx, and the sources budgeted to it: Ollama's own window (2048 or
        # 4096 by default) cut a longer prompt from its start, in silence: the instructions
        # and the first sources went, and the answer cited sources the model never read.
        self.context_size = context_size
        self.name = model
        self.host = host
        self.identity = f"ollama:{host}:{model}"
        self.retries = retries
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.seed = seed

    def chat(
        self,
        messages: Sequence[Message],
        *,
        schema: dict[str, Any] | None = None,
        on_token: Callable[[str], None] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        grammar: str | None = None,
        top_logprobs: int | None = None,
    ) -> Completion:
        if grammar is not None:
            raise ValueError("Ollama takes no GBNF grammar (check takes_grammar first)")
        options = {
            "num_predict": max_tokens or self.max_tokens,
            "temperature": self.temperature if temperature is None else temperature,
            "seed": self.seed if seed is None else seed,
            "num_ctx": self.context_size,
        }
        pieces: list[str] = []
        first: list[Any] = []  # the first token's logprobs, when asked for and sent
        asked = {"logprobs": True, "top_logprobs": top_logprobs} if top_logprobs else {}

        def request() -> Any:
            pieces.clear()
            first.clear()
            final = None
            stream = self._client.chat(
                model=self.name, messages=list(messages), stream=True, format=schema,
                options=options, **asked,
            )  # fmt: skip
            try:
                for part in stream:
                    if asked and not first and part.logprobs:
                        first.append(part.logprobs[0])
                    piece = part.message.content or ""
                    if piece:
                        pieces.append(piece)
                        if on_token is not None:
                            on_token(piece)
                    if part.done:
                        final = part
            except GenerationCancelled:
                raise  # closing the stream stops Ollama generating
            except Exception as exc:
                if pieces:  # text already went out: a retry would repeat it
                    raise StageError(
                        f"Ollama at {self.host} broke off the answer after "
                        f"{len(pieces)} pieces: {exc}"
                    ) from exc
                raise
            if final is None:  # a stream cut short: part of an answer, never one
                raise StageError(
                    f"Ollama at {self.host} ended its stream after {len(pieces)} pieces "
                    "without its final message: the answer may be cut short, so it is not used"
                )
            return final

        started = time.perf_counter()
        final = call_with_retries(
            request, host=self.host, model=self.name, retries=self.retries, section="llm"
        )
        tokens_in = int(getattr(final, "prompt_eval_count", 0) or 0)
        tokens_out = int(getattr(final, "eval_count", 0) or 0)
        finish = getattr(final, "done_reason", None)
        # Ollama keeps a prompt past num_ctx by cutting it from its start (the instructions
        # go first) and reports only what it kept: a full window is the one sign of it.
        full = tokens_in + tokens_out >= self.context_size
        if full:
            logger.warning(
                "Ollama's window was full (%s at %s: %d prompt + %d reply tokens >= num_ctx "
                "%d): the prompt was probably cut from its start, its instructions with it. "
                "Raise llm.context_size (the server's memory allowing) or lower "
                "generate.context_tokens", self.name, self.host, tokens_in, tokens_out,
                self.context_size,
            )  # fmt: skip
        alternatives = None
        if first:
            alts = [{"token": a.token, "logprob": a.logprob} for a in first[0].top_logprobs or []]
            alternatives = first_token_logprobs({"logprobs": {"content": [{"top_logprobs": alts}]}})
        return Completion(
            "".join(pieces),
            tokens_in,
            tokens_out,
            self.name,
            time.perf_counter() - started,
            finish,
            alternatives,
            window_full=full,
        )

    def count_tokens(self, text: str) -> int:
        # Ollama exposes no tokenizer endpoint: an estimate that does not fall short, so
        # that the sources budgeted to num_ctx fit it. 3 characters a token counted a
        # numeric table, hex and Greek at 0.37-0.4 of Qwen's count, Chinese at 0.55: ten
        # table sources budgeted to 2800 tokens took 6547, past num_ctx 4096.
        return estimate_tokens(text)


class OpenAILLM:
    """An OpenAI-compatible server's ``/chat/completions`` (vLLM, TGI, LM Studio, llama.cpp's
    server, OpenAI): streamed when asked, a JSON schema as ``response_format``."""

    def __init__(
        self,
        model: str,
        base_url: str,
        key: str | None = None,
        timeout_s: float = 120.0,
        retries: int = 2,
        max_concurrency: int = 4,
        max_tokens: int = 384,
        temperature: float = 0.0,
        seed: int = 0,
        section: str = "llm",
        grammar: bool = False,
    ) -> None:
        self._client = OpenAIClient(base_url, key, timeout_s, retries, max_concurrency, section)
        self.name = model
        self.identity = f"openai:{base_url}:{model}"
        self.takes_grammar = grammar  # llama.cpp's server takes GBNF; vLLM, OpenAI do not
        self.base_url = base_url
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.seed = seed
        # False once the server refused a request for log-probabilities that it took
        # without them (vLLM with max_logprobs 0, servers that know no such field).
        self.sends_logprobs = True

    def chat(
        self,
        messages: Sequence[Message],
        *,
        schema: dict[str, Any] | None = None,
        on_token: Callable[[str], None] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        grammar: str | None = None,
        top_logprobs: int | None = None,
    ) -> Completion:
        if grammar is not None and not self.takes_grammar:
            raise ValueError(f"{self.base_url} is not known to take a GBNF grammar (llm.grammar)")
        body: dict[str, Any] = {
            "model": self.name,
            "messages": list(messages),
            "max_tokens": max_tokens or self.max_tokens,
            "temperature": self.temperature if temperature is None else temperature,
            "seed": self.seed if seed is None else seed,
        }
        if schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "reply", "schema": schema},
            }
        if grammar is not None:
            body["grammar"] = grammar
        if top_logprobs and self.sends_logprobs and on_token is None:  # a stream reads none
            body.update(logprobs=True, top_logprobs=top_logprobs)
        started = time.perf_counter()
        if on_token is None:
            reply = self._post_chat(body)
            choices = reply.get("choices")
            if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
                # read as an empty reply, every rerank score was 0.5 and HyDE searched ""
                raise StageError(
                    f"the server at {self.base_url} sent no choices for /chat/completions: "
                    f"{json.dumps(reply)[:200]}"
                )
            choice = choices[0]
            usage = reply.get("usage") or {}
            return Completion(
                (choice.get("message") or {}).get("content") or "",
                int(usage.get("prompt_tokens", 0)),
                int(usage.get("completion_tokens", 0)),
                self.name,
                time.perf_counter() - started,
                choice.get("finish_reason"),
                first_token_logprobs(choice),
            )
        pieces: list[str] = []
        usage, finish = {}, None
        body["stream_options"] = {"include_usage": True}
        with self._client.stream("/chat/completions", body) as events:
            for event in events:
                usage = event.get("usage") or usage
                for choice in event.get("choices") or []:
                    finish = choice.get("finish_reason") or finish
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        pieces.append(piece)
                        on_token(piece)  # GenerationCancelled closes the stream: it stops
        return Completion(
            "".join(pieces),
            int(usage.get("prompt_tokens", 0)),
            int(usage.get("completion_tokens", len(pieces))),
            self.name,
            time.perf_counter() - started,
            finish,
        )

    def _post_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST a chat request; one the server refuses for its log-probabilities is sent
        again without them (the reply then has none: callers fall back, as for a runtime
        that exposes none), and later requests do not ask again."""
        try:
            return self._client.post("/chat/completions", body)
        except RequestRefused as exc:
            if "logprobs" not in body or exc.status not in (400, 422):
                raise
            plain = {k: v for k, v in body.items() if k not in ("logprobs", "top_logprobs")}
            reply = self._client.post("/chat/completions", plain)  # another refusal is raised
            self.sends_logprobs = False
            logger.warning(
                "%s refused log-probabilities (%s); asking without them from now on",
                self.base_url, exc,
            )  # fmt: skip
            return reply

    def count_tokens(self, text: str) -> int:
        # The API exposes no tokenizer. 4 characters a token counted code, tables and
        # non-English text short (a server with a small window refuses such a prompt).
        return estimate_tokens(text)


class DelegatingLLM:
    """A model that adds one thing to the model it wraps (``chat`` overridden) and is that
    model for everything else: its name, grammar support, token count and any other
    attribute (temperature, context_size, ...)."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm

    @property
    def name(self) -> str:
        return self.llm.name

    @property
    def takes_grammar(self) -> bool:
        return self.llm.takes_grammar

    def chat(self, messages: Sequence[Message], **options: Any) -> Completion:
        return self.llm.chat(messages, **options)

    def count_tokens(self, text: str) -> int:
        return self.llm.count_tokens(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.llm, name)


def takes_grammar(config: LLMConfig) -> bool:
    """Whether the configured model takes a GBNF grammar (known without loading it)."""
    if config.provider == LLMProvider.OPENAI:
        return config.grammar
    return config.provider == LLMProvider.LLAMACPP


def model_name(config: LLMConfig) -> str:
    """The name ``make_llm(config).name`` will have, known without loading the model."""
    if config.provider == LLMProvider.OPENAI:
        return str(config.model)
    if config.provider == LLMProvider.OLLAMA:
        return config.model or OLLAMA_DEFAULT_MODEL
    from ragpipe.models.packaged import PACKAGED

    name = DEFAULT_PACKAGED if config.model is None else str(config.model)
    if name in PACKAGED:
        return Path(PACKAGED[name].file).stem
    return expand_home(Path(name)).stem


def model_identity(config: LLMConfig) -> str:
    """Which model ``config`` names, where (runtime, server, file), known without loading
    it: ``make_llm(config).identity``. Caches of model outputs key on it."""
    if config.provider == LLMProvider.OPENAI:
        return f"openai:{config.base_url}:{config.model}"
    if config.provider == LLMProvider.OLLAMA:
        return f"ollama:{config.host}:{config.model or OLLAMA_DEFAULT_MODEL}"
    from ragpipe.models.packaged import PACKAGED

    name = DEFAULT_PACKAGED if config.model is None else str(config.model)
    return gguf_identity(Path(PACKAGED[name].file) if name in PACKAGED else Path(name))


def gguf_identity(path: Path) -> str:
    """A packaged model by its file name and SHA-256 (wherever it was assembled), any
    other GGUF file by its absolute path."""
    from ragpipe.models.packaged import PACKAGED

    for model in PACKAGED.values():
        if model.file == path.name:
            return f"llamacpp:{model.file}:{model.sha256}"
    return f"llamacpp:{expand_home(path).resolve()}"


class LazyLLM:
    """The configured model, loaded on its first ``chat`` or ``count_tokens``: an answer
    refused by the relevance floor names its model without loading it."""

    def __init__(self, config: LLMConfig) -> None:
        self._config = config
        self._llm: LLM | None = None
        self._loading = threading.Lock()
        self.name = model_name(config)
        self.identity = model_identity(config)
        self.takes_grammar = takes_grammar(config)
        self.continues_reply = config.provider == LLMProvider.LLAMACPP
        self.temperature = config.temperature
        # What the sources' budget needs (generate.source_budget), known without loading:
        # the window of an embedded model, and Ollama's (sent as num_ctx: ask, serve and
        # eval rag, which load through here, budgeted 2800 tokens to a 1024 window); an
        # OpenAI server's is the server's (None).
        windowed = config.provider in (LLMProvider.LLAMACPP, LLMProvider.OLLAMA)
        self.context_size = config.context_size if windowed else None
        self.max_tokens = config.max_tokens

    def model(self) -> LLM:
        with self._loading:  # threads asking at once load it once
            if self._llm is None:
                self._llm = make_llm(self._config)
            return self._llm

    def chat(self, messages: Sequence[Message], **options: Any) -> Completion:
        return self.model().chat(messages, **options)

    def count_tokens(self, text: str) -> int:
        return self.model().count_tokens(text)


def make_llm(config: LLMConfig) -> LLM:
    """The configured model; an in-process GGUF model is loaded once per process."""
    if config.provider == LLMProvider.OPENAI:
        assert config.model is not None  # LLMConfig requires it for openai
        return OpenAILLM(
            model=config.model,
            base_url=config.base_url,
            key=api_key(config.api_key),
            timeout_s=config.timeout_s,
            retries=config.retries,
            max_concurrency=config.max_concurrency,
            max_tokens=config.max_tokens,
            temperature=config.temperature,
            seed=config.seed,
            grammar=config.grammar,
        )
    if config.provider == LLMProvider.OLLAMA:
        key = config.api_key.get_secret_value() if config.api_key else None
        return OllamaLLM(
            model=config.model or OLLAMA_DEFAULT_MODEL,
            host=config.host,
            timeout_s=config.timeout_s,
            retries=config.retries,
            api_key=key,
            max_tokens=config.max_tokens,
            temperature=config.temperature,
            seed=config.seed,
            context_size=config.context_size,
        )
    return LlamaCppLLM(
        config.model,
        config.context_size,
        config.threads,
        config.max_tokens,
        config.temperature,
        config.seed,
    )
