"""RAG evaluation: retrieve → generate → score the answers, and judge them with RAGAS.

Every run scores the answers without a judge (``ANSWER_METRICS``, from
``ragpipe.evaluation.answers``): correctness against ``expected_answer`` (SQuAD
token F1, ROUGE-L, the embedder's cosine), citation precision and recall against
the sources holding a golden target, refusal (correct on ``answerable: false``
items, false on the others) and degenerate (looping) output.

The judge is measured before it is believed (``ragpipe.evaluation.calibration``):
its Cohen's kappa on a probe built from the golden set and the index decides
whether its metrics are headlined at all. Optional human labels turn each judged
metric into a prediction-powered estimate (``ragpipe.evaluation.agreement``).

The judge is the ``ragas`` library's own metrics (faithfulness, answer
relevancy, context precision, context recall) driven by ragpipe's ``LLM`` and
``Embedder`` through ragas's custom-LLM interface. By default (``eval.judge_verdicts:
statement``, ``Judge``) each verdict is one short call for a bare verdict, asked as the
calibration probe asks it: faithfulness's on each statement and context recall's on each
sentence of the reference (``ask_statement``), context precision's on each context
(``ask_context``); ragas's own prompts on request. Context recall needs a
reference answer: items without ``expected_answer`` record it as not
applicable, and context precision then uses ragas's reference-free variant
(recorded per row). A judge failure (timeout, unparseable output, NaN) is
recorded as null with its reason, never as 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, TypeVar

from ragpipe.config import RagpipeConfig
from ragpipe.errors import ConfigError, StageError
from ragpipe.evaluation import answers
from ragpipe.evaluation.agreement import PPIEstimate, labels_by_metric, load_labels, ppi_mean
from ragpipe.evaluation.calibration import (
    ANSWER_PROMPT,
    CONTEXT_PROMPT,
    CONTEXTS,
    STATEMENT_PROMPT,
    TRUSTABLE_PAIRS,
    VERDICTS,
    Calibration,
    Settling,
    ask_context,
    ask_statement,
    build_probe,
    calibrate,
    timed_out,
)
from ragpipe.evaluation.check import IndexView
from ragpipe.evaluation.golden import GoldenItem, GoldenSet, file_matches, stratified_sample
from ragpipe.evaluation.metrics import MIN_CI_N, Interval, bootstrap_ci
from ragpipe.evaluation.retrieval import filter_warning
from ragpipe.models.embedders import Embedder, embedder_name, make_embedder
from ragpipe.models.llm import LLM, Completion, DelegatingLLM, Message, make_llm
from ragpipe.query.generate import (
    BELOW_FLOOR,
    DEGENERATE,
    MISATTRIBUTED,
    NO_TEXT,
    NOT_FOUND,
    PROMPT_MARGIN,
    TRUNCATED,
    WINDOW_FULL,
    Answer,
    attribution_misses,
    configured_answer,
    copy_texts,
    lone_zero,
    no_answer_text,
    plausible_citation,
    relevance_floor,
    source_budget,
    without_citation_marks,
)
from ragpipe.query.results import Retrieved
from ragpipe.query.retrieve import Retriever

os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")  # else ~15 s of telemetry DNS per run

RAG_METRICS = ("faithfulness", "answer_relevancy", "context_precision", "context_recall")
# Judge-free, on every run: correctness vs expected_answer, citations, refusal, loops.
ANSWER_METRICS = (
    "answer_f1",
    "answer_rouge_l",
    "answer_cosine",
    "citation_precision",
    "citation_recall",
    "correct_refusal",
    "false_refusal",
    "degenerate",
)
ALL_RAG_METRICS = ANSWER_METRICS + RAG_METRICS
# What each metric can score. Outside it, the judge's output broke the metric's arithmetic
# (a small model's context-precision verdicts of 2 or -1 instead of 0/1 gave 5e14).
# Answer relevancy is a mean cosine similarity.
SCORE_RANGE = {"answer_relevancy": (-1.0, 1.0)}
OK, FAILED, NOT_APPLICABLE = "ok", "failed", "not_applicable"
# The answers the pipeline itself does not vouch for (generate's flags; ask shows each with
# a warning), and what each means for a score of it. They were scored as any other answer
# and counted nowhere: 5 of 5 answers window_full headlined answer F1 and citation
# precision 1.000, the flags in per_query.parquet alone. Past eval.max_judge_failure_share
# of the answers, the answer metrics are withheld as a judge's are (``_result``); degenerate
# stays, as it counts loops itself.
UNTRUSTED_FLAGS = {
    WINDOW_FULL: "the prompt and answer filled the generator's window (llm.context_size): "
    "the prompt was probably cut from its start, instructions first; raise "
    "llm.context_size or lower generate.context_tokens",
    TRUNCATED: "cut at llm.max_tokens before the answer ended",
    MISATTRIBUTED: "a cited sentence's words are in another given source than the one it "
    "cites (each such citation counts as wrong in citation_precision)",
    NO_TEXT: "citations alone, or nothing: no answer",
    DEGENERATE: "the answer repeats itself (a loop, stopped where it was caught)",
}
FEW_LABELS = 10  # fewer human labels of a metric than this: a warning says its CI is wide

M = TypeVar("M")

logger = logging.getLogger(__name__)


@dataclass
class Judged:
    """One metric of one query: a score, or null with the reason."""

    value: float | None
    status: str
    reason: str | None = None
    # False: a judged metric's value given without asking the judge (0 for an empty
    # context): no trial of the judge, so not in its failure share.
    asked: bool = True


@dataclass
class RagRow:
    item_id: str
    query: str
    answer: str
    not_found: bool
    contexts: list[str]
    cited: int
    invalid_citations: list[int]
    tokens_in: int
    tokens_out: int
    generation_seconds: float
    judged: dict[str, Judged] = field(default_factory=dict)  # RAG_METRICS and ANSWER_METRICS
    context_precision_kind: str = ""
    answerable: bool = True
    sources: list[dict[str, Any]] = field(default_factory=list)  # number, file, heading, ...
    cited_numbers: list[int] = field(default_factory=list)  # valid and invalid, in order
    repetition: float = 0.0
    flags: list[str] = field(default_factory=list)  # the answer's (generate's flags)
    withdrawn: str | None = None  # what the model wrote before saying "not found"


@dataclass
class RagEvalResult:
    name: str
    golden: GoldenSet
    rows: list[RagRow]
    summary: dict[str, Interval]
    counts: dict[str, dict[str, int]]
    judge: dict[str, Any]
    generator: str
    warnings: list[str]
    resamples: int
    seed: int
    flags: dict[str, str] = field(default_factory=dict)  # metric -> why it is not a value
    withheld: set[str] = field(default_factory=set)  # flagged metrics shown without a value
    calibration: Calibration | None = None
    ppi: dict[str, PPIEstimate] = field(default_factory=dict)
    selection: str = ""  # which items were scored (item_selection)
    # The answers' flags counted (``answer_flag_counts``): summary.json's answer_flags.
    answer_flags: dict[str, Any] = field(default_factory=dict)
    # The generator and what makes its answers (``generator_settings``).
    generator_settings: dict[str, Any] = field(default_factory=dict)


# The judge's replies are bounded in the schema the model is constrained by (llama.cpp
# turns it into a grammar); unbounded, they ran past eval.judge_max_tokens and were lost as
# invalid JSON (bench/judge_speed.py):
# - "reason" (the rationale written before each verdict): at most REASON_MAX_CHARS;
# - every list (statements, verdicts, classifications): at most MAX_STATEMENTS items, each
#   string item at most STATEMENT_MAX_CHARS: the statement generator looped ("CRAN is a
#   collection of sites ..." until 768 tokens) on 1 answer in 3, and faithfulness was lost.
# The statement a verdict echoes is not bounded: cut, the judge judged the cut statement
# ("... are examples of U": verdict 0; faithfulness 1.0 -> 0.5 and 1.0 -> 0.11).
# A list the grammar closed at MAX_STATEMENTS items may have been cut there: an answer's
# later claims (or a reference's later sentences) unjudged, a score over the first ones
# said of the whole. A reply that holds exactly that many is a failure (``at_the_cap``).
# The cap was 10, and 3 of the 5 answers bench/judge_speed.py recorded filled it (one cut,
# one a loop); at 16 the --sample 20 run failed two answers the 1.5B splits into 18
# statements unbounded (a 314-token list of packages; a loop). Answers are at most 384
# tokens (llm.max_tokens).
REASON_MAX_CHARS = 160
MAX_STATEMENTS = 24
STATEMENT_MAX_CHARS = 240

# Context recall with eval.judge_verdicts: statement judges the reference answer sentence
# by sentence, as ragas's prompt asks ("analyze each sentence in the answer"), each asked
# as faithfulness asks a statement. A piece shorter than REFERENCE_MIN_WORDS words (a
# "Yes.", an "e.g." split off) joins its neighbour.
_REFERENCE_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[`]?[A-Z0-9])")
REFERENCE_MIN_WORDS = 3


def reference_sentences(reference: str) -> list[str]:
    """``reference``'s sentences (split after . ! or ? before a capital or a digit)."""
    return _joined(_REFERENCE_SENTENCE.split(" ".join(reference.split())))


def _joined(pieces: Sequence[str]) -> list[str]:
    """``pieces`` with each one shorter than REFERENCE_MIN_WORDS joined to the next (the
    last to the one before it), blanks left out."""
    out: list[str] = []
    pending = ""
    for part in pieces:
        pending = f"{pending} {part}".strip()
        if len(pending.split()) >= REFERENCE_MIN_WORDS:
            out.append(pending)
            pending = ""
    if pending and out:
        out[-1] += " " + pending
    elif pending:
        out.append(pending)
    return out


# Faithfulness with eval.faithfulness_claims: sentences (the default) judges the answer's
# own sentences instead of the statements ragas's generator writes from it: the same
# split as the reference's, on each paragraph, list item, quote or table row of the
# markdown the generator writes, its list markers, emphasis, code marks and [n] citations
# taken out (outside code: x[1] is R's indexing, not a citation). Headings, rules, table
# delimiters and a trailing "Sources:" list make no claim and are left out. A piece under
# REFERENCE_MIN_WORDS words ("Windows:", a list's heading) joins the next, a code block
# the sentence before it (the "use this command:" it illustrates), and a sentence said
# again (a looping answer) counts once. A paragraph that starts in lower case after one
# that ends without a full stop continues its sentence (a blank line or a code block
# broke it: "type ```library()``` at the R prompt."). The generator's call was the
# judge's longest: 30-55 s a question with the 1.5B, writing up to 417 tokens
# (bench/judge_speed.py); it could also drop or reword a claim.
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})[^`]*$")  # a fence line (```r), not ```x``` inline
_HEADING = re.compile(r"^\s*#{1,6}(\s|$)")
_RULE = re.compile(r"^\s*([-*_])(\s*\1){2,}\s*$")
_TABLE_DELIMITER = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
_QUOTE = re.compile(r"^\s*>\s?")
_ITEM = re.compile(r"^\s*(?:[-*+]\s+|(\d{1,3})[.)]\s+)")
_SOURCES_LABEL = re.compile(r"^(?:sources?|references?|citations?)\s*:?[\s,;.]*$", re.IGNORECASE)
_TRAILING_LABEL = re.compile(r"\s+(?:Sources?|References?|Citations?):\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# A citation in the forms generate reads too ([1, 3], [1-3], [ 7 ], [7,], [Sources 2, 3], 【7】):
# judged claims hold no citation, whichever way the model wrote it.
_CLAIM_ITEM = r"(?:sources?\s*)?\d+"
_CLAIM_MARK = rf"[\[【]\s*{_CLAIM_ITEM}(?:\s*[,，\u2013\u2014-]\s*{_CLAIM_ITEM})*\s*[,，]?\s*[\]】]"
_CLAIM_CITATIONS = re.compile(rf"(?<![\w\]\[])(?:{_CLAIM_MARK})+", re.IGNORECASE)
# The inside of each mark of a run, checked as generate checks a citation: "[0—1]" and
# "[2020-2021]" are a claim's text, and a "[0]" of its own (after no word) a citation.
_CLAIM_INSIDE = re.compile(r"[\[【]([^\]】]*)[\]】]")
# Emphasis is a pair of marks around text on one line ("**write access**", "*Windows*");
# a lone mark is text (2**3, *.R files).
_STRONG = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_EMPHASIS = re.compile(r"(?<![\w*])([*_])(?=[^\s*_])(.+?)(?<=[^\s*_])\1(?![\w*])")
_CITED_PARENTHESES = re.compile(  # "(see [1])": nothing but a citation in parentheses
    rf"\s*\(\s*(?:see\s+|cf\.?\s*)?(?:{_CLAIM_MARK}[\s,;]*)+\)", re.IGNORECASE
)
_LOOSE_PUNCTUATION = re.compile(r"\s+(?=[.,;:!?](?:\s|$))|(?:\s*,)+\s*(?=[.!?]?$)")


def _plain(text: str) -> str:
    """``text``'s prose without its citations and emphasis marks."""
    uncited = _CLAIM_CITATIONS.sub(
        lambda m: (
            ""
            if all(plausible_citation(x) or lone_zero(x) for x in _CLAIM_INSIDE.findall(m[0]))
            else m[0]
        ),
        text,
    )
    return _EMPHASIS.sub(r"\2", _STRONG.sub(r"\2", uncited))


def _prose(text: str) -> str:
    """``text`` with citations and emphasis taken out of its prose and the marks taken
    off its code spans (whose text stays as written)."""
    out: list[str] = []
    last = 0
    text = _CITED_PARENTHESES.sub("", text)
    for span in _CODE_SPAN.finditer(text):
        out.append(_plain(text[last : span.start()]))
        out.append(span.group(2).strip())
        last = span.end()
    out.append(_plain(text[last:]))
    return "".join(out)


def answer_claims(answer: str) -> list[str]:
    """``answer``'s sentences, as faithfulness judges them with
    ``eval.faithfulness_claims: sentences``: each once, in the order written."""
    blocks: list[str] = []  # paragraphs, list items, quotes, table rows; code joins one
    code: list[str] | None = None
    open_kind = ""  # what the last block is while a line may continue it: para, item, quote
    after_heading = False  # a heading ends the sentence before it
    for line in answer.splitlines():
        if _FENCE.match(line):
            if code is None:
                code = []
            else:
                if blocks:
                    blocks[-1] += " " + " ".join(code)
                else:
                    blocks.append(" ".join(code))
                code, open_kind = None, ""
            continue
        if code is not None:
            code.extend(line.split())
            continue
        if not line.strip() or _HEADING.match(line) or _RULE.match(line):
            open_kind = ""
            after_heading = after_heading or bool(line.strip())
            continue
        if _TABLE_DELIMITER.match(line):
            continue
        if line.lstrip().startswith("|"):  # a table row: its cells, one claim
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            blocks.append(_prose("; ".join(c for c in cells if c)))
            open_kind = ""
            continue
        quoted = _QUOTE.match(line)
        item = None if quoted else _ITEM.match(line)
        # A number other than 1 does not start a list inside a paragraph (CommonMark):
        # "The answer is\n2. That is the count." is one paragraph.
        if item and item.group(1) not in (None, "1") and open_kind == "para":
            item = None
        text = line[quoted.end() :] if quoted else line[item.end() :] if item else line
        text = _prose(text).strip()
        if _SOURCES_LABEL.match(text):  # the sources listed after the answer: no claim
            break
        text = _TRAILING_LABEL.sub("", text)
        if not text:
            continue
        broken = (  # a sentence a blank line or a code block broke
            bool(blocks)
            and not after_heading
            and not (quoted or item)
            and text[:1].islower()
            and not blocks[-1].rstrip().endswith((".", "!", "?", ":"))
        )
        kind = "quote" if quoted else "item" if item else "para"
        continues = open_kind != "" and not item and (kind == open_kind or kind == "para")
        if blocks and (continues or broken):
            blocks[-1] += " " + text
        else:
            blocks.append(text)
        after_heading = False
        open_kind = "quote" if quoted else ("item" if item else open_kind or "para")
    if code:  # a block the answer's end left open
        blocks.append(" ".join(code))
    pieces: list[str] = []
    for block in blocks:
        text = _LOOSE_PUNCTUATION.sub("", " ".join(block.split()))
        pieces.extend(_REFERENCE_SENTENCE.split(text))
    # A piece said again right after itself goes before short ones are joined ("- Free
    # software." twice); any other repeat after, so that a label said twice ("On macOS:")
    # still heads its own sentence.
    return _once(_joined(_once(pieces, in_a_row=True)))


def _once(texts: Sequence[str], *, in_a_row: bool = False) -> list[str]:
    """``texts`` without repeats (case aside), in order; with ``in_a_row``, only those
    right after themselves."""
    seen: set[str] = set()
    last = ""
    out: list[str] = []
    for text in texts:
        key = " ".join(text.casefold().split())
        if not key or key == last or (key in seen and not in_a_row):
            continue
        seen.add(key)
        last = key
        out.append(text)
    return out


# A judge that writes all of faithfulness's verdicts in one reply (a served one: it does
# not continue a reply it is given) writes each statement again, its reason and its
# verdict: at most STATEMENT_MAX_CHARS + REASON_MAX_CHARS characters and about 60 of JSON,
# at most about 150 tokens at 3 characters a token (the 1.5B wrote about 77 a verdict,
# bench/judge_speed.py). An answer of 20 statements (MAX_STATEMENTS allows 24) ran past
# eval.judge_max_tokens (1536) in one reply and was lost as cut JSON; its statements are
# asked in groups that fit one reply (``reply_groups``), each with the whole context.
VERDICT_TOKENS_MOST = 150

CLAIMS = ("sentences", "generated")  # the ways of eval.faithfulness_claims


def reply_groups(statements: Sequence[str], max_tokens: int) -> list[list[str]]:
    """``statements`` in order, in groups whose verdicts fit one reply of ``max_tokens``:
    VERDICT_TOKENS_MOST a statement, and a token for every 3 characters past
    STATEMENT_MAX_CHARS (an answer's own sentence is not bounded as ragas's statements are:
    a code listing ran to 766 characters), and fewer than MAX_STATEMENTS (a list at the
    grammar's bound fails); a statement alone is a group whatever its size."""
    groups: list[list[str]] = []
    room = 0.0
    for statement in statements:
        cost = VERDICT_TOKENS_MOST + max(0, len(statement) - STATEMENT_MAX_CHARS) / 3
        if not groups or cost > room or len(groups[-1]) == MAX_STATEMENTS - 1:
            groups.append([])
            room = float(max_tokens)
        groups[-1].append(statement)
        room -= cost
    return groups


def at_the_cap(reply: Any) -> str | None:
    """Why a judge's parsed JSON reply cannot be scored whole: a list in it holds exactly
    MAX_STATEMENTS items, the most the grammar allows, so it may have been cut there. None
    when no list is at the cap (a judge that ignores the bound and writes more is whole)."""
    pending = [reply]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, list) and len(item) == MAX_STATEMENTS:
                    return (
                        f"the judge's {key!r} list holds {MAX_STATEMENTS} items, the most its "
                        "grammar allows: it may be cut there, and a score over those items "
                        "would be said of more than was judged"
                    )
                pending.append(item)
        elif isinstance(value, list):
            pending += value
    return None


def bounded_reasons(schema: Any) -> Any:
    """``schema`` with the judge's replies bounded (see above): ``reason`` strings get a
    ``maxLength``, lists a ``maxItems`` and their string items a ``maxLength``. The
    original is not changed."""
    if isinstance(schema, list):
        return [bounded_reasons(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    bounded = {k: bounded_reasons(v) for k, v in schema.items()}
    reason = bounded.get("properties", {}).get("reason")
    if isinstance(reason, dict) and reason.get("type") == "string":
        bounded["properties"]["reason"] = {**reason, "maxLength": REASON_MAX_CHARS}
    if bounded.get("type") == "array":
        bounded["maxItems"] = MAX_STATEMENTS
        items = bounded.get("items")
        if isinstance(items, dict) and items.get("type") == "string":
            bounded["items"] = {**items, "maxLength": STATEMENT_MAX_CHARS}
    return bounded


# Faithfulness's verdicts repeat every statement word for word before judging it
# (ragas's NLIStatementOutput: statement, reason, verdict), and ragas scores whatever
# verdicts come back: the 1.5B judge, writing them all in one reply, gave 6 verdicts for 10
# statements (faithfulness over the 6, said of the answer; bench/judge_speed.py). A model
# that continues a reply it is given (llama.cpp's assistant prefill) is handed each
# statement inside the reply instead, read at prompt speed rather than written at ~10
# tokens/s, and writes only that statement's reason and verdict, one call per statement,
# under a grammar for just that: the same prompt, the same JSON, reason before verdict,
# one verdict per statement, and every verdict 0 or 1.
_VERDICTS_OPEN = '{\n    "statements": ['
_VERDICT_OPEN = '\n        {\n            "statement": %s,\n            "reason": "'
_VERDICTS_CLOSE = "\n    ]\n}"


def verdict_grammar(reason_chars: int) -> str:
    """GBNF for the rest of one verdict after its opening (``_VERDICT_OPEN``): a JSON
    string's characters, at most ``reason_chars``, then the verdict, 0 or 1."""
    string = r'char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})'
    verdict = r'"\",\n            \"verdict\": " [01] "\n        }"'
    return f"root ::= char{{0,{reason_chars}}} {verdict}\n{string}\n"


def verdict_reply(llm: LLM, prompt: str, statements: Sequence[str]) -> str:
    """Faithfulness's verdicts JSON for ``statements``, each statement copied into the
    reply and only its reason and verdict written by ``llm`` (one that continues a reply
    it is given). Raises ValueError if a verdict is cut at its token limit."""
    messages: list[dict[str, str]] = [{"role": "user", "content": prompt}]
    grammar = verdict_grammar(REASON_MAX_CHARS)
    most = REASON_MAX_CHARS + 32  # a reason's characters as tokens, and the rest
    reply = _VERDICTS_OPEN
    for number, statement in enumerate(statements):
        opened = reply + ("," if number else "")
        opened += _VERDICT_OPEN % json.dumps(statement, ensure_ascii=False)
        done = llm.chat([*messages, {"role": "assistant", "content": opened}],
                        grammar=grammar, max_tokens=most)  # fmt: skip
        if done.finish_reason == "length":
            raise ValueError(f"verdict {number + 1} cut at {most} tokens")
        written = done.text[len(opened) :] if done.text.startswith(opened) else done.text
        reply = opened + written
    return reply + _VERDICTS_CLOSE


def _adapters(llm: LLM, embedder: Embedder, max_tokens: int) -> tuple[Any, Any]:
    """ragpipe's LLM and Embedder behind ragas's InstructorBaseRagasLLM / BaseRagasEmbedding."""
    from ragas.embeddings.base import BaseRagasEmbedding
    from ragas.llms import InstructorBaseRagasLLM

    class JudgeLLM(InstructorBaseRagasLLM):
        def generate(self, prompt: str, response_model: type[M]) -> M:
            schema = bounded_reasons(response_model.model_json_schema())  # type: ignore[attr-defined]
            reply = llm.chat([{"role": "user", "content": prompt}], schema=schema,
                             max_tokens=max_tokens)  # fmt: skip
            if reply.finish_reason == "length":
                raise ValueError(
                    f"the judge's reply was cut at {max_tokens} tokens (eval.judge_max_tokens): "
                    "raise it, or judge with a model that writes less"
                )
            parsed: M = response_model.model_validate_json(reply.text)  # type: ignore[attr-defined]
            cut = at_the_cap(json.loads(reply.text))
            if cut is not None:
                raise ValueError(cut)
            return parsed

        async def agenerate(self, prompt: str, response_model: type[M]) -> M:
            return await asyncio.to_thread(self.generate, prompt, response_model)

        async def averdicts(self, prompt: str, statements: list[str], response_model: Any) -> Any:
            text = await asyncio.to_thread(verdict_reply, llm, prompt, statements)
            return response_model.model_validate_json(text)

    class JudgeEmbeddings(BaseRagasEmbedding):
        def embed_text(self, text: str, **kwargs: Any) -> list[float]:
            return [float(x) for x in embedder.embed_query(text)]

        async def aembed_text(self, text: str, **kwargs: Any) -> list[float]:
            return self.embed_text(text)

    return JudgeLLM(), JudgeEmbeddings()


async def each_verdict(
    ask: Callable[[str], tuple[int | None, str]], items: Sequence[str], what: str
) -> list[int]:
    """``ask``'s bare verdict on every one of ``items``, one call each, in order. Raises
    ValueError naming the first with none ("no verdict for <what> 2 of 3 in ..."): a
    score over the others would be said of all of them."""
    said = []
    for number, item in enumerate(items, start=1):
        verdict, text = await asyncio.to_thread(ask, item)
        if verdict is None:
            raise ValueError(f"no verdict for {what} {number} of {len(items)} in {text[:80]!r}")
        said.append(verdict)
    return said


class JudgeWindowExceeded(ValueError):
    """A judge call that does not fit the judge's window: its prompt leaves no room for its
    reply, or the reply filled what was left (a judge failure, never a score)."""


class Windowed(DelegatingLLM):
    """The judge model with every call held to its window (``context_size``: the embedded
    model's n_ctx, Ollama's num_ctx; none known for an OpenAI server, which refuses an
    over-long prompt itself). Only the generator's window was budgeted: ragas's NLI prompt
    is about 680 tokens beside up to generate.context_tokens (2800) of sources, and each
    verdict written into a prefilled reply adds 80-100 more, so after four or five
    statements a 4096-token window was passed: llama.cpp refused the call, and Ollama cut
    the prompt from its start in silence and its verdicts were scored.

    A call whose prompt leaves less room than its reply needs (its ``max_tokens``, at
    most one verdict's ``VERDICT_TOKENS_MOST``) is not made: ``JudgeWindowExceeded``.
    With that room but less than ``max_tokens``, the reply may take what is left; cut
    there, or a window Ollama says was full, it is ``JudgeWindowExceeded`` too."""

    def __init__(self, llm: LLM) -> None:
        super().__init__(llm)
        window = getattr(llm, "context_size", None)
        self.window = window if isinstance(window, int) else None

    def chat(self, messages: Sequence[Message], **options: Any) -> Completion:
        if self.window is None:
            return self.llm.chat(messages, **options)
        limit = int(options.get("max_tokens") or getattr(self.llm, "max_tokens", 0) or 0)
        prompt = sum(self.llm.count_tokens(str(m.get("content", ""))) for m in messages)
        room = self.window - prompt - PROMPT_MARGIN  # the chat template's own tokens
        if room < min(limit, VERDICT_TOKENS_MOST):
            raise JudgeWindowExceeded(
                f"the judge's prompt ({prompt} tokens) and its reply (up to {limit}) do not "
                f"fit its window of {self.window} tokens: not asked. Lower "
                "generate.context_tokens, or raise the judge's context_size (eval.judge, "
                "else llm)"
            )
        cut_short = limit > room
        if cut_short:
            options = {**options, "max_tokens": room}
        reply = self.llm.chat(messages, **options)
        if reply.window_full:
            raise JudgeWindowExceeded(
                f"the judge's window of {self.window} tokens was full (prompt {reply.tokens_in}"
                f" + reply {reply.tokens_out}): its prompt was probably cut from its start"
            )
        if cut_short and reply.finish_reason == "length":
            raise JudgeWindowExceeded(
                f"the judge's reply was cut at {room} tokens, what its window of "
                f"{self.window} left beside a {prompt}-token prompt. Lower "
                "generate.context_tokens, or raise the judge's context_size"
            )
        return reply


class Judge:
    """The four RAGAS metrics on one (question, answer, contexts, reference).

    Args:
        verdicts: How verdicts are asked (``eval.judge_verdicts``): ``statement``, one
            call a verdict for a bare verdict, as the calibration probe asks (faithfulness
            and context recall ``STATEMENT_PROMPT``, context precision ``CONTEXT_PROMPT``);
            ``ragas``, ragas's prompts, a reason before each verdict.
        claims: What faithfulness judges (``eval.faithfulness_claims``): ``sentences``,
            the answer's own (``answer_claims``); ``generated``, the statements ragas's
            generator writes from it.
        prefill: With ``ragas`` verdicts, each statement copied into the reply
            (``verdict_reply``); None: where the judge continues a reply it is given.
        questions: Questions answer relevancy generates from the answer (ragas's
            ``strictness``); None: 1 for a judge at temperature 0, whose questions are one
            question repeated, else ragas's 3.
    """

    def __init__(
        self,
        llm: LLM,
        embedder: Embedder,
        timeout_s: float,
        max_tokens: int,
        *,
        verdicts: str = "statement",
        claims: str = "sentences",
        prefill: bool | None = None,
        questions: int | None = None,
    ) -> None:
        llm = llm if isinstance(llm, Settling) else Settling(llm)
        self.llm = llm
        windowed = Windowed(llm)  # every call held to the judge's own window
        from ragas.metrics.collections import (
            AnswerRelevancy,
            ContextPrecision,
            ContextPrecisionWithoutReference,
            ContextRecall,
            Faithfulness,
        )
        from ragas.metrics.collections.faithfulness.util import (
            NLIStatementInput,
            NLIStatementOutput,
            StatementFaithfulnessAnswer,
        )
        from ragas.metrics.result import MetricResult

        if verdicts not in VERDICTS:
            raise ValueError(f"verdicts must be one of {VERDICTS}, not {verdicts!r}")
        if claims not in CLAIMS:
            raise ValueError(f"claims must be one of {CLAIMS}, not {claims!r}")
        prefill = getattr(llm, "continues_reply", False) if prefill is None else prefill
        way = verdicts

        class CheckedFaithfulness(Faithfulness):
            """ragas's faithfulness with one verdict per statement, or a failure: asked
            one statement a call (``ask_statement``), or ragas's way, the verdicts written
            by ``verdict_reply`` where ``prefill``; the claims judged are the answer's
            sentences (``answer_claims``) or ragas's generated statements (``claims``)."""

            async def _create_statements(self, question: str, response: str) -> list[str]:
                if claims == "sentences":
                    sentences = answer_claims(response)
                    if not sentences:
                        raise ValueError("the answer holds no sentence to judge")
                    return sentences
                return list(await super()._create_statements(question, response))

            async def _create_verdicts(
                self, statements: list[str], context: str
            ) -> NLIStatementOutput:
                if way == "statement":
                    verdicts = await each_verdict(
                        lambda s: ask_statement(windowed, context, s), statements, "statement"
                    )
                    return NLIStatementOutput(statements=[
                        StatementFaithfulnessAnswer(statement=s, reason="", verdict=v)
                        for s, v in zip(statements, verdicts, strict=True)
                    ])  # fmt: skip
                groups: list[tuple[list[str], NLIStatementOutput]] = []
                if prefill:
                    data = NLIStatementInput(context=context, statements=statements)
                    prompt = self.nli_statement_prompt.to_string(data)
                    written = await judge_llm.averdicts(prompt, statements, NLIStatementOutput)
                    groups.append((statements, written))
                else:  # in groups that fit one reply (VERDICT_TOKENS_MOST)
                    for group in reply_groups(statements, max_tokens):
                        groups.append((group, await super()._create_verdicts(group, context)))
                for asked, got in groups:
                    if len(got.statements) != len(asked):
                        raise ValueError(
                            f"{len(got.statements)} verdicts for {len(asked)} "
                            "statements: a score over some of them is not the answer's"
                        )
                return NLIStatementOutput(statements=[v for _, g in groups for v in g.statements])

        async def context_verdicts(question: str, answer: str, contexts: list[str]) -> list[int]:
            """Context precision's verdicts, one short call a context (``ask_context``)."""
            return await each_verdict(
                lambda c: ask_context(windowed, question, answer, c), contexts, "context"
            )

        class CheckedContextPrecision(ContextPrecision):
            """ragas's context precision (average precision over the contexts' usefulness
            to the reference), each context asked ``CONTEXT_PROMPT`` for a bare verdict
            with ``statement`` verdicts; ragas's prompt with ``ragas``."""

            async def ascore(  # type: ignore[override]
                self, user_input: str, reference: str, retrieved_contexts: list[str]
            ) -> MetricResult:
                if way != "statement":
                    return await super().ascore(user_input, reference, retrieved_contexts)
                said = await context_verdicts(user_input, reference, retrieved_contexts)
                return MetricResult(value=float(self._calculate_average_precision(said)))

        class CheckedContextPrecisionFree(ContextPrecisionWithoutReference):
            """The same, usefulness judged against the answer (no reference)."""

            async def ascore(  # type: ignore[override]
                self, user_input: str, response: str, retrieved_contexts: list[str]
            ) -> MetricResult:
                if way != "statement":
                    return await super().ascore(user_input, response, retrieved_contexts)
                said = await context_verdicts(user_input, response, retrieved_contexts)
                return MetricResult(value=float(self._calculate_average_precision(said)))

        class CheckedContextRecall(ContextRecall):
            """ragas's context recall (the share of the reference's sentences the contexts
            support), each sentence asked as faithfulness asks a statement, against the
            contexts joined as faithfulness joins them, with ``statement`` verdicts (the
            passage is then read once for both, from llama.cpp's prompt cache); ragas's
            one-reply classification with ``ragas``."""

            async def ascore(  # type: ignore[override]
                self, user_input: str, retrieved_contexts: list[str], reference: str
            ) -> MetricResult:
                if way != "statement":
                    return await super().ascore(user_input, retrieved_contexts, reference)
                context = "\n".join(retrieved_contexts)  # as ragas's faithfulness joins them
                verdicts = await each_verdict(
                    lambda s: ask_statement(windowed, context, s),
                    reference_sentences(reference),
                    "the reference's sentence",
                )
                return MetricResult(value=sum(verdicts) / len(verdicts))

        judge_llm, judge_embeddings = _adapters(windowed, embedder, max_tokens)
        self.timeout_s = timeout_s
        self.prefill = prefill
        self.verdicts = verdicts
        self.claims = claims
        greedy = getattr(llm, "temperature", None) == 0
        self.questions = questions or (1 if greedy else 3)
        self.faithfulness = CheckedFaithfulness(llm=judge_llm)
        self.answer_relevancy = AnswerRelevancy(
            llm=judge_llm, embeddings=judge_embeddings, strictness=self.questions
        )
        self.context_precision = CheckedContextPrecision(llm=judge_llm)
        self.context_precision_free = CheckedContextPrecisionFree(llm=judge_llm)
        self.context_recall = CheckedContextRecall(llm=judge_llm)
        metrics = (
            self.faithfulness,
            self.answer_relevancy,
            self.context_precision,
            self.context_precision_free,
            self.context_recall,
        )
        self.classes = [type(m).__name__ for m in metrics]

    @property
    def faithfulness_verdicts(self) -> str:
        """How faithfulness's verdicts are asked, in words (summary.json and report.md);
        context recall and precision ask the same way (``verdicts``)."""
        judged = "the answer's sentences" if self.claims == "sentences" else "ragas's statements"
        if self.verdicts == "statement":
            return f"statement prompt, one call a claim; claims: {judged}"
        asked = "ragas, prefilled" if self.prefill else "ragas, one reply"
        return f"{asked}; claims: {judged}"

    @property
    def context_verdicts(self) -> str:
        """How context recall's and context precision's verdicts are asked, in words."""
        if self.verdicts == "statement":
            return (
                "recall: statement prompt, one call a sentence of the reference; precision: "
                "context prompt, one call a context"
            )
        return "ragas's prompts"

    async def _one(self, metric: Any, name: str, **kwargs: Any) -> Judged:
        try:
            result = await asyncio.wait_for(metric.ascore(**kwargs), self.timeout_s)
        except TimeoutError:
            return Judged(None, FAILED, await timed_out(self.llm, self.timeout_s))
        except Exception as exc:  # unparseable judge output, validation errors
            return Judged(None, FAILED, f"{type(exc).__name__}: {str(exc)[:300]}")
        value = getattr(result, "value", result)
        try:
            score = float(value)
        except (TypeError, ValueError):
            return Judged(None, FAILED, f"non-numeric score {value!r}")
        if math.isnan(score):
            return Judged(None, FAILED, "the judge produced no score (NaN)")
        low, high = SCORE_RANGE.get(name, (0.0, 1.0))
        if not low - 1e-9 <= score <= high + 1e-9:
            return Judged(
                None, FAILED, f"score {score:g} outside [{low:g}, {high:g}]: malformed verdicts"
            )
        return Judged(score, OK)

    async def judge(self, row: RagRow, item: GoldenItem) -> None:
        q, a, ctx = item.query, row.answer, row.contexts
        no_text = NO_TEXT in row.flags or is_empty(a, len(ctx))  # as score_answer reads it
        ref = (item.expected_answer or "").strip() or None  # blank: no reference
        if not item.answerable:
            reason = "answerable: false (scored by refusal)"
            row.judged.update({m: Judged(None, NOT_APPLICABLE, reason) for m in RAG_METRICS})
            return
        if not ctx:
            # No context: none of the reference is in it, and no chunk of it is useful, so
            # context recall and precision are 0 by their definitions (ragas's too), not "not
            # applicable": the worst retrievals must not leave the means' denominators.
            # The answer ("not found") is still judged for relevancy; it makes no claim.
            reason = (
                "below the relevance floor: the model was not asked"
                if BELOW_FLOOR in row.flags
                else "nothing was retrieved"
            )
            empty = f"{reason}: no context"
            row.judged["faithfulness"] = Judged(None, NOT_APPLICABLE, reason)
            no_ref = Judged(None, NOT_APPLICABLE, "no expected_answer")
            row.judged["context_recall"] = Judged(0.0, OK, empty, asked=False) if ref else no_ref
            row.context_precision_kind = "with_reference" if ref else "without_reference"
            row.judged["context_precision"] = Judged(0.0, OK, empty, asked=False)
            row.judged["answer_relevancy"] = await self._one(
                self.answer_relevancy, "answer_relevancy", user_input=q, response=a
            )
            return
        if row.not_found:
            row.judged["faithfulness"] = Judged(None, NOT_APPLICABLE, "'not found' makes no claim")
        elif no_text:  # no judge call can fail on it: the generator's, not the judge's
            row.judged["faithfulness"] = Judged(None, NOT_APPLICABLE, EMPTY_ANSWER)
        elif reads_as_refusal(a):  # its one claim is about the sources, not from them
            row.judged["faithfulness"] = Judged(
                None, NOT_APPLICABLE, "the reply says the sources lack the answer: no claim "
                "about them"
            )  # fmt: skip
        else:
            row.judged["faithfulness"] = await self._one(
                self.faithfulness, "faithfulness", user_input=q, response=a, retrieved_contexts=ctx
            )
        if ref:  # right after faithfulness: the same passage, read from the prompt cache
            row.judged["context_recall"] = await self._one(
                self.context_recall,
                "context_recall",
                user_input=q,
                retrieved_contexts=ctx,
                reference=ref,
            )
        row.judged["answer_relevancy"] = (
            Judged(0.0, OK, EMPTY_ANSWER, asked=False)  # nothing answers the question
            if no_text
            else await self._one(
                self.answer_relevancy, "answer_relevancy", user_input=q, response=a
            )
        )
        if ref:
            row.context_precision_kind = "with_reference"
            row.judged["context_precision"] = await self._one(
                self.context_precision,
                "context_precision",
                user_input=q,
                reference=ref,
                retrieved_contexts=ctx,
            )
        else:
            row.context_precision_kind = "without_reference"
            row.judged["context_precision"] = await self._one(
                self.context_precision_free,
                "context_precision",
                user_input=q,
                response=a,
                retrieved_contexts=ctx,
            )
            row.judged["context_recall"] = Judged(None, NOT_APPLICABLE, "no expected_answer")


_NAN = float("nan")
_REFUSAL = answers.normalize_answer(NOT_FOUND)
# An empty reply (a served thinking model's empty content): the generator failed, not the
# judge (ragas's empty-response check read as a judge failure, and withheld faithfulness).
EMPTY_ANSWER = "the answer is empty: the generator wrote nothing (or citations alone)"


def is_empty(text: str, given: int = 0) -> bool:
    """No word in the answer: "", or citations alone with marks around them ("[1]", "[1].",
    "— [1]", "**[1]**", which scored citation precision and recall 1.0): generate's
    ``no_answer_text``, the test that flags it (``given``: the number of sources)."""
    return no_answer_text(text, given)


def is_refusal(text: str) -> bool:
    """The answer is the not-found sentence alone (``[n]`` citations and case aside)."""
    return answers.normalize_answer(without_citation_marks(text)) == _REFUSAL


# A reply that says the sources lack the answer in other words than the not-found sentence
# ("The provided documents do not contain this information [1].", "Not found in the
# sources.", "None of the sources mention this."). The sources are named as such, with an
# article ("the sources", not "open source", "source()" or "provided by"), next to the
# negation, so that answers about files not found or packages built from source are not
# taken for refusals.
_THE_SOURCES = (
    r"(?:the|these|those|your|my)\s+(?:provided\s+|given\s+|retrieved\s+|available\s+)?"
    r"(?:documents?|sources?|context|passages?|texts?|excerpts?)\b(?:\s+provided|\s+given)?"
    # ... and not a thing named after them: "the sources list", "the source tree"
    r"(?!\s*(?:\.list|lists?|code|trees?|files?|director(?:y|ies)|folders?|packages?|menus?)\b)"
)
_SAYS = r"(?:contain|mention|include|provide|cover|say|state|specify|give|answer|address|discuss)"
_LACKS = re.compile(
    "|".join(
        [
            rf"\b{_THE_SOURCES}\s+(?:do|does|did)\s*(?:n[o']t|not)\s+{_SAYS}",
            rf"\bnone\s+of\s+{_THE_SOURCES}\s+{_SAYS}s?\b",
            rf"\bno\s+(?:provided\s+|given\s+)?(?:documents?|sources?|passages?)\s+{_SAYS}s?\b",
            r"\bnot\s+(?:be\s+)?(?:found|mentioned|given|provided|stated|covered|specified|"
            rf"addressed|answered)\s+(?:in|by|within|among)\s+{_THE_SOURCES}",
            rf"\b(?:is|are)\s*(?:n[o']t|not)\s+(?:in|among)\s+{_THE_SOURCES}",
            # "I could not find ...", not "if apt cannot find a package in the sources"
            r"\b(?:i|we)\s+(?:could|can|cannot|can't|couldn't)\s*(?:not\s+)?"
            r"(?:find|answer|determine)\b"
            rf".{{0,60}}?\b(?:in|from|using)\s+{_THE_SOURCES}",
            rf"\bno\s+(?:relevant\s+)?information\b.{{0,60}}?\b(?:in|from)\s+{_THE_SOURCES}",
            r"^no\s+(?:relevant\s+)?information\s+(?:was|is)\s+(?:found|available|given)\b",
            r"^i\s+(?:do\s*(?:n[o']t|not)|don't)\s+know\b",
            # "I cannot answer this question.", a clause of its own ("if I cannot answer,
            # ..." goes on to say something)
            r"^(?:i|we)\s+(?:cannot|can't|can\s+not|could\s*not|couldn't|am\s+unable\s+to|"
            r"am\s+not\s+able\s+to|are\s+unable\s+to)\s+(?:answer|determine)\b",
        ]
    ),
    re.IGNORECASE,
)
# A sentence ends at . ! ? before a capital letter or the end ("e.g. the FAQ" goes on), or
# at a line break.
_SENTENCE_CUT = re.compile(r"[.!?]+(?=\s+[A-Z]|\s*$)|\n")
# Within a sentence, a clause ends at ";", a colon before a space ("10:30" goes on), a dash,
# or a word that sets one statement against another: "but" (not "nothing but"), "however"
# (not set off by commas on both sides: "they do not say, however, how long" is one),
# "although", "though", "yet".
_CLAUSE_CUT = re.compile(
    r"[;—]|:(?=\s|$)|\s[–-]\s|\b(?<!nothing\s)(?<!anything\s)but\b"
    r"|\bhowever\b(?:(?<!,\showever)|(?!,))|\b(?:although|though|yet)\b",
    re.IGNORECASE,
)
# "Although the documents do not say why, Ada Lovelace wrote ...": the clause that opens
# with "although" ends at its comma, and what follows is a statement of its own.
_FRONTED = re.compile(r"^\W*(?:even\s+)?(?:although|though)\b([^,]*),", re.IGNORECASE)
# Words that state nothing: "I'm sorry, but ...", "Unfortunately, ...", "Note: ...".
_FILLER = re.compile(
    r"^(?:(?:(?:i\s*(?:'m|am)|we\s*(?:'re|are))\s+)?(?:sorry|afraid)|unfortunately|"
    r"regrettably|(?:my\s+)?apologies|note|answer|response|so|and|also|therefore|thus|hence)"
    r"\b[\W_]*",
    re.IGNORECASE,
)


def _clauses(prose: str) -> list[str]:
    """The clauses of ``prose`` that say something (``_SENTENCE_CUT``, ``_CLAUSE_CUT``,
    ``_FRONTED``), each on one line, the words that state nothing taken off its start
    (``_FILLER``); a clause of no letter or digit is none."""
    pieces: list[str] = []
    for sentence in _SENTENCE_CUT.split(prose):
        fronted = _FRONTED.match(sentence)
        if fronted is not None:
            pieces.append(fronted[1])
            sentence = sentence[fronted.end() :]
        pieces += _CLAUSE_CUT.split(sentence)
    said = []
    for piece in pieces:
        clause = " ".join(piece.split())
        while (start := _FILLER.match(clause)) is not None and start.end() > 0:
            clause = clause[start.end() :]
        if re.search(r"[^\W_]", clause):
            said.append(clause)
    return said


def reads_as_refusal(text: str) -> bool:
    """A reply (citations aside) that says the sources lack the answer, in other words than
    the not-found sentence, and says nothing else: each of its clauses that says something
    says the sources lack it or that the answer cannot be given ("The provided documents do
    not mention France. I cannot answer this question."). Neither an answer nor a refusal in
    the required form, so the refusal metrics cannot score it (``score_answer``). A reply
    with any other claim is an answer, in part or outside the sources: "Bake at 230 C [1];
    the documents do not say how long.", "The documents do not mention France, but its
    capital is Paris." A clause is cut at a sentence's end, a line break, ";", ":", a dash,
    "but", "however", "although", "though" and "yet" (``_clauses``)."""
    if is_refusal(text):
        return False
    said = _clauses(without_citation_marks(text))
    return bool(said) and all(_LACKS.search(clause) for clause in said)


def supporting(source_payloads: dict[int, dict[str, Any]], item: GoldenItem) -> set[int]:
    """Numbers of the given sources that hold a golden target: a chunk target of grade > 0
    when the item has chunk targets (a grade-0 one marks a distractor, never support), else
    a relevant file (grade > 0)."""
    if item.chunks:
        graded = [t for t in item.chunks if t.grade > 0]
        return {n for n, p in source_payloads.items() if any(t.matches(p) for t in graded)}
    files = [s for s, g in item.relevance.items() if g > 0]
    return {
        n
        for n, p in source_payloads.items()
        if any(file_matches(str(p.get("file_path", "")), f) for f in files)
    }


def _held_targets(
    by_number: dict[int, dict[str, Any]], support: set[int], item: GoldenItem
) -> dict[int, set[str]]:
    """Per supporting source, the targets it holds: chunk targets (grade > 0) by key, or,
    for file targets, its file. A section cut into several chunks given as sources is one
    target: citing the chunk that answers is all of it (recall was 1/3 for one of three)."""
    if item.chunks:
        graded = [t for t in item.chunks if t.grade > 0]
        return {n: {t.key for t in graded if t.matches(by_number[n])} for n in support}
    return {n: {str(by_number[n].get("file_path", ""))} for n in support}


def score_answer(
    item: GoldenItem, reply: Answer, hits: Sequence[Retrieved], embedder: Embedder | None
) -> tuple[dict[str, Judged], list[dict[str, Any]], list[int], float]:
    """The judge-free metrics of one answer, the sources as the report shows them, the
    cited numbers and the answer's repetition share.

    A refusal is an answer that is the not-found sentence and nothing else (citations
    aside); ``answer`` shows one that adds the sentence to claims as the sentence alone
    (``answer_withdrawn``), so it is scored as the refusal the user saw. A short reply that
    says the sources lack the answer in other words (``reads_as_refusal``) is neither:
    its refusal metric fails (null, counted, with the reason), never a 0 or 1. Not
    applicable (null, with the reason): correctness without ``expected_answer``; citations
    on refusals, such replies and ``answerable: false`` items; precision with nothing
    cited, recall with no given source holding a target; ``false_refusal`` on unanswerable
    items and where no given source holds a target (refusing is then right: the miss is
    retrieval's); ``correct_refusal`` on answerable items.

    A target is held by a source when the text the model was given holds it (a source cut
    to the context budget may not). When the relevance floor answered "not found" without
    asking the model, the retrieved hits stand for the sources: a target among them makes
    the refusal a false one. Items whose targets are files only (no chunk targets) count
    citation recall by file: citing one chunk of each relevant file given is all of it.
    """
    na = NOT_APPLICABLE
    payloads = {h.point_id: h.payload for h in hits}
    # What the model read: each source's own text (cut to the budget), not the whole chunk.
    by_number = {s.number: {**payloads[s.point_id], "text": s.text} for s in reply.sources}
    support = supporting(by_number, item) if item.answerable else set()
    unasked = BELOW_FLOOR in reply.flags
    if unasked and item.answerable:  # the floor refused before any source was given
        support = supporting({n: h.payload for n, h in enumerate(hits, start=1)}, item)
    cited = [s.number for s in reply.cited] + list(reply.invalid_citations)
    sources = [
        {"number": s.number, "file": s.file_path, "heading": s.heading, "page": s.page,
         "holds_target": s.number in support, "cited": s.number in cited}
        for s in reply.sources
    ]  # fmt: skip
    scores: dict[str, Judged] = {}
    expected = item.expected_answer
    refused = is_refusal(reply.text)
    hedged = reads_as_refusal(reply.text)
    empty = NO_TEXT in reply.flags or is_empty(reply.text, len(reply.sources))
    if expected and item.answerable and (refused or hedged or empty):
        # Abstaining on an answerable question is no part of its answer (SQuAD v2's rule):
        # "Not found in the provided documents." shared "in" and "the" with answers (F1 0.2),
        # a hedge too ("Not found in the sources.": 0.333), and "" embedded (cosine 0.26).
        why = (EMPTY_ANSWER if empty else "the answer is a refusal" if refused
               else "the reply says the sources lack the answer")  # fmt: skip
        for m in ("answer_f1", "answer_rouge_l", "answer_cosine"):
            scores[m] = Judged(0.0, OK, why)
    elif expected and item.answerable:
        # A "[1]" is no word of the answer (code such as "x[1]" is, as generate reads it).
        prose = without_citation_marks(reply.text, len(reply.sources))
        scores["answer_f1"] = Judged(answers.token_f1(prose, expected), OK)
        scores["answer_rouge_l"] = Judged(answers.rouge_l(prose, expected), OK)
        if embedder is not None:
            cos = answers.cosine(embedder.embed_query(prose), embedder.embed_query(expected))
            scores["answer_cosine"] = Judged(cos, OK)
        else:
            scores["answer_cosine"] = Judged(None, na, "no embedder")
    else:
        why = "answerable: false" if not item.answerable else "no expected_answer"
        for m in ("answer_f1", "answer_rouge_l", "answer_cosine"):
            scores[m] = Judged(None, na, why)
    if not item.answerable or refused or hedged or empty:
        why = (
            "answerable: false" if not item.answerable
            else "the answer is a refusal" if refused
            else f"{EMPTY_ANSWER}: its citations back no claim" if empty
            else "the reply says the sources lack the answer: its citations back no claim"
        )  # fmt: skip
        scores["citation_precision"] = Judged(None, na, why)
        scores["citation_recall"] = Judged(None, na, why)
    else:
        given = [s.number for s in reply.sources]
        # A source cited for a sentence another given source holds (generate's
        # misattributed_citation) is a wrong citation, whatever it holds: it read 1.0.
        wrong = {n for miss in attribution_misses(reply.text, reply.sources) for n in miss.cited}
        precision, recall = answers.citation_scores(cited, support, given, wrong=wrong)
        if support:  # recall counts targets: citing one source of a target is citing it
            holds = _held_targets(by_number, support, item)
            needed = set().union(*holds.values())
            recall = len(set().union(*(holds[n] for n in cited if n in holds))) / len(needed)
        scores["citation_precision"] = (
            Judged(precision, OK) if precision is not None else Judged(None, na, "nothing cited")
        )
        scores["citation_recall"] = (
            Judged(recall, OK)
            if recall is not None
            else Judged(None, na, "no given source holds a golden target")
        )
    unformed = Judged(
        None, FAILED, "the reply says the sources lack the answer, but not with the "
        f"not-found sentence ({NOT_FOUND!r}): neither an answer nor a refusal to score",
    )  # fmt: skip
    if empty:  # no reply at all ("", or citations alone): neither a refusal nor an answer
        unformed = Judged(None, FAILED, EMPTY_ANSWER)
        hedged = True
    if item.answerable:
        scores["correct_refusal"] = Judged(None, na, "answerable item")
        if empty:  # the generator's failure, counted whether or not a source held a target
            scores["false_refusal"] = unformed
        elif not support:
            held = "retrieved hit" if unasked else "given source"
            scores["false_refusal"] = Judged(None, na, f"no {held} holds a golden target")
        else:
            scores["false_refusal"] = unformed if hedged else Judged(float(refused), OK)
    else:
        scores["correct_refusal"] = unformed if hedged else Judged(float(refused), OK)
        scores["false_refusal"] = Judged(None, na, "answerable: false")
    # A loop the answer was withdrawn from is still the model's loop.
    # A list copied from a source is that source's, not a loop, as the answer's own check has
    # it (generate.answer): the metric reads the same sources, neighbouring chunks joined.
    looped = DEGENERATE in reply.flags or answers.is_degenerate(
        reply.withdrawn or reply.text, sources=copy_texts(reply.sources)
    )
    scores["degenerate"] = Judged(float(looped), OK)
    return scores, sources, cited, answers.repetition_share(reply.text)


# Judge calls for one question besides the short verdicts: faithfulness's statements
# (with faithfulness_claims: generated), answer relevancy (one question at temperature
# 0), context precision (one per context, 5; with judge_verdicts: ragas a reason each) and,
# with ragas, context recall's one reply: 8 at most (``judge_calls``). The bare verdicts on
# each claim and on each sentence of the reference (read mostly from the prompt cache:
# 1.5-2.5 s each with the 1.5B) come on top, so the estimate printed from this count is a
# floor.
JUDGE_CALLS_PER_ITEM = 8


def judge_calls(verdicts: str, claims: str) -> int:
    """Judge calls for one question besides the short verdicts (``JUDGE_CALLS_PER_ITEM``)."""
    return JUDGE_CALLS_PER_ITEM - (claims == "sentences") - (verdicts == "statement")


def _check_label_ranges(labels: dict[str, dict[str, float]], source: object) -> None:
    """ConfigError for a judged metric's label outside that metric's range."""
    for m, by_item in labels.items():
        low, high = SCORE_RANGE.get(m, (0.0, 1.0))
        outside = [(i, v) for i, v in by_item.items() if not low <= v <= high]
        if m in RAG_METRICS and outside:
            item, label = outside[0]
            raise ConfigError(
                f"{source}: the label of {m} for item {item!r} is {label:g}, outside the "
                f"metric's range [{low:g}, {high:g}]; fix the value"
            )


def run_rag_eval(
    config: RagpipeConfig,
    golden: GoldenSet,
    *,
    name: str | None = None,
    limit: int | None = None,
    sample: int | None = None,
    retriever: Retriever | None = None,
    generator: LLM | None = None,
    judge_llm: LLM | None = None,
    embedder: Embedder | None = None,
    view: IndexView | None = None,
    progress: Callable[[int], None] | None = None,
) -> RagEvalResult:
    """Calibrate the judge, then retrieve, answer, score and judge the first ``limit``
    golden items (all when None).

    Args:
        view: The index as the golden check saw it; the judge's calibration probe is
            built from it (from the retriever's store when None).
    """
    items: Sequence[GoldenItem] = golden.items[:limit] if limit else golden.items
    selection = item_selection(len(golden.items), len(items), None, config.eval.seed)
    if sample and sample < len(items):
        items = stratified_sample(items, sample, config.eval.seed)
        selection = item_selection(len(golden.items), limit, len(items), config.eval.seed)
    embedder = embedder or make_embedder(config.embed, query_side=True)
    own = retriever is None
    retriever = retriever or Retriever(config, embedder=embedder, llm=generator)
    generator = generator or retriever.llm
    ev = config.eval
    judge_config = ev.judge
    judge_model = Settling(judge_llm or (make_llm(judge_config) if judge_config else generator))
    judge = Judge(judge_model, embedder, ev.judge_timeout_s, ev.judge_max_tokens,
                  verdicts=ev.judge_verdicts, claims=ev.faithfulness_claims)  # fmt: skip
    labels = labels_by_metric(load_labels(ev.labels)) if ev.labels else {}
    _check_label_ranges(labels, ev.labels)  # before a question is asked, not after them all
    for item in items:  # a question the model's window cannot hold, before the first
        source_budget(item.query, generator, config.generate.context_tokens, quiet=True)
    rows: list[RagRow] = []
    calibration: Calibration | None = None
    notes: list[str] = []
    try:
        if ev.judge_probe_size > 0:
            probe = build_probe(golden, view or IndexView(retriever.store), ev.judge_probe_size,
                                ev.seed)  # fmt: skip
            if len(probe) >= 4:
                probed = time.perf_counter()
                calibration = calibrate(Windowed(judge_model), probe,
                                        min_kappa=ev.judge_min_kappa,
                                        timeout_s=ev.judge_timeout_s,
                                        max_tokens=ev.judge_max_tokens,
                                        resamples=ev.resamples, seed=ev.seed,
                                        way=ev.judge_verdicts)  # fmt: skip
                if calibration.unreachable:  # every verdict of the run would fail the same way
                    raise StageError(
                        f"the judge {judge_model.name} answered no calibration probe call, "
                        f"{calibration.failures()}: stopped before any question was answered; "
                        "check that the judge is served and reachable (eval.judge, else llm), "
                        "or raise eval.judge_timeout_s if its calls timed out"
                    )
                per_call = (time.perf_counter() - probed) / len(probe)
                calls = judge_calls(ev.judge_verdicts, ev.faithfulness_claims)
                expected = len(items) * (1 + calls) * per_call
                logger.warning(  # shown by the CLI too: the run may take long
                    "expected duration: more than %s for %d question(s): each is one answer "
                    "and about %d judge calls, and a model call took %.1f s on the "
                    "calibration probe, whose calls read one chunk at most (answers and judge "
                    "calls read the sources: on the sample index, 13 min was said of a run "
                    "of 45 min); an estimate from the first question follows it",
                    _duration(expected),
                    len(items), calls, per_call,
                )  # fmt: skip
                contexts = calibration.by_judgement.get(CONTEXTS)
                if contexts is None or contexts.n < TRUSTABLE_PAIRS:
                    notes.append(
                        f"the calibration probe has {contexts.n if contexts else 0} context "
                        f"pair(s), fewer than {TRUSTABLE_PAIRS}: context precision cannot be "
                        "calibrated (each pair needs an answerable item whose target chunk of "
                        "12+ words holds half its expected_answer's words, and a third of "
                        f"eval.judge_probe_size {ev.judge_probe_size}, rounded down to even, "
                        f"must be {TRUSTABLE_PAIRS} or more: 18 pairs or more)"
                    )
            else:
                notes.append(
                    f"the calibration probe needs at least 4 pairs; the golden set and index "
                    f"gave {len(probe)} (items need target chunks with sentences of 6+ words)"
                )
        for item in items:
            hits = retriever.search(item.query).hits
            started = time.perf_counter()
            reply = configured_answer(
                item.query, hits, generator, config.generate, embedder_name(config.embed)
            )
            row = RagRow(
                item.id,
                item.query,
                reply.text,
                is_refusal(reply.text),  # the not-found sentence alone (as shown)
                [s.text for s in reply.sources],
                len(reply.cited),
                reply.invalid_citations,
                reply.tokens_in,
                reply.tokens_out,
                time.perf_counter() - started,
                answerable=item.answerable,
                flags=list(reply.flags),
                withdrawn=reply.withdrawn,
            )
            scores, row.sources, row.cited_numbers, row.repetition = score_answer(
                item, reply, hits, embedder
            )
            answered = time.perf_counter()
            asyncio.run(judge.judge(row, item))
            row.judged.update(scores)
            rows.append(row)
            if progress is not None:
                progress(1)
            logger.info("question %d of %d (%s): answered in %.0f s, judged in %.0f s",
                        len(rows), len(items), item.id, answered - started,
                        time.perf_counter() - answered)  # fmt: skip
            if len(rows) == 1 and len(items) > 1:  # the probe's estimate, corrected
                took = time.perf_counter() - started
                logger.warning(
                    "the first question took %.0f s (answer %.0f s, judge %.0f s): about %s "
                    "more for the other %d", took, answered - started,
                    took - (answered - started), _duration(took * (len(items) - 1)),
                    len(items) - 1,
                )  # fmt: skip
    finally:
        if own:
            retriever.close()
    result = _result(config, golden, name, rows, judge, judge_model, generator, calibration,
                     notes, labels)  # fmt: skip
    result.selection = selection
    return result


def item_selection(total: int, first: int | None, sampled: int | None, seed: int) -> str:
    """Which of a golden set's ``total`` items a run scored, in words: all of them, the
    ``first`` (``--limit``), or a sample of ``sampled`` of those (``--sample``, by ``seed``)."""
    pool = f"the first {first} of {total} items" if first and first < total else ""
    if sampled:
        among = pool or f"{total} items"
        return (f"a sample of {sampled} of {among} (seed {seed}; every item equally likely, "
                "strata in proportion)")  # fmt: skip
    return pool + " (--limit)" if pool else f"all {total} items"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _result(
    config: RagpipeConfig,
    golden: GoldenSet,
    name: str | None,
    rows: list[RagRow],
    judge: Judge,
    judge_model: LLM,
    generator: LLM,
    calibration: Calibration | None,
    notes: list[str],
    labels: dict[str, dict[str, float]],
) -> RagEvalResult:
    """Means with CIs over the scored items, counts, the headline flags, PPI estimates."""
    ev = config.eval
    summary: dict[str, Interval] = {}
    counts: dict[str, dict[str, int]] = {}
    for m in ALL_RAG_METRICS:
        scored = [r.judged[m].value for r in rows if r.judged[m].status == OK]
        summary[m] = bootstrap_ci([v for v in scored if v is not None], ev.resamples, ev.seed)
        counts[m] = {s: sum(1 for r in rows if r.judged[m].status == s)
                     for s in (OK, FAILED, NOT_APPLICABLE)}  # fmt: skip
    flags: dict[str, str] = {}
    withheld: set[str] = set()
    for m in RAG_METRICS:
        reasons = []
        unasked = sum(1 for r in rows if r.judged[m].status == OK and not r.judged[m].asked)
        tried = counts[m][OK] - unasked + counts[m][FAILED]  # the judge's trials only
        if tried and counts[m][FAILED] / tried > ev.max_judge_failure_share:
            reasons.append(
                f"judge failed on {counts[m][FAILED]} of {tried} "
                f"(> {ev.max_judge_failure_share:.0%})"
            )
            withheld.add(m)
        trusted = calibration.reliable_for(m) if calibration is not None else None
        if trusted is None:
            reasons.append(calibration.short_for(m) if calibration else "judge not calibrated")
        elif not trusted:
            reasons.append(calibration.short_for(m) if calibration else "")
            withheld.add(m)
        if reasons:
            flags[m] = "; ".join(reasons)
    # An answer metric's failures are replies it cannot score (a refusal not in the required
    # form): its mean speaks for the rest only. Past the same share it is flagged (shown,
    # never a trend point); "correct refusal 1.000 (n=2, 8 failed)" read as a model that
    # refuses well.
    for m in ANSWER_METRICS:
        tried = counts[m][OK] + counts[m][FAILED]
        if tried and counts[m][FAILED] / tried > ev.max_judge_failure_share:
            flags[m] = (
                f"{counts[m][FAILED]} of {tried} could not be scored "
                f"(> {ev.max_judge_failure_share:.0%}): the mean is over the rest only"
            )
    # Answers the pipeline does not vouch for (UNTRUSTED_FLAGS): past the same share, the
    # answer metrics are withheld as a failing judge's are (degenerate counts loops itself).
    answer_flags = answer_flag_counts(rows, ev.max_judge_failure_share)
    if answer_flags["withheld"]:
        why = untrusted_reason(answer_flags)
        for m in ANSWER_METRICS:
            if m != "degenerate":
                flags[m] = f"{why}; {flags[m]}" if m in flags else why
                withheld.add(m)
    ppi: dict[str, PPIEstimate] = {}
    for m, by_item in labels.items():
        if m not in RAG_METRICS:
            judged = ", ".join(RAG_METRICS)
            notes.append(f"labels for {m!r} ignored: only judged metrics ({judged}) take them")
            continue
        low, high = SCORE_RANGE.get(m, (0.0, 1.0))
        # The judge's prediction per applicable item; a failed verdict predicts the range's
        # midpoint, a fixed rule, so the labelled rectifier still corrects it without bias.
        midpoint = (low + high) / 2
        predictions: dict[str, float] = {}
        for r in rows:
            if r.judged[m].status != NOT_APPLICABLE:
                score = r.judged[m].value
                predictions[r.item_id] = score if score is not None else midpoint
        known = {i: v for i, v in by_item.items() if i in predictions}
        if len(known) < len(by_item):
            notes.append(f"{len(by_item) - len(known)} label(s) of {m} are for items this run "
                         "did not judge (not in the run, or not applicable); left out")  # fmt: skip
        if known:
            # The judge's own mean and count are of its verdicts: the midpoints stand in for
            # failed ones inside the estimate only, and a withheld metric has no judge mean
            # (summary.json showed the unreliable judge's number, failures counted as 0.5).
            verdicts = [r.judged[m].value for r in rows  # not a 0 given without asking
                        if r.judged[m].status == OK and r.judged[m].asked]  # fmt: skip
            given = [float(v) for v in verdicts if v is not None]
            ppi[m] = dataclasses.replace(
                ppi_mean(m, predictions, known, bounds=(low, high)),
                judge_mean=sum(given) / len(given) if given and m not in withheld else _NAN,
                n_judged=len(given),
            )
            if len(known) < FEW_LABELS:
                notes.append(
                    f"only {len(known)} human label(s) of {m}: its intervals are wide and "
                    "cover less than 95% (simulated: about 78% at 2 labels, 89% at 5, 93% "
                    f"at 10, when the labels agree with the judge); label {FEW_LABELS}+ "
                    "items, ideally 30-100"
                )
    warnings = []
    if len(rows) < 50:
        warnings.append(
            f"only {len(rows)} queries (< 50): confidence intervals are wide"
            + (f", and below {MIN_CI_N} there are none" if len(rows) < MIN_CI_N else "")
        )
    filtered = filter_warning("the search", config.retrieve.model_dump())
    if filtered:  # items outside it read "no given source holds a golden target"
        warnings.append(filtered)
    failed = sum(counts[m][FAILED] for m in RAG_METRICS)
    if failed:
        warnings.append(f"{failed} judge call(s) failed; they are null, not 0 (see per_query)")
    warnings += untrusted_warnings(answer_flags)
    # Context precision is ragas's reference-based variant where an item has an
    # expected_answer and the reference-free one (against the generated answer) where it
    # has not: one mean over both, said with how many of each it holds.
    kinds = {kind: sum(1 for r in rows if r.judged["context_precision"].status == OK
                       and r.context_precision_kind == kind)
             for kind in ("with_reference", "without_reference")}  # fmt: skip
    if all(kinds.values()):
        warnings.append(
            f"context_precision is one mean over {kinds['with_reference']} item(s) judged "
            f"against expected_answer and {kinds['without_reference']} judged against the "
            "generated answer (no expected_answer: ragas's reference-free variant): two "
            "measures under one number; per_query.parquet's context_precision_kind says "
            "which is which"
        )
    judged_withheld = withheld & set(RAG_METRICS)
    if judged_withheld:  # each with its own reason: the judge failing, or not agreeing with truth
        warnings.append(
            "not shown as values and feeding no gate: "
            + "; ".join(f"{m} ({flags[m]})" for m in sorted(judged_withheld))
        )
    warnings += notes
    judge_info = {
        "model": judge_model.name,
        "temperature": (ev.judge or config.llm).temperature,
        "ragas": metadata.version("ragas"),
        "metric_classes": judge.classes,
        "faithfulness_verdicts": judge.faithfulness_verdicts,
        # which statement prompt (its question): runs before and after a change differ
        "statement_prompt": (
            STATEMENT_PROMPT.splitlines()[0] if judge.verdicts == "statement" else None
        ),
        "context_verdicts": judge.context_verdicts,
        # every prompt of ragpipe's own the judge may be asked (ragas's: "ragas" above)
        "prompts": hashlib.sha256(
            "\n".join((STATEMENT_PROMPT, CONTEXT_PROMPT, ANSWER_PROMPT)).encode()
        ).hexdigest()[:12],
        "answer_relevancy_questions": judge.questions,
        "embedder": embedder_name(config.embed),  # answer relevancy's cosine
        "timeout_s": ev.judge_timeout_s,
        "max_tokens": ev.judge_max_tokens,
        "counts": {m: counts[m] for m in RAG_METRICS},
        "context_precision_kinds": kinds,  # the scored items of each variant
        "calibration": calibration.as_dict() if calibration else None,
        "usable_for_gates": (
            calibration is not None and calibration.reliable and not judged_withheld
        ),
        "ppi": {m: e.as_dict() for m, e in ppi.items()},
        "labels": str(ev.labels) if ev.labels else None,
    }
    return RagEvalResult(
        name=name or f"{golden.name}-rag",
        golden=golden,
        rows=rows,
        summary=summary,
        counts=counts,
        judge=judge_info,
        generator=generator.name,
        warnings=warnings,
        resamples=ev.resamples,
        seed=ev.seed,
        flags=flags,
        withheld=withheld,
        calibration=calibration,
        ppi=ppi,
        answer_flags=answer_flags,
        generator_settings=generator_settings(config, generator),
    )


def generator_settings(config: RagpipeConfig, generator: LLM) -> dict[str, Any]:
    """The generator and the settings that make its answers, as summary.json's
    ``models.generator_settings`` holds them and report.md names them: its model, provider
    (from its identity, else llm.provider), temperature, seed, token limit and window (its
    own where it has them, else the llm section's), and the generate section's context
    budget, citation grammar (and whether the model takes one), relevance floor (as
    applied to the index's embedder) and loop stop. Answer metrics of runs that differ in
    any share no trend line (``run.generator_identity``)."""
    llm, gen = config.llm, config.generate

    def own(name: str, configured: Any) -> Any:
        value = getattr(generator, name, configured)
        ok = value is None or (isinstance(value, int | float) and not isinstance(value, bool))
        return value if ok else configured

    identity = getattr(generator, "identity", None)
    provider = identity.split(":", 1)[0] if isinstance(identity, str) else llm.provider.value
    return {
        "model": generator.name,
        "provider": provider,
        "temperature": own("temperature", llm.temperature),
        "seed": own("seed", llm.seed),
        "max_tokens": own("max_tokens", llm.max_tokens),
        "context_size": own("context_size", llm.context_size),
        "context_tokens": gen.context_tokens,
        "cite_grammar": gen.cite_grammar,
        "takes_grammar": bool(getattr(generator, "takes_grammar", False)),
        "min_relevance": relevance_floor(gen, embedder_name(config.embed)),
        "stop_looping": gen.stop_looping,
    }


def answer_flag_counts(rows: Sequence[RagRow], max_share: float) -> dict[str, Any]:
    """The answers' flags as summary.json's ``answer_flags`` holds them: how many answers
    carry each flag (every flag, in order of name), how many carry one of
    ``UNTRUSTED_FLAGS`` and each of those, their share, and whether that share is over
    ``max_share`` (eval.max_judge_failure_share), which withholds the answer metrics."""
    counts: dict[str, int] = {}
    for r in rows:
        for flag in set(r.flags):
            counts[flag] = counts.get(flag, 0) + 1
    untrusted = sum(1 for r in rows if set(r.flags) & UNTRUSTED_FLAGS.keys())
    share = untrusted / len(rows) if rows else 0.0
    return {
        "answers": len(rows),
        "counts": dict(sorted(counts.items())),
        "untrusted": untrusted,
        "untrusted_counts": {f: counts[f] for f in UNTRUSTED_FLAGS if f in counts},
        "untrusted_share": share,
        "max_share": max_share,
        "withheld": share > max_share,
    }


def untrusted_reason(answer_flags: dict[str, Any]) -> str:
    """What a withheld answer metric's cell says: "5 of 5 answers untrusted (window_full 5,
    truncated 5) (> 20%)"."""
    each = ", ".join(f"{f} {n}" for f, n in answer_flags["untrusted_counts"].items())
    return (
        f"{answer_flags['untrusted']} of {answer_flags['answers']} answers untrusted ({each}) "
        f"(> {answer_flags['max_share']:.0%})"
    )


def untrusted_warnings(answer_flags: dict[str, Any]) -> list[str]:
    """One warning per untrusted flag the answers carry ("5 of 20 answers window_full: ..."),
    and, past the share, one naming the answer metrics withheld."""
    total = answer_flags["answers"]
    said = [
        f"{n} of {total} answers {flag}: {UNTRUSTED_FLAGS[flag]}"
        for flag, n in answer_flags["untrusted_counts"].items()
    ]
    if answer_flags["withheld"]:
        shown = ", ".join(m for m in ANSWER_METRICS if m != "degenerate")
        said.append(
            f"not shown as values and no trend points: {shown} ({untrusted_reason(answer_flags)}"
            ": more than eval.max_judge_failure_share of the answers carry a flag the pipeline "
            "does not trust; degenerate is shown, as it counts loops itself; per_query.parquet "
            "keeps every score)"
        )
    return said
