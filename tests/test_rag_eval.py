"""RAG evaluation: real retrieval, real generation, the real ragas metrics judged by
the real SmolLM2; judge failures are null with a reason, never 0."""

from __future__ import annotations

import asyncio
import dataclasses
import html
import itertools
import json
import logging
import math
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from ragpipe.config import RagpipeConfig
from ragpipe.errors import ConfigError
from ragpipe.evaluation.golden import load_golden
from ragpipe.evaluation.rag import (
    ANSWER_METRICS,
    FAILED,
    NOT_APPLICABLE,
    OK,
    RAG_METRICS,
    run_rag_eval,
)
from ragpipe.evaluation.run import (
    RAG_QUERY_SCHEMA,
    GoldenInfo,
    rag_summary,
    rag_table,
    write_run,
)
from ragpipe.models.llm import Completion

pytestmark = pytest.mark.integration

GOLDEN = """
name: rag-mini
items:
  - id: oven
    query: How long should bread bake in the oven?
    expected_files: [bread.md]
    expected_answer: Bake the loaf at 230 degrees Celsius for thirty-five minutes.
  - id: lovelace
    query: Who wrote the first program for the Analytical Engine?
    expected_files: [computing.md]
"""


@pytest.fixture
def rag_config(indexed_edge: RagpipeConfig, tmp_path: Path) -> RagpipeConfig:
    golden = tmp_path / "golden.yaml"
    golden.write_text(GOLDEN, encoding="utf-8")
    evaluation = indexed_edge.eval.model_copy(
        update={
            "golden": golden,
            "reports_dir": tmp_path / "reports",
            "resamples": 200,
            "judge_max_tokens": 160,
        }
    )
    retrieve = indexed_edge.retrieve.model_copy(update={"top_k": 2})
    return indexed_edge.model_copy(update={"eval": evaluation, "retrieve": retrieve})


class Canned:
    """A judge that gives the same reply to every prompt."""

    def __init__(self, name: str, reply: str) -> None:
        self.name, self.reply = name, reply
        self.takes_grammar = False

    def chat(self, messages: Any, **kwargs: Any) -> Completion:
        return Completion(self.reply, 5, 5, self.name, 0.0)

    def count_tokens(self, text: str) -> int:
        return len(text) // 4


# Every reply cut off mid-JSON, as a small model's often is.
RAMBLER = Canned("rambler", '{"statements": ["an unfinished')
# Verdicts of 2, not 0 or 1, as a small model's sometimes are.
TWOS = Canned("twos", '{"reason": "useful", "verdict": 2}')


def test_judge_failures_are_null_with_reasons_not_zero(
    rag_config: RagpipeConfig, smollm: Any, tmp_path: Path
) -> None:
    golden = load_golden(rag_config.eval.golden)
    result = run_rag_eval(rag_config, golden, generator=smollm, judge_llm=RAMBLER)
    for row in result.rows:
        for m in RAG_METRICS:
            judged = row.judged[m]
            assert judged.value is None and judged.reason
            assert judged.status in (FAILED, NOT_APPLICABLE)
    lovelace = next(r for r in result.rows if r.item_id == "lovelace")
    assert lovelace.judged["context_recall"].status == NOT_APPLICABLE  # no expected_answer
    assert lovelace.context_precision_kind == "without_reference"
    assert "ValidationError" in (lovelace.judged["answer_relevancy"].reason or "")
    assert result.counts["answer_relevancy"] == {OK: 0, FAILED: 2, NOT_APPLICABLE: 0}
    assert result.summary["answer_relevancy"].n == 0  # nothing scored: no mean, not 0
    assert any("judge call(s) failed" in w for w in result.warnings)
    # No probe verdict either: the judge is unavailable (it was "unreliable, kappa -1.00"),
    # and its metrics are withheld saying so.
    assert result.calibration is not None and result.calibration.unavailable
    n = len(result.calibration.pairs)
    assert result.calibration.label().startswith(
        f"judge unavailable: {n} of {n} probe calls failed (first: no verdict in "
    )
    assert result.flags["faithfulness"].endswith(
        f"judge unavailable ({n} of {n} probe calls failed)"
    )
    assert result.withheld & set(RAG_METRICS) == set(RAG_METRICS)
    # SmolLM's answers may loop or run to max_tokens: past the share, the answer metrics
    # (degenerate aside) are withheld too, and only then.
    untrusted = set(ANSWER_METRICS) - {"degenerate"} if result.answer_flags["withheld"] else set()
    assert result.withheld - set(RAG_METRICS) == untrusted
    summary = rag_summary(result, rag_config, {"files": 5, "points": 0, "sha256": "x"})
    out = Path(write_run(summary, rag_table(result), tmp_path / "reports").report_dir)
    stored = pq.read_table(out / "per_query.parquet")
    assert stored.schema.equals(RAG_QUERY_SCHEMA)
    table = stored.to_pylist()
    assert all(r["answer_relevancy"] is None for r in table)
    assert table[0]["answer_relevancy_status"] == FAILED
    assert "| answer_relevancy | 0 | 2 | 0 |" in (out / "report.md").read_text()
    assert table[0]["contexts"] == result.rows[0].contexts
    # The drill-down shows each question's answer, contexts and judge reasons.
    page = (out / "report.html").read_text()
    drill = page[page.index("<h2>Worst 2 of 2 questions (untrusted answers first") :]
    assert drill.count("<details>") == 2
    assert "answer_relevancy: failed" in drill and "ValidationError" in drill
    assert html.escape(lovelace.answer) in drill
    assert "context_recall: not_applicable" in drill


def test_a_score_outside_the_metrics_range_is_a_failure_not_a_value(
    rag_config: RagpipeConfig, smollm: Any
) -> None:
    """With ragas's prompt (eval.judge_verdicts: ragas) ragas averages whatever verdicts come
    back: verdicts of 2 give an average precision of 2.0, a failure by its range. A bare
    verdict (the default) of 2 is no verdict at all, and says so."""
    golden = load_golden(rag_config.eval.golden)
    for way, reason in (
        ("ragas", "score 2 outside [0, 1]: malformed verdicts"),
        ("statement", "ValueError: no verdict for context 1 of 2 in "
                      "'{\"reason\": \"useful\", \"verdict\": 2}'"),
    ):  # fmt: skip
        evaluation = rag_config.eval.model_copy(update={"judge_verdicts": way})
        config = rag_config.model_copy(update={"eval": evaluation})
        result = run_rag_eval(config, golden, generator=smollm, judge_llm=TWOS)
        for row in result.rows:
            judged = row.judged["context_precision"]
            assert (judged.value, judged.status, judged.reason) == (None, FAILED, reason)
        assert result.counts["context_precision"] == {OK: 0, FAILED: 2, NOT_APPLICABLE: 0}


@pytest.mark.slow
def test_rag_eval_with_the_real_model_as_generator_and_judge(
    rag_config: RagpipeConfig, smollm: Any
) -> None:
    from ragpipe.evaluation.run import read_history, run_rag

    result, run = run_rag(rag_config.model_copy(
        update={"llm": rag_config.llm.model_copy(update={"max_tokens": 64})}))  # fmt: skip
    out = Path(run.report_dir)
    assert len(result.rows) == 2 and result.judge["model"] == "SmolLM2-135M-Instruct.Q4_1"
    assert result.judge["ragas"] == "0.4.3"
    # faithfulness asks one short call a statement; a greedy judge asks one question for
    # answer relevancy
    assert "CheckedFaithfulness" in result.judge["metric_classes"]
    assert result.judge["faithfulness_verdicts"] == (
        "statement prompt, one call a claim; claims: the answer's sentences"
    )
    assert result.judge["answer_relevancy_questions"] == 1
    for row in result.rows:
        assert row.contexts and row.tokens_out > 0
        for m in RAG_METRICS:
            judged = row.judged[m]
            if judged.status == OK:  # answer relevancy is a cosine similarity
                low = -1.0 if m == "answer_relevancy" else 0.0
                assert judged.value is not None and low <= judged.value <= 1.0
            else:
                assert judged.value is None and judged.reason
    counts = [result.counts[m] for m in RAG_METRICS]
    assert sum(c[OK] + c[FAILED] + c[NOT_APPLICABLE] for c in counts) == 8
    text = (out / "summary.json").read_text()
    assert text == json.dumps(run.as_json(), indent=2)  # the typed summary is the file's
    summary = json.loads(text)
    assert summary["kind"] == "rag"
    assert summary["judge"]["counts"] == {m: result.counts[m] for m in RAG_METRICS}
    # The packaged SmolLM2 is measured before it is believed.
    calibration = summary["judge"]["calibration"]
    assert calibration["n"] >= 4 and calibration["label"].startswith("judge ")
    assert summary["models"]["generator"] == summary["models"]["judge"]
    assert "<svg" in (out / "report.html").read_text()
    assert {r["variant"] for r in read_history(rag_config.eval.reports_dir)} == {"rag"}


@pytest.mark.slow
def test_rag_eval_with_an_ollama_generator_and_judge(
    rag_config: RagpipeConfig, smollm: Any
) -> None:
    from ragpipe.models.llm import OllamaLLM
    from tests.support.ollama_server import ollama_server

    golden = load_golden(rag_config.eval.golden)
    with ollama_server({}, {"smollm": smollm}) as (host, state):
        ollama = OllamaLLM("smollm", host=host, max_tokens=64)
        result = run_rag_eval(rag_config, golden, limit=1, generator=ollama, judge_llm=ollama)
    (row,) = result.rows
    assert row.answer and row.tokens_out > 0 and result.judge["model"] == "smollm"
    # Every metric is judged (the item has a reference), but faithfulness: not applicable
    # exactly when SmolLM answered with the not-found sentence (it makes no claim), which
    # its answer to this question sometimes is.
    for m in RAG_METRICS:
        expected = (NOT_APPLICABLE,) if m == "faithfulness" and row.not_found else (OK, FAILED)
        assert row.judged[m].status in expected, (m, row.judged[m], row.answer)
    chats = [r["body"] for r in state.requests if r["path"] == "/api/chat"]
    assert len(chats) >= 5  # the answer, then the judge's structured calls
    assert sum(1 for body in chats if isinstance(body.get("format"), dict)) == len(chats) - 1


# -- judge-free answer metrics, calibration, PPI, headlines --------------------------

SCORED = """
name: rag-scored
items:
  - id: oven
    query: How long should bread bake in the oven?
    chunks: [{file: bread.md, heading: Oven, grade: 3}]
    expected_answer: Bake the loaf at 230 degrees Celsius for thirty-five minutes.
  - id: lovelace
    query: Who wrote the first program for the Analytical Engine?
    chunks: [{file: computing.md, heading: Ada Lovelace}]
    expected_answer: Ada Lovelace wrote it in 1843.
  - id: backups
    query: How often is the database backed up?
    relevance: {ops/backups.md: 2, ops/backups-copy.md: 2}
  - id: miss
    query: How long should the dough be kneaded?
    chunks: [{file: computing.md, heading: Alan Turing}]
  - id: capital
    query: What is the capital of France?
    answerable: false
  - id: moon
    query: How far away is the Moon?
    answerable: false
"""


class Scripted:
    """A generator with a fixed reply per question (chosen by a word in it)."""

    name = "scripted"
    takes_grammar = False  # a scripted reply: nothing to constrain

    def __init__(self, replies: dict[str, str]) -> None:
        self.replies = replies

    def chat(self, messages: Any, **kwargs: Any) -> Completion:
        question = messages[-1]["content"].rsplit("Question:", 1)[-1]
        text = next(reply for word, reply in self.replies.items() if word in question)
        return Completion(text, 10, 10, self.name, 0.0)

    def count_tokens(self, text: str) -> int:
        return len(text) // 4


LOOP = "The answer to this question is: " * 10
SCRIPT = Scripted(
    {
        # 8 answer tokens after SQuAD normalisation vs 9 expected ones; [5] was never given.
        "bread": "Bake the loaf at 230 degrees for thirty-five minutes [1] [5].",
        "Analytical": LOOP,
        "database": "Not found in the provided documents.",
        # Text of its own, then the not-found sentence: withdrawn (the sentence alone, cited
        # as the grammar makes it, is a plain not found).
        "kneaded": "Knead it for ten minutes, I think. Not found in the provided documents. [2]",
        "France": "Paris is the capital of France [1].",
        "Moon": "Not found in the provided documents.",
    }
)
_NLI_INPUT = "Now perform the same with the following input\ninput: "


def verdicts_json(prompt: str, verdict: int) -> str:
    """The same verdict on every statement of ragas's faithfulness prompt (the statements
    read back from its input), as ragas's verdicts JSON; else ``{"verdict": ...}``."""
    if _NLI_INPUT not in prompt:
        return json.dumps({"verdict": verdict})
    given = json.loads(prompt.rsplit(_NLI_INPUT, 1)[1].rsplit("Output:", 1)[0])["statements"]
    said = [{"statement": s, "reason": "", "verdict": verdict} for s in given]
    return json.dumps({"statements": said})


class YesMan(Canned):
    """Says "yes" to everything, RAGAS prompts included."""

    def chat(self, messages: Any, **kwargs: Any) -> Completion:
        return Completion(verdicts_json(messages[0]["content"], 1), 5, 5, self.name, 0.0)


YES = YesMan("yes-man", "")


@pytest.fixture
def scored_config(rag_config: RagpipeConfig, tmp_path: Path) -> RagpipeConfig:
    golden = tmp_path / "scored.yaml"
    golden.write_text(SCORED, encoding="utf-8")
    evaluation = rag_config.eval.model_copy(update={"golden": golden})
    return rag_config.model_copy(update={"eval": evaluation})


def test_answer_metrics_refusals_and_an_unreliable_judge_end_to_end(
    scored_config: RagpipeConfig,
    onnx_embedder: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from ragpipe.evaluation.answers import repetition_share
    from ragpipe.evaluation.rag import judge_calls

    golden = load_golden(scored_config.eval.golden)
    with caplog.at_level(logging.WARNING, logger="ragpipe.evaluation.rag"):
        result = run_rag_eval(scored_config, golden, generator=SCRIPT, judge_llm=YES,
                              embedder=onnx_embedder)  # fmt: skip
    said = [r.getMessage() for r in caplog.records if r.name == "ragpipe.evaluation.rag"]
    # Before the first question, from the probe; after it, from what it took.
    assert re.fullmatch(r"expected duration: more than \d+ s for 6 question\(s\): each is "
                        r"one answer and about 6 judge calls, .*", said[0])  # fmt: skip
    assert re.fullmatch(r"the first question took \d+ s \(answer \d+ s, judge \d+ s\): "
                        r"about \d+ s more for the other 5", said[1])  # fmt: skip
    rows = {r.item_id: r for r in result.rows}
    # 8 besides the verdicts with ragas's statements and prompts, 6 by default
    assert (judge_calls("ragas", "generated"), judge_calls("statement", "sentences")) == (8, 6)
    assert (judge_calls("ragas", "sentences"), judge_calls("statement", "generated")) == (7, 7)

    def value(item: str, metric: str) -> float | None:
        return rows[item].judged[metric].value

    oven = rows["oven"]
    # The oven chunk is the best hit, so it is source [1] ("lost in the middle" keeps the best
    # first); [5] points at no source.
    assert oven.sources[0]["file"].endswith("kitchen/bread.md") and oven.sources[0]["holds_target"]
    assert oven.cited_numbers == [1, 5] and oven.invalid_citations == [5]
    # The answer is scored as shown: [5] (never given) is taken out of its text.
    assert rows["oven"].answer == "Bake the loaf at 230 degrees for thirty-five minutes [1]."
    # Scored without its citation markers ("[1]" is no word of the answer).
    # SQuAD tokens: answer  bake loaf at 230 degrees for thirtyfive minutes (8)
    #               expected bake loaf at 230 degrees celsius for thirtyfive minutes (9)
    # common 8: precision 8/8, recall 8/9, F1 16/17 (8/9 with the "1" counted).
    assert value("oven", "answer_f1") == pytest.approx(16 / 17)
    # ROUGE-L tokens (the article stays): answer  bake the loaf at 230 degrees for thirty five
    # minutes (10); expected ... degrees celsius for thirty five minutes (11); LCS 10:
    # precision 1, recall 10/11, F1 20/21.
    assert value("oven", "answer_rouge_l") == pytest.approx(20 / 21)
    assert 0.5 < (value("oven", "answer_cosine") or 0) <= 1.0
    # One of two citations holds the target ([5] was never given): precision 1/2; the one
    # source holding the target is cited: recall 1/1.
    assert value("oven", "citation_precision") == 0.5
    assert value("oven", "citation_recall") == 1.0
    assert value("oven", "false_refusal") == 0.0 and value("oven", "degenerate") == 0.0
    # The loop: flagged degenerate; nothing cited.
    assert value("lovelace", "degenerate") == 1.0
    assert rows["lovelace"].repetition == repetition_share(LOOP) == pytest.approx(52 / 58)
    assert value("lovelace", "citation_precision") is None
    assert rows["lovelace"].judged["citation_precision"].reason == "nothing cited"
    # A refusal of an answerable question is a false refusal, its citations not applicable;
    # no expected_answer: correctness not applicable.
    assert value("backups", "false_refusal") == 1.0
    assert rows["backups"].judged["citation_recall"].reason == "the answer is a refusal"
    assert rows["backups"].judged["answer_f1"].reason == "no expected_answer"
    # Refusing when no given source holds the target is right: a retrieval miss, not a
    # false refusal (and a cited refusal is still a refusal).
    assert rows["miss"].judged["false_refusal"].status == NOT_APPLICABLE
    assert rows["miss"].judged["false_refusal"].reason == "no given source holds a golden target"
    assert rows["miss"].not_found
    # Unanswerable: "Paris" is a missed refusal, the moon's refusal a correct one.
    assert value("capital", "correct_refusal") == 0.0 and value("moon", "correct_refusal") == 1.0
    for item in ("capital", "moon"):
        assert rows[item].judged["false_refusal"].status == NOT_APPLICABLE
        assert all(rows[item].judged[m].status == NOT_APPLICABLE for m in RAG_METRICS)
    s = result.summary
    assert (s["correct_refusal"].mean, s["correct_refusal"].n) == (0.5, 2)
    assert (s["false_refusal"].mean, s["false_refusal"].n) == (pytest.approx(1 / 3), 3)
    assert (s["degenerate"].mean, s["degenerate"].n) == (pytest.approx(1 / 6), 6)
    assert s["citation_precision"].n == 1 and not s["citation_precision"].has_ci
    assert result.counts["answer_f1"] == {OK: 2, FAILED: 0, NOT_APPLICABLE: 4}

    # The yes-man: a balanced probe, every verdict "yes": accuracy 1/2, kappa exactly 0.
    calibration = result.calibration
    assert calibration is not None and not calibration.reliable
    truths = [p.truth for p in calibration.pairs]
    assert len(truths) >= 4 and sum(truths) * 2 == len(truths)
    assert (calibration.agreement.accuracy, calibration.agreement.kappa) == (0.5, 0.0)
    assert calibration.agreement.yes_share == 1.0
    assert set(result.withheld) == set(RAG_METRICS) and not result.judge["usable_for_gates"]

    summary = rag_summary(result, scored_config, {"files": 5, "points": 0, "sha256": "x"})
    out = Path(write_run(summary, rag_table(result), tmp_path / "reports").report_dir)
    md = (out / "report.md").read_text()
    label = calibration.label()
    assert label.startswith("judge unreliable (kappa 0.00 ") and "min 0.4)" in label
    assert f"## Judged (RAGAS): {label}" in md
    for pair in calibration.pairs:  # every kind's truth in the probe table (was "?" for 7)
        assert f"| {pair.kind} | {'yes' if pair.truth else 'no'} | " in md
    for m in RAG_METRICS:  # a withheld metric shows why, never a number
        cell = md.split(f"| {m} | ")[1].split(" |")[0]
        assert cell.startswith("judge ") and "unreliable" in cell and "(n=" in cell
    assert "| correct_refusal | 0.500 (n=2, no CI: under 10, 4 n/a) |" in md
    assert "| citation_precision | 0.500 (n=1, no CI, 5 n/a) |" in md
    assert f"calibration: **{label}**" in md
    stored = json.loads((out / "summary.json").read_text())
    assert stored["metrics"]["rag"]["faithfulness"]["withheld"] is True
    assert stored["golden"]["selection"] == "all 6 items"
    assert "(6 queries: all 6 items; `" in md
    assert stored["judge"]["calibration"]["kappa"] == 0.0
    # Withheld numbers do not become trend points.
    from ragpipe.evaluation.run import read_history

    history = {r["metric"] for r in read_history(tmp_path / "reports")}
    assert "correct_refusal" in history and not history & set(RAG_METRICS)
    questions = f"questions {summary.golden.digest}"
    assert {r["scope"] for r in read_history(tmp_path / "reports")} == {
        f"all 6 items, top_k 2, {questions}"
    }
    # The drill-down: sources by file and heading, what held a target, what was cited.
    page = (out / "report.html").read_text()
    drill = page[page.index("<h2>Worst 6 of 6 questions") :]
    assert drill.index("Analytical Engine") < drill.index("capital of France")  # loop first
    assert "cites sources never given: [5]" in drill and "✓ holds a golden target" in drill
    assert "(answerable: false)" in drill and "degenerate: 1.000" in drill
    table = pq.read_table(out / "per_query.parquet").to_pylist()
    assert table[0]["source_files"][0].endswith("kitchen/bread.md")
    assert table[0]["cited_numbers"] == [1, 5] and table[0]["source_holds_target"][0] is True
    # The answer's flags and what a withdrawn answer said are kept beside it, and shown.
    by_item = {r["item_id"]: r for r in table}
    assert "degenerate" in by_item["lovelace"]["flags"] and by_item["oven"]["withdrawn"] is None
    assert by_item["miss"]["withdrawn"] == (
        "Knead it for ten minutes, I think. Not found in the provided documents. [2]"
    )
    assert "answer_withdrawn" in by_item["miss"]["flags"]
    assert "flags: degenerate" in drill and "written before the model said not found" in drill


def test_the_verdict_way_reaches_faithfulness_the_probe_and_the_report(
    scored_config: RagpipeConfig, onnx_embedder: Any
) -> None:
    """eval.judge_verdicts decides how faithfulness and the probe's statement pairs are
    asked, both, and summary.json and report.md say which (kappas of the two ways are not
    comparable)."""
    import typing

    from ragpipe.config import EvalConfig
    from ragpipe.evaluation.calibration import VERDICTS
    from ragpipe.evaluation.report import _judge_lines

    assert typing.get_args(EvalConfig.model_fields["judge_verdicts"].annotation) == VERDICTS
    golden = load_golden(scored_config.eval.golden)
    said = {}
    for way in VERDICTS:
        evaluation = scored_config.eval.model_copy(update={"judge_verdicts": way})
        config = scored_config.model_copy(update={"eval": evaluation})
        result = run_rag_eval(config, golden, generator=SCRIPT, judge_llm=YES,
                              embedder=onnx_embedder, limit=1)  # fmt: skip
        calibration = result.judge["calibration"]
        said[way] = (result.judge["faithfulness_verdicts"], calibration["statement_pairs_asked"],
                     result.judge["context_verdicts"])  # fmt: skip
        assert result.judge["statement_prompt"] == (
            "Does the passage say everything the statement says?" if way == "statement" else None
        )
        lines = _judge_lines(result.judge)
        assert f"- faithfulness's verdicts: {said[way][0]}" in lines
        assert f"- context recall's and precision's verdicts: {said[way][2]}" in lines
        assert calibration["by_judgement"]["statements"]["n"] >= 4
    assert said == {
        "statement": ("statement prompt, one call a claim; claims: the answer's sentences",
                      "statement",
                      "recall: statement prompt, one call a sentence of the reference; "
                      "precision: context prompt, one call a context"),
        "ragas": ("ragas, one reply; claims: the answer's sentences", "ragas",
                  "ragas's prompts"),
    }  # fmt: skip


def test_a_bare_verdict_is_read_from_a_fence_and_a_cut_reply_says_so() -> None:
    """A served model that ignores the schema and fences {"verdict": 1} still gave its
    verdict; two verdicts are none. A reply cut at its 16 tokens before any verdict (a
    model that reasons first) is an error saying so, not a silent 'no verdict'."""
    from ragpipe.evaluation.calibration import ask_statement, parse_verdict

    assert parse_verdict('```json\n{"verdict": 1}\n```') == 1
    assert parse_verdict('Sure. { "verdict" : 0 }') == 0
    assert parse_verdict('{"verdict": 1} or {"verdict": 0}') is None
    assert parse_verdict('{"verdict": 2}') is None and parse_verdict("") is None
    assert ask_statement(Canned("fenced", '```json\n{"verdict": 0}\n```'), "P.", "S.") == (
        0, '```json\n{"verdict": 0}\n```'
    )  # fmt: skip

    class Thinker(Canned):
        def chat(self, messages: Any, **kwargs: Any) -> Completion:
            assert kwargs["max_tokens"] == 16
            return Completion("<think>Let me read the passage", 9, 16, self.name, 0.0, "length")

    with pytest.raises(ValueError, match=r"cut at 16 tokens before a verdict \('<think>Let"):
        ask_statement(Thinker("thinker", ""), "P.", "S.")


def test_the_judge_says_the_floor_refused_not_that_nothing_was_retrieved(
    onnx_embedder: Any,
) -> None:
    from ragpipe.evaluation.golden import GoldenItem
    from ragpipe.evaluation.rag import Judge, Judged, RagRow
    from ragpipe.query.generate import BELOW_FLOOR, NOT_FOUND

    # ragas's answer relevancy: the question the answer answers, and whether it commits.
    noncommittal = json.dumps({"question": "How long should bread bake?", "noncommittal": 1})
    judge = Judge(Canned("shrug", noncommittal), onnx_embedder, timeout_s=5, max_tokens=64)
    floor = "below the relevance floor: the model was not asked"
    item = GoldenItem("oven", "How long should bread bake?", {"bread.md": 1},
                      expected_answer="Thirty-five minutes at 230 degrees.")  # fmt: skip
    row = RagRow("oven", item.query, NOT_FOUND, True, [], 0, [], 0, 0, 0.0, flags=[BELOW_FLOOR])
    asyncio.run(judge.judge(row, item))
    # The attack review: all four were "not applicable", so the questions retrieval failed
    # left the means' denominators. No context holds none of the reference and no useful
    # chunk: context recall and precision are 0; "not found" makes no claim; its relevancy
    # is judged (noncommittal: 0).
    assert row.judged == {
        "faithfulness": Judged(None, NOT_APPLICABLE, floor),
        "context_recall": Judged(0.0, OK, f"{floor}: no context", asked=False),
        "context_precision": Judged(0.0, OK, f"{floor}: no context", asked=False),
        "answer_relevancy": Judged(0.0, OK),
    }
    assert row.context_precision_kind == "with_reference"
    # No reference, nothing retrieved: context recall has nothing to recall.
    bare = GoldenItem("oven", "How long should bread bake?", {"bread.md": 1})
    row = RagRow("oven", bare.query, NOT_FOUND, True, [], 0, [], 0, 0, 0.0)
    asyncio.run(judge.judge(row, bare))
    assert row.judged["context_recall"] == Judged(None, NOT_APPLICABLE, "no expected_answer")
    assert row.judged["context_precision"] == Judged(
        0.0, OK, "nothing was retrieved: no context", asked=False
    )
    assert row.judged["faithfulness"] == Judged(None, NOT_APPLICABLE, "nothing was retrieved")


class Oracle:
    """A judge that knows every probe pair's truth (kappa 1), or says ``verdict(pair)``."""

    name = "oracle"
    takes_grammar = False  # a scripted reply: nothing to constrain

    def __init__(self, pairs: Any, verdict: Any = lambda pair: pair.truth) -> None:
        self.pairs = {p.prompt: p for p in pairs}
        self.verdict = verdict

    def chat(self, messages: Any, **kwargs: Any) -> Completion:
        pair = self.pairs[messages[0]["content"]]
        return Completion(json.dumps({"verdict": self.verdict(pair)}), 5, 1, self.name, 0.0)

    def count_tokens(self, text: str) -> int:
        return len(text) // 4


def test_a_false_statement_is_the_true_one_altered_or_given_an_invented_reason() -> None:
    """The probe's made-up false statements, by hand: ``alter`` changes the first number
    (+7, or x3 for a decimal) or adds "not" after the first auxiliary; ``invent`` adds a
    reason after a comma, one of the REASONS none of whose word beginnings the passage
    holds; ``false_quota`` hands the false statements out in turn."""
    from ragpipe.evaluation.calibration import (
        ALTERED,
        INVENTED,
        REASONS,
        UNRELATED,
        _reasons_for,
        alter,
        false_quota,
        invent,
    )

    assert alter("Bake the loaf for 35 minutes at 230 degrees.") == (
        "Bake the loaf for 42 minutes at 230 degrees.")  # fmt: skip
    assert alter("R 4.1.3 was the last version.") == "R 12.3.3 was the last version."
    assert alter("The default threshold is 0.0 for every index.") == (
        "The default threshold is 7 for every index."
    )  # fmt: skip; x3 kept it 0
    assert alter("The dough is left to rise overnight.") == (
        "The dough is not left to rise overnight.")  # fmt: skip
    assert alter("The dough is not left to rise.") is None  # already negated, no number
    assert invent("Knead the dough for ten minutes.", "because it is the recommended way") == (
        "Knead the dough for ten minutes, because it is the recommended way.")  # fmt: skip
    assert invent("Is it R?", "as it avoids errors") == "Is it R, as it avoids errors."
    # "Quickly" rules out the fastest way, "Convenient" the recommended way, "Windows" every
    # platform; "breakfast" does not begin with "fast" (the efficient approach stays), nor
    # "programs" with "ram" (less memory stays).
    passage = "Quickly, the most Convenient way on Windows: programs after breakfast."
    assert [r for r, _ in REASONS if r not in _reasons_for(passage)] == [
        "because it is the fastest way", "because it is the recommended way",
        "since it works the same on every platform"]  # fmt: skip
    assert len(_reasons_for(passage)) == 6 and len(_reasons_for("")) == len(REASONS) == 9
    counts = [tuple(false_quota(n)[k] for k in (INVENTED, UNRELATED, ALTERED))
              for n in (1, 2, 4, 24)]  # fmt: skip
    assert counts == [(1, 0, 0), (1, 1, 0), (2, 1, 1), (8, 8, 8)]


def test_probe_and_calibration_of_a_perfect_judge(
    scored_config: RagpipeConfig, tmp_path: Path
) -> None:
    from ragpipe.evaluation.calibration import (
        ALTERED,
        INVENTED,
        MATCHING,
        MISMATCHED,
        NEIGHBOUR,
        OTHER_SECTION,
        REASONS,
        SUPPORTED,
        UNRELATED,
        UNRELATED_CONTEXT,
        USEFUL,
        ProbePair,
        _other_section,
        _reasons_for,
        _share,
        _target_chunks,
        build_probe,
        calibrate,
        context_prompt,
        invent,
        statement_prompt,
    )
    from ragpipe.evaluation.check import IndexView
    from ragpipe.models.embedders import embedder_name
    from ragpipe.store import open_reader

    golden = load_golden(scored_config.eval.golden)
    store = open_reader(scored_config.store, embedder_name(scored_config.embed))
    assert store is not None
    try:
        probe = build_probe(golden, IndexView(store), 16, seed=0)
        again = build_probe(golden, IndexView(store), 16, seed=0)
        view = IndexView(store)
        targets = {i.id: {str(c["text"]) for c in _target_chunks(i, view)}
                   for i in golden.items}  # fmt: skip
        # An "other section" statement: the Oven section's file, from its Dough section (a
        # sentence run into its heading, "## Dough Mix flour ...", is no sentence).
        oven = _target_chunks(golden.items[0], view)
        assert _other_section(oven, view, np.random.default_rng(0)) == (
            "Knead the dough for ten minutes until it is smooth and elastic, then let it rise "
            "for an hour in a warm place."
        )
        lovelace = _target_chunks(golden.items[1], view)  # Alan Turing's one sentence is run
        assert _other_section(lovelace, view, np.random.default_rng(0)) is None  # into it
    finally:
        store.close()
    assert probe == again  # seeded
    kinds = [p.kind for p in probe]
    # Four answerable items: enough for pairs of each kind, half of them true; a third of
    # 16, rounded down to even, are context pairs.
    assert set(kinds) <= {SUPPORTED, UNRELATED, OTHER_SECTION, ALTERED, INVENTED, MATCHING,
                          MISMATCHED, USEFUL, UNRELATED_CONTEXT, NEIGHBOUR}  # fmt: skip
    false_statements = sum(kinds.count(k) for k in (UNRELATED, OTHER_SECTION, ALTERED, INVENTED))
    assert kinds.count(SUPPORTED) == false_statements >= 1
    assert kinds.count(MATCHING) == kinds.count(MISMATCHED) >= 1
    assert kinds.count(USEFUL) == kinds.count(UNRELATED_CONTEXT) + kinds.count(NEIGHBOUR) == 2
    items = {i.id: i for i in golden.items}
    for pair in (p for p in probe if p.kind in (USEFUL, UNRELATED_CONTEXT, NEIGHBOUR)):
        item = items[pair.item_id]  # asked as context precision asks
        assert pair.question == item.query and pair.answer
        assert pair.answer == item.expected_answer or pair.answer in " ".join(
            pair.passage.split())  # no reference: the useful chunk's opening  # fmt: skip
        assert pair.prompt == context_prompt(item.query, pair.answer, pair.passage)
        assert (pair.passage in targets[item.id]) is (pair.kind == USEFUL)
        # A false context holds under half the answer's words: never a copied target
        # (backups-copy.md repeats backups.md's Schedule section word for word).
        held = _share({"text": pair.passage}, pair.answer)
        assert held >= 0.5 if pair.kind == USEFUL else held < 0.5
    for pair in probe:
        if pair.kind == SUPPORTED:  # the statement is in the passage shown
            assert pair.shown in pair.passage
        if pair.kind in (UNRELATED, OTHER_SECTION, ALTERED, INVENTED):
            assert pair.shown not in pair.passage
        if pair.kind in (SUPPORTED, UNRELATED, OTHER_SECTION, ALTERED, INVENTED):
            assert pair.prompt == statement_prompt(pair.passage, pair.shown)
            assert pair.prompt.startswith("Does the passage say everything the statement says?")
    # An invented reason: the supported statement before it, then one of the REASONS whose
    # stem its passage does not hold.
    invented = [(t, f) for t, f in itertools.pairwise(probe) if f.kind == INVENTED]
    assert len(invented) == 1
    for true, false in invented:
        assert true.kind == SUPPORTED and true.passage == false.passage
        added = {invent(true.shown, r): r for r, _ in REASONS}
        assert false.shown in added and added[false.shown] in _reasons_for(false.passage)
    oracle = Oracle(probe)
    measured = calibrate(oracle, probe, min_kappa=0.4, timeout_s=10)
    assert not measured.failed and measured.agreement.kappa == 1.0
    asked = {j: a.n for j, a in measured.by_judgement.items()}
    # Four answerable items, two with a reference: a 16-pair probe gets 4 pairs of each
    # judgement (2 statement pairs before invented reasons: oven's only false kind left was
    # an altered sentence, and none of its passage's sentences can be altered).
    assert asked == {"statements": 4, "answers": 4, "contexts": 4}
    # Every verdict right, but a judge blind to the truth gets 4 pairs (2 true) all right
    # with chance 1/16 (a coin: 1/2^4): no judgement is vouched for, nor the judge.
    assert measured.by_judgement["statements"].p_chance == 1 / 16
    assert measured.agreement.accuracy == 1.0 and not measured.reliable
    assert all(measured.reliable_for(m) is None for m in RAG_METRICS)
    assert measured.label().startswith(
        "judge not calibrated on statements (4 pairs, a blind judge does as well with "
        "p=0.062), answers (4 pairs, a blind judge does as well with p=0.062), contexts (4 "
    )
    assert measured.short_for("faithfulness") == (
        "judge not calibrated on statements (kappa 1.00 on 4 pairs, a blind judge does as "
        "well with p=0.062)"
    )

    # Reads passages perfectly, calls every answer relevant: trusted for the statement
    # metrics only, though its pooled kappa, 0.5, would pass. Eight pairs of each
    # judgement: statements all right; answers 4 right (the true ones), 4 wrong.
    def pair(kind: str, truth: int, shown: str) -> ProbePair:  # asked as the probe asks
        statement = kind in (SUPPORTED, UNRELATED, ALTERED)
        return ProbePair(kind, truth, statement_prompt("x", shown) if statement else shown,
                         "x", shown, "x" if statement else "")  # fmt: skip

    kinds = [(SUPPORTED, 1), (UNRELATED, 0), (SUPPORTED, 1), (ALTERED, 0)] * 2 + [
        (MATCHING, 1), (MISMATCHED, 0)] * 4  # fmt: skip
    pairs = [pair(kind, truth, f"{kind} {n}") for n, (kind, truth) in enumerate(kinds)]
    half = Oracle(pairs, lambda p: p.truth if p.kind in (SUPPORTED, UNRELATED, ALTERED) else 1)
    split = calibrate(half, pairs, min_kappa=0.4, timeout_s=10)
    # Pooled: p_o = 12/16, p_yes(truth) = 1/2, p_yes(judge) = 12/16: p_e = 1/2 * 12/16 +
    # 1/2 * 4/16 = 1/2; kappa = (3/4 - 1/2) / (1 - 1/2) = 0.5.
    assert split.agreement.kappa == pytest.approx(0.5)
    assert split.by_judgement["statements"].kappa == 1.0
    assert split.by_judgement["statements"].p_chance == 1 / 256  # 8 of 8: 1/2^8
    assert split.by_judgement["answers"].kappa == 0.0 and not split.reliable
    assert split.reliable_for("faithfulness") and split.reliable_for("answer_relevancy") is False
    assert split.short_for("answer_relevancy") == "judge unreliable on answers (kappa 0.00)"
    # Too few pairs of a judgement: not calibrated, unless the whole probe failed.
    few = calibrate(half, pairs[:10], min_kappa=0.4, timeout_s=10)
    assert few.by_judgement["answers"].n == 2 and few.reliable_for("answer_relevancy") is None
    # Every verdict right, but two pairs of each judgement: every metric is "judge not
    # calibrated", so the judge as a whole is not vouched for (it was "reliable", and a
    # run's judge.usable_for_gates true, beside four metrics marked not calibrated).
    small = [pairs[0], pairs[1], pairs[8], pairs[9]]
    right = calibrate(Oracle(small), small, min_kappa=0.4,
                      timeout_s=10)  # fmt: skip
    assert right.agreement.kappa == 1.0 and not right.failed and not right.reliable
    assert all(right.reliable_for(m) is None for m in RAG_METRICS)
    assert right.label().startswith(
        "judge not calibrated on statements (2 pairs, fewer than 4), answers (2 pairs, fewer "
        "than 4), contexts (no pairs) (kappa 1.00"
    )
    assert right.as_dict()["reliable"] is False
    # No pair at all of a judgement (a golden set with one answerable item has no answer to
    # mismatch): not calibrated either; it was "reliable" on the statements alone.
    statements = pairs[:8]
    alone = calibrate(Oracle(statements), statements,
                      min_kappa=0.4, timeout_s=10)  # fmt: skip
    assert "answers" not in alone.by_judgement
    assert alone.uncalibrated == ["answers", "contexts"]
    assert not alone.reliable and alone.reliable_for("faithfulness") is True
    assert alone.reliable_for("context_precision") is None
    assert alone.label().startswith(
        "judge not calibrated on answers (no pairs), contexts (no pairs) (kappa 1.00"
    )


def test_a_judgement_is_believed_only_where_a_blind_judge_rarely_does_as_well() -> None:
    """The attack review: kappa >= 0.4 on a judgement's 8 pairs trusted its metric, and a
    judge answering at random passed one time in seven (6 right of 8 is kappa 0.50), so a
    coin's answer relevancy was headlined as a value in about a third of runs. Now a
    judgement is believed only when a judge blind to the truth would get as many right with
    a chance under 0.05 (CHANCE_P); by hand, 8 pairs, 4 true, a coin at best:
    P(>= 7 right) = (1 + 8) / 2^8 = 9/256, P(>= 6 right) = (1 + 8 + 28) / 256 = 37/256."""
    from ragpipe.evaluation.calibration import (
        CHANCE_P,
        MATCHING,
        MISMATCHED,
        SUPPORTED,
        UNRELATED,
        ProbePair,
        calibrate,
    )

    def pair(n: int) -> ProbePair:
        kind, truth = ((MATCHING, 1), (MISMATCHED, 0))[n % 2]
        return ProbePair(kind, truth, f"answer {n}", "x", f"answer {n}")

    pairs = [pair(n) for n in range(8)]

    def wrong_on(*numbers: int) -> Oracle:
        return Oracle(pairs, lambda p: 1 - p.truth if p.shown in
                      {f"answer {n}" for n in numbers} else p.truth)  # fmt: skip

    seven = calibrate(wrong_on(0), pairs, min_kappa=0.4, timeout_s=10)
    answers = seven.by_judgement["answers"]
    # One true pair called false: p_o = 7/8, yes rates 1/2 and 3/8, p_e = 1/2;
    # kappa = (7/8 - 1/2) / (1/2) = 0.75.
    assert answers.kappa == pytest.approx(0.75) and answers.p_chance == 9 / 256 < CHANCE_P
    assert seven.reliable_for("answer_relevancy") is True
    six = calibrate(wrong_on(0, 1), pairs, min_kappa=0.4, timeout_s=10)
    answers = six.by_judgement["answers"]
    # A true pair and a false one wrong: p_o = 6/8, both yes rates 1/2: kappa 0.5, over the
    # bar of 0.4, but a coin does as well with chance 37/256 = 0.1445.
    assert answers.kappa == pytest.approx(0.5) and answers.p_chance == 37 / 256
    assert six.reliable_for("answer_relevancy") is None and not six.failed
    assert six.short_for("answer_relevancy") == (
        "judge not calibrated on answers (kappa 0.50 on 8 pairs, a blind judge does as well "
        "with p=0.14)"
    )
    assert "answers 0.50, a blind judge does as well with p=0.14" in six.label()
    assert six.as_dict()["by_judgement"]["answers"]["reliable"] is None
    assert six.as_dict()["by_judgement"]["answers"]["p_chance"] == 37 / 256
    # Four wrong: kappa 0, under the bar: unreliable (withheld), as before.
    four = calibrate(wrong_on(0, 1, 2, 3), pairs, min_kappa=0.4, timeout_s=10)
    assert four.reliable_for("answer_relevancy") is False and four.failed
    # The review: a whole probe that failed withholds a judgement that cannot beat chance,
    # as it withholds one with too few pairs (it only flagged it, the milder verdict for
    # more pairs). Statements all wrong (kappa -1), answers 6 of 8: whole kappa
    # (6/16 - 1/2) / (1/2) = -0.25.
    statements = [ProbePair(SUPPORTED if n % 2 == 0 else UNRELATED, 1 - n % 2,
                            f"statement {n}", "x", f"statement {n}") for n in range(8)]  # fmt: skip
    both = statements + pairs
    blind = Oracle(both, lambda p: 1 - p.truth if p.shown in
                   {f"answer {n}" for n in (0, 1)} | {s.shown for s in statements}
                   else p.truth)  # fmt: skip
    failed = calibrate(blind, both, min_kappa=0.4, timeout_s=10)
    assert failed.agreement.kappa == pytest.approx(-0.25)
    assert failed.by_judgement["answers"].p_chance == 37 / 256
    assert failed.reliable_for("answer_relevancy") is False
    assert failed.short_for("answer_relevancy") == "judge unreliable (kappa -0.25)"


def test_a_judge_exactly_at_the_kappa_bar_is_not_unreliable() -> None:
    """Kappa from shares came out 0.3999999999999999 for an exact 2/5, and a judge at a bar
    of 0.4 was "judge unreliable (kappa 0.40 ...; min 0.4)": only a kappa below the bar
    withholds. 40 answer pairs, 20 true, 6 true and 6 false ones wrong: p_o = 28/40, both
    yes rates 1/2, kappa = (7/10 - 1/2) / (1/2) = 2/5; a coin gets 28 of 40 with chance
    0.0083 (under CHANCE_P)."""
    from ragpipe.evaluation.calibration import MATCHING, MISMATCHED, ProbePair, calibrate

    def pair(n: int) -> ProbePair:
        kind, truth = ((MATCHING, 1), (MISMATCHED, 0))[n % 2]
        return ProbePair(kind, truth, f"answer {n}", "x", f"answer {n}")

    def wrong_below(pairs: list[ProbePair], count: int) -> Oracle:
        wrong = {p.shown for p in pairs[:count]}
        return Oracle(pairs, lambda p: 1 - p.truth if p.shown in wrong else p.truth)

    pairs = [pair(n) for n in range(40)]
    at_bar = calibrate(wrong_below(pairs, 12), pairs, min_kappa=0.4, timeout_s=10)
    assert at_bar.by_judgement["answers"].kappa == 0.4 == at_bar.agreement.kappa
    assert not at_bar.failed and at_bar.reliable_for("answer_relevancy") is True
    assert at_bar.short_for("answer_relevancy") == "judge reliable on answers (kappa 0.40)"
    assert at_bar.label().startswith(
        "judge not calibrated on statements (no pairs), contexts (no pairs) (kappa 0.40 ["
    )
    # The review's 10 pairs, 7 right: at the bar too; a coin gets 7 of 10 with chance
    # 176/1024, so not calibrated (it was "judge unreliable").
    ten = pairs[:10]
    small = calibrate(wrong_below(ten, 3), ten, min_kappa=0.4, timeout_s=10)
    assert small.agreement.kappa == 0.4 and not small.failed
    assert small.short_for("answer_relevancy") == (
        "judge not calibrated on answers (kappa 0.40 on 10 pairs, a blind judge does as well "
        "with p=0.17)"
    )
    # A hair under the bar is under it.
    under = calibrate(wrong_below(ten, 3), ten, min_kappa=0.41, timeout_s=10)
    assert under.failed and under.label().startswith("judge unreliable (kappa 0.40 ")


def test_a_judge_that_gives_no_verdicts_is_unavailable_not_unreliable() -> None:
    """The review: a judge whose every call raised was "judge unreliable (kappa -1.00
    [-1.00, -0.47])", each failure counted as the wrong answer: kappa -1 says the judge
    always answers the opposite, not that it never answered. More than half the probe's
    calls failing is "judge unavailable", with the count and the first failure; a few
    failures are scored as before (counted wrong)."""
    from ragpipe.evaluation.calibration import MATCHING, MISMATCHED, ProbePair, calibrate
    from ragpipe.models.llm import OllamaLLM
    from tests.support.loopback import free_port

    pairs = [ProbePair(*((MATCHING, 1), (MISMATCHED, 0))[n % 2], f"answer {n}", "x",
                       f"answer {n}") for n in range(8)]  # fmt: skip
    host = f"http://127.0.0.1:{free_port()}"  # an Ollama server that is down
    down = calibrate(OllamaLLM("smollm", host=host, retries=0), pairs, min_kappa=0.4,
                     timeout_s=10)  # fmt: skip
    assert down.agreement.failed == 8 and down.agreement.kappa == -1.0  # as scored
    assert down.unavailable and down.unreachable and down.failed and not down.reliable
    assert down.label().startswith(
        f"judge unavailable: 8 of 8 probe calls failed (first: StageError: Ollama at {host} "
        "failed after 1 attempt(s): ConnectError: "
    )
    for m in RAG_METRICS:  # withheld, and saying why
        assert down.reliable_for(m) is False
        assert down.short_for(m) == "judge unavailable (8 of 8 probe calls failed)"
    assert down.as_dict()["unavailable"] is True and down.as_dict()["reliable"] is False

    class Flaky(Oracle):
        """Raises on the first ``n`` pairs it is asked (a judge going down mid-probe)."""

        def __init__(self, n: int) -> None:
            super().__init__(pairs)
            self.left = n

        def chat(self, messages: Any, **kwargs: Any) -> Completion:
            self.left -= 1
            if self.left >= 0:
                raise ConnectionError("connection refused")
            return super().chat(messages, **kwargs)

    most = calibrate(Flaky(5), pairs, min_kappa=0.4, timeout_s=10)
    assert most.unavailable and not most.unreachable  # 3 were answered: not a stop
    assert most.label() == (
        "judge unavailable: 5 of 8 probe calls failed (first: ConnectionError: connection refused)"
    )
    assert most.reliable_for("answer_relevancy") is False
    # One failure of 8, counted wrong: 7 right, kappa 0.75, 9/256 for a coin: trusted.
    few = calibrate(Flaky(1), pairs, min_kappa=0.4, timeout_s=10)
    assert not few.unavailable and few.agreement.kappa == 0.75
    assert few.reliable_for("answer_relevancy") is True
    assert few.label().startswith(
        "judge not calibrated on statements (no pairs), contexts (no pairs) (kappa 0.75 "
    )
    # A judge that replies but never with a verdict is unavailable too, and reachable.
    rambling = calibrate(RAMBLER, pairs, min_kappa=0.4, timeout_s=10)
    assert rambling.unavailable and not rambling.unreachable
    assert rambling.label() == (
        "judge unavailable: 8 of 8 probe calls failed (first: no verdict in "
        '\'{"statements": ["an unfinished\')'
    )


def test_eval_rag_stops_before_any_question_when_the_judge_answers_no_probe_call(
    scored_config: RagpipeConfig, onnx_embedder: Any
) -> None:
    """A judge that is down failed every probe call, then every verdict of every question,
    each after its generated answer: hours for a report with the judged metrics withheld.
    The run stops after the probe, before the first question is answered."""
    from ragpipe.errors import StageError
    from ragpipe.models.llm import OllamaLLM
    from tests.support.loopback import free_port

    asked: list[Any] = []

    class Counting:
        name, takes_grammar = SCRIPT.name, SCRIPT.takes_grammar

        def chat(self, messages: Any, **kwargs: Any) -> Completion:
            asked.append(messages)
            return SCRIPT.chat(messages, **kwargs)

        def count_tokens(self, text: str) -> int:
            return SCRIPT.count_tokens(text)

    host = f"http://127.0.0.1:{free_port()}"
    judge = OllamaLLM("judge-model", host=host, retries=0)
    golden = load_golden(scored_config.eval.golden)
    with pytest.raises(StageError) as err:
        run_rag_eval(scored_config, golden, generator=Counting(), judge_llm=judge,
                     embedder=onnx_embedder)  # fmt: skip
    said = str(err.value)
    assert said.startswith(
        "the judge judge-model answered no calibration probe call, 12 of 12 probe calls "
        f"failed (first: StageError: Ollama at {host} failed after 1 attempt(s): ConnectError"
    )
    assert said.endswith(
        ": stopped before any question was answered; check that the judge is served and "
        "reachable (eval.judge, else llm), or raise eval.judge_timeout_s if its calls timed out"
    )
    assert asked == []


def test_a_label_outside_its_metric_is_refused_before_any_question_is_asked(
    scored_config: RagpipeConfig, onnx_embedder: Any, tmp_path: Path
) -> None:
    """It was refused after every question had been generated and judged: the run lost."""
    labels = tmp_path / "labels.csv"
    labels.write_text("item_id,metric,value\noven,faithfulness,-0.5\n", encoding="utf-8")
    evaluation = scored_config.eval.model_copy(update={"labels": labels, "judge_probe_size": 0})
    config = scored_config.model_copy(update={"eval": evaluation})
    asked: list[Any] = []

    class Counting:
        name, takes_grammar = SCRIPT.name, SCRIPT.takes_grammar

        def chat(self, *args: Any, **options: Any) -> Any:
            asked.append(args)
            return SCRIPT.chat(*args, **options)

        def count_tokens(self, text: str) -> int:
            return SCRIPT.count_tokens(text)

    with pytest.raises(ConfigError, match=r"faithfulness for item 'oven' is -0.5, outside"):
        run_rag_eval(config, load_golden(config.eval.golden), generator=Counting(),
                     judge_llm=RAMBLER, embedder=onnx_embedder)  # fmt: skip
    assert asked == []
    # So is a question the model's window cannot hold: it was an empty answer, scored.
    small = Counting()
    small.context_size, small.max_tokens = 512, 16  # type: ignore[attr-defined]
    golden = load_golden(scored_config.eval.golden)
    golden.items[2] = dataclasses.replace(golden.items[2], query="Why? " * 2000)
    with pytest.raises(ConfigError, match=r"raise llm.context_size"):
        run_rag_eval(scored_config, golden, generator=small, judge_llm=RAMBLER,
                     embedder=onnx_embedder)  # fmt: skip
    assert asked == []


def test_human_labels_give_a_ppi_estimate_beside_the_judge(
    scored_config: RagpipeConfig, onnx_embedder: Any, tmp_path: Path
) -> None:
    labels = tmp_path / "labels.csv"
    labels.write_text("item_id,metric,value\noven,answer_relevancy,1.0\n"
                      "backups,answer_relevancy,0.0\ncapital,faithfulness,1\n",
                      encoding="utf-8")  # fmt: skip
    evaluation = scored_config.eval.model_copy(update={"labels": labels, "judge_probe_size": 0})
    config = scored_config.model_copy(update={"eval": evaluation})
    golden = load_golden(config.eval.golden)
    result = run_rag_eval(config, golden, generator=SCRIPT, judge_llm=RAMBLER,
                          embedder=onnx_embedder)  # fmt: skip
    # RAMBLER's replies never parse: every answer_relevancy verdict failed, so the judge
    # predicts the range's midpoint, 0 (a cosine lies in [-1, 1]), for the four answerable
    # items. PPI: the unlabelled lovelace's and miss's mean prediction 0, minus
    # mean(prediction - label) over the labelled two = 0 - ((0 - 1) + (0 - 0)) / 2 = 0.5.
    # CI: var_f = 0 (both predictions 0), var_rect = var(-1, 0) = 0.5: half-width
    # t * sqrt(0 / 2 + 0.5 / 2) = 12.706 x 0.5 = 6.35 (Welch-Satterthwaite df = 1: the
    # rectifier's 2 labels are all the variance), clipped to the range, [-1, 1]: two labels
    # say nothing at 95% (a normal z claimed [-0.48, 1]).
    ppi = result.ppi["answer_relevancy"]
    # The judge judged nothing, and the metric is withheld: no judge mean and 0 judged (it
    # showed the midpoints' mean, 0.0, over "4 judged").
    assert (ppi.n_judged, ppi.n_labeled) == (0, 2) and math.isnan(ppi.judge_mean)
    assert ppi.mean == pytest.approx(0.5) and ppi.human_mean == 0.5
    assert "answer_relevancy" in result.withheld
    assert (ppi.ci_low, ppi.ci_high) == (-1.0, 1.0)
    assert any(w.startswith("only 2 human label(s) of answer_relevancy: its intervals are wide "
                            "and cover less than 95%") for w in result.warnings)  # fmt: skip
    # capital is answerable: false (faithfulness not applicable): its label is left out.
    assert "faithfulness" not in result.ppi
    assert any("label(s) of faithfulness" in w for w in result.warnings)
    # No probe: the judge's metrics are marked "not calibrated"; over 20 % failed: withheld.
    assert result.calibration is None
    assert result.flags["answer_relevancy"].startswith("judge failed on 4 of 4 (> 20%)")
    assert "judge not calibrated" in result.flags["answer_relevancy"]
    summary = rag_summary(result, config, {"files": 5, "points": 0, "sha256": "x"})
    out = Path(write_run(summary, rag_table(result), tmp_path / "reports").report_dir)
    md = (out / "report.md").read_text()
    assert "## Human labels: prediction-powered estimates" in md
    # The same interval as the labels' own, since the judge adds no variance here (and no
    # information).
    assert "| answer_relevancy | 0.500 [-1.000, 1.000] | 0.500 [-1.000, 1.000] | 2 / 0 |" in md
    assert "calibration: **none**" in md


def test_the_judges_replies_are_bounded_in_the_schema_it_is_constrained_by() -> None:
    """RAGAS's faithfulness verdicts repeat each statement, then a reason, then the verdict;
    unbounded replies ran past judge_max_tokens and the JSON was lost, and their length is
    the judge's time. Reasons, lists and the statements generated are
    bounded; the verdicts and the statements they echo are untouched."""
    from ragas.metrics.collections.context_precision.util import ContextPrecisionOutput
    from ragas.metrics.collections.faithfulness.util import (
        NLIStatementOutput,
        StatementGeneratorOutput,
    )

    from ragpipe.evaluation.rag import bounded_reasons

    schema = NLIStatementOutput.model_json_schema()
    bounded = bounded_reasons(schema)
    answer = bounded["$defs"]["StatementFaithfulnessAnswer"]["properties"]
    assert answer["reason"] == {"description": "the reason of the verdict", "title": "Reason",
                                "type": "string", "maxLength": 160}  # fmt: skip
    # the statement a verdict echoes is left whole: cut, the judge judged the cut text
    assert answer["statement"] == schema["$defs"]["StatementFaithfulnessAnswer"]["properties"][
        "statement"]  # fmt: skip
    assert answer["verdict"] == schema["$defs"]["StatementFaithfulnessAnswer"]["properties"][
        "verdict"]  # fmt: skip
    assert bounded["properties"]["statements"]["maxItems"] == 24
    assert "maxLength" not in json.dumps(schema)  # the original is not changed
    text = json.dumps(bounded)
    assert (text.count("maxLength"), text.count("maxItems")) == (1, 1)
    generated = bounded_reasons(StatementGeneratorOutput.model_json_schema())
    statements = generated["properties"]["statements"]
    assert (statements["maxItems"], statements["items"]) == (
        24, {"type": "string", "maxLength": 240})  # fmt: skip
    precision = bounded_reasons(ContextPrecisionOutput.model_json_schema())
    assert precision["properties"]["reason"]["maxLength"] == 160
    assert "maxItems" not in json.dumps(precision)


def test_llama_cpp_holds_the_judge_to_the_bound(
    smollm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound is the grammar's: the real model, asked for a long reason, stops the string
    at maxLength and the reply is still valid JSON (a bound of 20 here, so that the unbound
    reason, whatever its length, is surely longer)."""
    import ragpipe.evaluation.rag as rag

    monkeypatch.setattr(rag, "REASON_MAX_CHARS", 20)
    properties = {"reason": {"type": "string"}, "verdict": {"type": "integer"}}
    schema = {"type": "object", "required": ["reason", "verdict"], "properties": properties}
    prompt = [{"role": "user", "content": "Explain at great length why bread rises, as JSON."}]
    free = json.loads(smollm.chat(prompt, schema=schema, max_tokens=300).text)
    bound = rag.bounded_reasons(schema)
    assert bound["properties"]["reason"]["maxLength"] == 20
    reply = json.loads(smollm.chat(prompt, schema=bound, max_tokens=300).text)
    assert len(free["reason"]) > 20 >= len(reply["reason"]) > 0
    assert isinstance(reply["verdict"], int)


def test_llama_cpp_holds_the_judges_lists_to_their_bound(
    smollm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """maxItems and the items' maxLength are the grammar's too: asked for twenty facts, the
    real model writes at most 2 (the bound here), each at most 30 characters, as valid JSON."""
    import ragpipe.evaluation.rag as rag

    monkeypatch.setattr(rag, "MAX_STATEMENTS", 2)
    monkeypatch.setattr(rag, "STATEMENT_MAX_CHARS", 30)
    items = {"type": "array", "items": {"type": "string"}}
    schema = {"type": "object", "required": ["statements"], "properties": {"statements": items}}
    prompt = [{"role": "user", "content": "List twenty long facts about bread, as JSON."}]
    free = smollm.chat(prompt, schema=schema, max_tokens=400)
    # unbounded, the list runs on (here past 400 tokens, so the JSON is cut)
    assert free.text.count('",') > 2 and free.tokens_out > 100
    bound = json.loads(smollm.chat(prompt, schema=rag.bounded_reasons(schema),
                                   max_tokens=400).text)["statements"]  # fmt: skip
    assert 0 < len(bound) <= 2 and all(len(s) <= 30 for s in bound)


def test_faithfulness_verdicts_copy_each_statement_into_the_reply(smollm: Any) -> None:
    """The real model is handed each statement inside the reply and writes only the reason
    and the verdict: ragas's verdicts JSON, one verdict per statement, each statement word
    for word (quotes and non-ASCII included), every verdict 0 or 1."""
    from ragas.metrics.collections.faithfulness.util import (
        NLIStatementInput,
        NLIStatementOutput,
        NLIStatementPrompt,
    )

    from ragpipe.evaluation.rag import REASON_MAX_CHARS, verdict_reply

    statements = ["Bread bakes at 230 °C.", 'The loaf is called a "boule".', "Rye has no gluten."]
    context = "Bake the loaf at 230 degrees Celsius for 35 minutes. A round loaf is a boule."
    prompt = NLIStatementPrompt().to_string(NLIStatementInput(context=context,
                                                              statements=statements))  # fmt: skip
    text = verdict_reply(smollm, prompt, statements)
    verdicts = NLIStatementOutput.model_validate_json(text).statements
    assert [v.statement for v in verdicts] == statements
    assert all(v.verdict in (0, 1) and len(v.reason) <= REASON_MAX_CHARS for v in verdicts)
    assert json.loads(text)["statements"][1]["statement"] == 'The loaf is called a "boule".'


def test_the_probe_asks_a_statement_pair_as_faithfulness_asks(smollm: Any) -> None:
    """With eval.judge_verdicts: ragas, the probe's statement pairs are ragas's faithfulness
    prompt about one statement, and a judge that continues replies gets the statement
    prefilled (the real model writes only the reason and the verdict); by default, the
    statement prompt for a bare verdict, held to {"verdict": 0|1}, as faithfulness asks."""
    from ragpipe.evaluation.calibration import (
        SUPPORTED,
        ProbePair,
        _ask,
        ask_statement,
        parse_statement_verdict,
        statement_prompt,
        statement_verdict,
    )

    passage = "Bake the loaf at 230 degrees Celsius for 35 minutes."
    statement = 'The loaf is baked at "230 degrees" Celsius.'
    pair = ProbePair(SUPPORTED, 1, statement_prompt(passage, statement), "oven", statement,
                     passage)  # fmt: skip
    reply = json.loads(statement_verdict(smollm, pair, 64))
    assert [v["statement"] for v in reply["statements"]] == [statement]
    verdict, failure = asyncio.run(_ask(smollm, pair, 60, 64, "ragas"))
    assert verdict in (0, 1) and failure is None
    bare, text = ask_statement(smollm, passage, statement)
    assert bare in (0, 1) and json.loads(text) == {"verdict": bare}
    assert asyncio.run(_ask(smollm, pair, 60, 64)) == (bare, None)
    # Anything but one verdict, 0 or 1, about this very statement is no verdict.
    said = {"statement": statement, "reason": "", "verdict": 1}
    assert parse_statement_verdict(json.dumps({"statements": [said]}), statement) == 1
    # A judge that writes the statement again may change quotes, case, spacing or the
    # final stop: still this statement. A changed number is another statement.
    near = {**said, "statement": "the loaf is  baked at \u201c230 degrees\u201d Celsius"}
    assert parse_statement_verdict(json.dumps({"statements": [near]}), statement) == 1
    other = {**said, "statement": 'The loaf is baked at "250 degrees" Celsius.'}
    assert parse_statement_verdict(json.dumps({"statements": [other]}), statement) is None
    for bad in (
        {"statements": [{**said, "statement": "Rye has no gluten."}]},
        {"statements": [said, said]},
        {"statements": [{**said, "verdict": 2}]},
        {"statements": [{**said, "verdict": True}]},
        {"verdict": 1},
    ):
        assert parse_statement_verdict(json.dumps(bad), statement) is None
    assert parse_statement_verdict('{"statements": [', statement) is None


class Verdicts:
    """A judge that splits the answer into three statements and says ``said[statement]``
    (a JSON reply) about each, recording every prompt."""

    name = "verdicts"
    takes_grammar = False
    temperature = 0.0

    def __init__(self, said: dict[str, str]) -> None:
        self.said = said
        self.prompts: list[str] = []

    def chat(self, messages: Any, **kwargs: Any) -> Completion:
        prompt = messages[0]["content"]
        self.prompts.append(prompt)
        if prompt.startswith("Does the passage say everything the statement says?"):
            statement = prompt.rsplit("Statement: ", 1)[1].split("\n")[0]
            return Completion(self.said[statement], 9, 5, self.name, 0.0, "stop")
        if '"noncommittal"' in prompt:
            reply = '{"question": "How long should bread bake?", "noncommittal": 0}'
        elif prompt.startswith("Given a question and an answer"):  # the statements
            reply = json.dumps({"statements": list(self.said)})
        else:  # context precision and recall
            reply = '{"reason": "useful", "verdict": 1}'
        return Completion(reply, 9, 9, self.name, 0.0, "stop")

    def count_tokens(self, text: str) -> int:
        return len(text) // 4


def test_faithfulness_asks_each_statement_as_the_probe_asks_a_statement_pair(
    onnx_embedder: Any,
) -> None:
    """With ragas's generated statements (claims="generated"; the default judges the
    answer's sentences) faithfulness asks one call a statement,
    the probe's statement prompt with the contexts as passage, for a bare verdict: 2 of 3
    supported is 2/3. The probe asks its statement pairs with the very same prompt. A reply
    with no verdict fails the metric with the reason, never a score over the others."""
    from ragpipe.evaluation.calibration import SUPPORTED, ProbePair, calibrate, statement_prompt
    from ragpipe.evaluation.golden import GoldenItem
    from ragpipe.evaluation.rag import Judge, RagRow

    said = {"Bread bakes for 35 minutes.": '{"verdict": 1}', "It rises twice.": '{"verdict": 0}',
            "The oven is hot.": '{"verdict": 1}'}  # fmt: skip
    contexts = ["Bake the loaf for thirty-five minutes.", "Preheat the oven to 230 degrees."]
    item = GoldenItem("oven", "How long should bread bake?", {"bread.md": 1})
    row = RagRow("oven", item.query, "Bake it for 35 minutes; it rises twice [1].", False,
                 contexts, 1, [], 0, 0, 0.0)  # fmt: skip
    judge = Verdicts(said)
    scorer = Judge(judge, onnx_embedder, timeout_s=5, max_tokens=1536, claims="generated")
    assert scorer.faithfulness_verdicts == (
        "statement prompt, one call a claim; claims: ragas's statements"
    )
    asyncio.run(scorer.judge(row, item))
    assert row.judged["faithfulness"].value == pytest.approx(2 / 3)
    asked = [p for p in judge.prompts if p.startswith("Does the passage say everything")]
    passage = "\n".join(contexts)  # ragas's faithfulness joins the contexts so
    assert asked == [statement_prompt(passage, s) for s in said]
    # The probe, about the same passage and statement, sends the same prompt.
    judge.prompts.clear()
    pair = ProbePair(SUPPORTED, 1, statement_prompt(passage, "It rises twice."), "oven",
                     "It rises twice.", passage)  # fmt: skip
    probed = calibrate(judge, [pair], min_kappa=0.4, timeout_s=5)
    assert judge.prompts == [asked[1]] and probed.verdicts == [0]

    said["It rises twice."] = '{"verdict": "maybe"}'
    asyncio.run(Judge(Verdicts(said), onnx_embedder, timeout_s=5, max_tokens=1536,
                      claims="generated").judge(row, item))  # fmt: skip
    faithfulness = row.judged["faithfulness"]
    assert (faithfulness.value, faithfulness.status) == (None, FAILED)
    assert faithfulness.reason == (
        'ValueError: no verdict for statement 2 of 3 in \'{"verdict": "maybe"}\''
    )
    with pytest.raises(ValueError, match="verdicts must be one of"):
        Judge(judge, onnx_embedder, timeout_s=5, max_tokens=1536, verdicts="nli")


def test_an_answers_claims_are_its_own_sentences() -> None:
    """eval.faithfulness_claims: sentences judges what the answer says, sentence by
    sentence, as written: markdown's list markers, emphasis and code marks and the [n]
    citations out (not a code span's text, nor R's x[1]); headings, rules and a trailing
    sources list left out; a piece under 3 words joined to the next; a code block to the
    sentence that shows it; a sentence a blank line broke mended; a repeat counted once."""
    from ragpipe.evaluation.rag import answer_claims

    answer = (
        "## Installing\n\n"
        'To install a package, type\n\n```\ninstall.packages("x")\n```\n\n'
        "at the R prompt [1]. It needs **write access** to the library [2], [3].\n\n"
        "1. *Windows*:\n   - Binaries come from CRAN [1].\n"
        "2. Unix-like: build it from\n   source with R CMD INSTALL.\n\n"
        "It needs write access to the library.\n"
        "Ask an admin to grant it."
    )
    assert answer_claims(answer) == [
        'To install a package, type install.packages("x") at the R prompt.',
        "It needs write access to the library.",
        "Windows: Binaries come from CRAN.",
        "Unix-like: build it from source with R CMD INSTALL.",
        "Ask an admin to grant it.",
    ]
    assert answer_claims("Yes. R runs on Unix [1]. See CRAN for it. Done.") == [
        "Yes. R runs on Unix.", "See CRAN for it. Done."
    ]  # fmt: skip
    # a code block the answer's end left open stands alone
    assert answer_claims("Check it with this command:\n```\nR CMD check x\n") == [
        "Check it with this command:", "R CMD check x"
    ]  # fmt: skip
    assert answer_claims("") == []
    # Code spans keep their text: R's x[1] is indexing, ```x``` inline is no fence.
    assert answer_claims(
        "In R, `x[[1]]` and x[1] <- NULL differ [1][2].\n\n```library()``` lists packages.\n"
        "It is in base R [3-4]."
    ) == ["In R, x[[1]] and x[1] <- NULL differ.", "library() lists packages.",
          "It is in base R."]  # fmt: skip
    # The citation forms the answer's check reads are no part of a claim either.
    assert answer_claims(
        "Paris is big 【1，2】. Rome is old [Sources 2, 3]. Oslo is cold [1—3]."
    ) == ["Paris is big.", "Rome is old.", "Oslo is cold."]
    # ... while a bracket no source could be stays a claim's text, as generate keeps it.
    assert answer_claims("Values lie in [0—1]. Years [2020—2021] matter [1].") == [
        "Values lie in [0—1].", "Years [2020—2021] matter."
    ]  # fmt: skip
    # A "[0]" where a citation stands cites source 0, as generate reads it: no claim's text.
    assert answer_claims("Bread bakes for 35 minutes [0]. Values lie in [0, 1] [1].") == [
        "Bread bakes for 35 minutes.", "Values lie in [0, 1]."
    ]  # fmt: skip
    # Headings, rules and table delimiters make no claim; a table row is one; a quote's
    # lines are one paragraph; a "2." inside a paragraph is no list; the sources listed
    # after the answer are no claim.
    assert answer_claims(
        "## How to install R on Windows\nDownload the installer from CRAN.\n---\n"
        "> R is a language and environment\n> for statistical computing.\n\n"
        "| package | what it does |\n|---|---|\n| stats4 | S4 statistical functions |\n\n"
        "The answer is\n2. That is all of them.\n\nSources:\n[1] R FAQ, section 2.1"
    ) == [
        "Download the installer from CRAN.",
        "R is a language and environment for statistical computing.",
        "package; what it does",
        "stats4; S4 statistical functions",
        "The answer is 2.",
        "That is all of them.",
    ]
    # A label said twice heads both lists, even over the same sentence; a short sentence
    # said twice in a row counts once.
    assert answer_claims("1. **Win**:\n - Use the installer.\n2. **Win**:\n - Or the zip.") == [
        "Win: Use the installer.", "Win: Or the zip."
    ]  # fmt: skip
    twice = "On Windows:\n- Run the installer.\n\nOn macOS:\n- Run the installer."
    assert answer_claims(twice) == [
        "On Windows: Run the installer.", "On macOS: Run the installer."
    ]  # fmt: skip
    assert answer_claims("- Free software.\n- Free software.") == ["Free software."]
    # Code is not emphasis; a citation's emptied parentheses go; a heading ends a sentence.
    assert answer_claims("Then 2**3 is 8 (see [1]).\n\n## Next\nlower case starts this one.") == [
        "Then 2**3 is 8.", "lower case starts this one."
    ]  # fmt: skip
    assert answer_claims("R is free software.\n\nSource: [1]") == ["R is free software."]


def test_the_hand_labelled_answer_sentences_are_the_claims_faithfulness_judges() -> None:
    """bench/faithfulness_claims.py measures the judge on 112 sentences of 19 real answers
    labelled by hand: they must be the very claims faithfulness asks about (a change to
    answer_claims changes them), and the docs' hand mean is theirs: 10 unsupported, in 7
    answers, (19 - 1/19 - 1/15 - 1/9 - 3/5 - 1/4 - 2/3 - 1/2) / 19 = 0.882."""
    from ragpipe.evaluation.rag import answer_claims

    path = Path(__file__).parents[1] / "bench" / "results" / "faithfulness_hand_labels.json"
    items = json.loads(path.read_text(encoding="utf-8"))["items"]
    for item in items:
        assert [s["sentence"] for s in item["sentences"]] == answer_claims(item["answer"])
        assert all(s["supported"] in (0, 1) for s in item["sentences"])
        assert all("why" in s for s in item["sentences"] if s["supported"] == 0)
    labels = [s["supported"] for i in items for s in i["sentences"]]
    assert (len(items), len(labels), labels.count(0)) == (19, 112, 10)
    shares = [sum(s["supported"] for s in i["sentences"]) / len(i["sentences"]) for i in items]
    by_hand = (19 - 1 / 19 - 1 / 15 - 1 / 9 - 3 / 5 - 1 / 4 - 2 / 3 - 1 / 2) / 19
    assert sum(shares) / len(shares) == pytest.approx(by_hand)
    assert round(by_hand, 3) == 0.882


def test_faithfulness_judges_the_answers_sentences_by_default(onnx_embedder: Any) -> None:
    """By default each of the answer's sentences is asked the statement call, with no
    statement generator call (the judge's longest): verdicts 1, 0, 1 are 2/3; the claims
    "generated" (ragas's statements) are asked for in words; an unknown way is refused."""
    import typing

    from ragpipe.config import EvalConfig
    from ragpipe.evaluation.calibration import statement_prompt
    from ragpipe.evaluation.golden import GoldenItem
    from ragpipe.evaluation.rag import CLAIMS, Judge, RagRow

    said = {"Bake it for 35 minutes.": '{"verdict": 1}', "It rises twice.": '{"verdict": 0}',
            "The oven is hot.": '{"verdict": 1}'}  # fmt: skip
    contexts = ["Bake the loaf for thirty-five minutes.", "Preheat the oven to 230 degrees."]
    item = GoldenItem("oven", "How long should bread bake?", {"bread.md": 1})
    row = RagRow("oven", item.query, "Bake it for 35 minutes [1]. It rises twice.\n\n"
                 "- **The oven** is hot [2].", False, contexts, 2, [], 0, 0, 0.0)  # fmt: skip
    judge = Verdicts(said)
    scorer = Judge(judge, onnx_embedder, timeout_s=5, max_tokens=1536)
    assert scorer.faithfulness_verdicts == (
        "statement prompt, one call a claim; claims: the answer's sentences"
    )
    asyncio.run(scorer.judge(row, item))
    assert row.judged["faithfulness"].value == pytest.approx(2 / 3)
    passage = "\n".join(contexts)
    assert [p for p in judge.prompts if p.startswith("Does the passage say everything")] == [
        statement_prompt(passage, s) for s in said
    ]
    assert not [p for p in judge.prompts if p.startswith("Given a question and an answer")]
    assert EvalConfig().faithfulness_claims == "sentences"
    assert typing.get_args(EvalConfig.model_fields["faithfulness_claims"].annotation) == CLAIMS
    with pytest.raises(ValueError, match="claims must be one of"):
        Judge(judge, onnx_embedder, timeout_s=5, max_tokens=1536, claims="atoms")
    # An answer with no sentence (headings and citations only) is no score of 1 or 0.
    row.answer = "## Bread\n\n[1] [2]"
    asyncio.run(scorer.judge(row, item))
    judged = row.judged["faithfulness"]
    assert (judged.value, judged.status) == (None, FAILED)
    assert judged.reason == "ValueError: the answer holds no sentence to judge"


class Slow(Verdicts):
    """``Verdicts`` on one model (a lock, as llama.cpp's), slow on one statement."""

    def __init__(self, said: dict[str, str], slow: str, seconds: float) -> None:
        super().__init__(said)
        self.slow, self.seconds, self.lock = slow, seconds, threading.Lock()

    def chat(self, messages: Any, **kwargs: Any) -> Completion:
        with self.lock:
            if f"Statement: {self.slow}\n" in messages[0]["content"]:
                time.sleep(self.seconds)
            return super().chat(messages, **kwargs)


def test_a_judge_call_past_its_time_is_waited_out_before_the_next_metric(
    onnx_embedder: Any,
) -> None:
    """The review: faithfulness's call ran past judge_timeout_s and went on holding the
    model; the next metrics' clocks ran while they waited for it, and context recall, its
    own prompt answered at once, failed 'timeout after 1s' too (both failures counted
    towards withholding). The next metric now starts once the call has ended; the probe
    does the same."""
    from ragpipe.evaluation.calibration import ProbePair, Settling, _ask, statement_prompt
    from ragpipe.evaluation.golden import GoldenItem
    from ragpipe.evaluation.rag import Judge, RagRow

    said = {"Bake it for 35 minutes.": '{"verdict": 1}', "It rises twice.": '{"verdict": 0}',
            "Bread bakes for 35 minutes.": '{"verdict": 1}'}  # fmt: skip
    contexts = ["Bake the loaf for thirty-five minutes.", "Preheat the oven to 230 degrees."]
    item = GoldenItem("oven", "How long should bread bake?", {"bread.md": 1},
                      expected_answer="Bread bakes for 35 minutes.")  # fmt: skip
    row = RagRow("oven", item.query, "Bake it for 35 minutes [1]. It rises twice.", False,
                 contexts, 2, [], 0, 0, 0.0)  # fmt: skip
    judge = Slow(said, "Bake it for 35 minutes.", 2.5)  # 1.5 s past its time
    asyncio.run(Judge(judge, onnx_embedder, timeout_s=1, max_tokens=1536).judge(row, item))
    judged = {m: (j.value, j.status, j.reason) for m, j in row.judged.items()}
    # Waited out for 1 s more (judge_timeout_s), the call still ran; the next metric's
    # clock started then, and the model was free 0.5 s later.
    late = "timeout after 1s; the call still ran 1s later, and holds the model"
    assert judged["faithfulness"] == (None, FAILED, late)
    assert judged["context_recall"] == (1.0, OK, None)
    assert judged["answer_relevancy"][1] == judged["context_precision"][1] == OK
    # The calibration probe: a pair past its time, then one asked at once.
    slow = Settling(Slow({"It is hot.": '{"verdict": 1}', "It is cold.": '{"verdict": 0}'},
                         "It is hot.", 2.5))  # fmt: skip
    pairs = [ProbePair("supported", truth, statement_prompt("The oven is hot.", shown),
                       "oven", shown, passage="The oven is hot.")
             for truth, shown in ((1, "It is hot."), (0, "It is cold."))]  # fmt: skip
    assert asyncio.run(_ask(slow, pairs[0], 1.0, 64)) == (None, late)
    assert asyncio.run(_ask(slow, pairs[1], 1.0, 64)) == (0, None)


def test_a_served_judges_verdicts_are_grouped_by_the_claims_length() -> None:
    """A served judge writes every verdict of a group in one reply, each repeating its
    statement: an answer's sentence is not bounded as ragas's statements are (a code
    listing ran to 766 characters), so a long one takes a bigger share of the reply. By
    hand at 1536 tokens: 20 short claims go 10 and 10 (150 tokens each); 766 characters
    cost 150 + 526 / 3 = 325.3 tokens, 4 fit (1301), then a short one (1451), then 2."""
    from ragpipe.evaluation.rag import reply_groups

    assert [len(g) for g in reply_groups(["Bread rises."] * 20, 1536)] == [10, 10]
    long, short = "x" * 766, "Bread rises."
    assert [len(g) for g in reply_groups([long] * 4 + [short] * 3, 1536)] == [5, 2]
    assert reply_groups([long * 5], 300) == [[long * 5]]  # alone, whatever its size
    assert reply_groups([], 1536) == []
    # never a list at the grammar's bound (24): 30 claims at 4,000 tokens go 23 and 7
    assert [len(g) for g in reply_groups([short] * 30, 4000)] == [23, 7]


class Contexts(Verdicts):
    """``Verdicts``, and ``useful[passage]`` (a JSON reply) to context precision's short
    prompt about each context."""

    def __init__(self, said: dict[str, str], useful: dict[str, str]) -> None:
        super().__init__(said)
        self.useful = useful

    def chat(self, messages: Any, **kwargs: Any) -> Completion:
        prompt = messages[0]["content"]
        if prompt.startswith("Does the passage contain any of the information"):
            self.prompts.append(prompt)
            passage = prompt.split("Passage:\n", 1)[1].rsplit("\n\nReply with JSON", 1)[0]
            return Completion(self.useful[passage], 9, 5, self.name, 0.0, "stop")
        return super().chat(messages, **kwargs)


def test_context_precision_and_recall_ask_short_calls_as_the_probe_asks(
    onnx_embedder: Any,
) -> None:
    """By default context precision asks each context CONTEXT_PROMPT (the question and
    the reference, then the passage) for a bare verdict, and context recall asks each of
    the reference's sentences as faithfulness asks a statement, against the contexts
    joined as faithfulness joins them, right after faithfulness (one passage for the prompt
    cache). By hand: verdicts 0, 1, 1 over three contexts give average precision
    (1/2 + 2/3) / 2 = 7/12; 2 of the reference's 3 sentences supported give 2/3. The
    probe's context pair sends the prompt context precision sends."""
    from ragpipe.evaluation.calibration import (
        USEFUL,
        ProbePair,
        calibrate,
        context_prompt,
        statement_prompt,
    )
    from ragpipe.evaluation.golden import GoldenItem
    from ragpipe.evaluation.rag import Judge, RagRow, reference_sentences

    contexts = ["Preheat the oven to 230 degrees.", "Bake the loaf for thirty-five minutes.",
                "Let the dough rise twice, an hour each time."]  # fmt: skip
    reference = "Bake the loaf for 35 minutes. Let it rise twice. Serve it with butter."
    sentences = ["Bake the loaf for 35 minutes.", "Let it rise twice.", "Serve it with butter."]
    assert reference_sentences(reference) == sentences
    said = dict.fromkeys(sentences[:2], '{"verdict": 1}') | {sentences[2]: '{"verdict": 0}'}
    useful = {contexts[0]: '{"verdict": 0}', contexts[1]: '{"verdict": 1}',
              contexts[2]: '{"verdict": 1}'}  # fmt: skip
    item = GoldenItem("oven", "How long should bread bake?", {"bread.md": 1},
                      expected_answer=reference)  # fmt: skip
    row = RagRow("oven", item.query, "Bake the loaf for 35 minutes [2]. Let it rise twice. "
                 "Serve it with butter.", False, contexts, 1, [], 0, 0, 0.0)  # fmt: skip
    judge = Contexts(said, useful)
    asyncio.run(Judge(judge, onnx_embedder, timeout_s=5, max_tokens=1536).judge(row, item))
    assert row.judged["context_precision"].value == pytest.approx(7 / 12)
    assert row.judged["context_recall"].value == pytest.approx(2 / 3)
    passage = "\n".join(contexts)
    statements = [statement_prompt(passage, s) for s in said]
    # Faithfulness's three claims (the answer's sentences), then recall's three sentences,
    # one passage; answer relevancy's question; then the three contexts, in rank order.
    assert judge.prompts[:6] == statements + statements
    assert judge.prompts[-3:] == [context_prompt(item.query, reference, c) for c in contexts]
    pair = ProbePair(USEFUL, 1, context_prompt(item.query, reference, contexts[1]), "oven",
                     contexts[1], contexts[1], item.query, reference)  # fmt: skip
    judge.prompts.clear()
    probed = calibrate(judge, [pair], min_kappa=0.4, timeout_s=5)
    assert judge.prompts == [pair.prompt] and probed.verdicts == [1]

    useful[contexts[1]] = '{"verdict": "maybe"}'
    said[sentences[2]] = "Yes."
    asyncio.run(Judge(Contexts(said, useful), onnx_embedder, timeout_s=5, max_tokens=1536)
                .judge(row, item))  # fmt: skip
    precision, recall = row.judged["context_precision"], row.judged["context_recall"]
    assert (precision.value, precision.status, recall.value, recall.status) == (
        None, FAILED, None, FAILED)  # fmt: skip
    assert precision.reason == (
        'ValueError: no verdict for context 2 of 3 in \'{"verdict": "maybe"}\''
    )
    assert recall.reason == "ValueError: no verdict for the reference's sentence 3 of 3 in 'Yes.'"

    # eval.judge_verdicts: ragas: ragas's prompt, a reason before the verdict, in the metric
    # and in the probe alike.
    ragas_way = Contexts(said, useful)
    asyncio.run(Judge(ragas_way, onnx_embedder, timeout_s=5, max_tokens=1536,
                      verdicts="ragas").judge(row, item))  # fmt: skip
    assert row.judged["context_precision"].value == pytest.approx(1.0)
    sent = [p for p in ragas_way.prompts if "verify if the context was useful" in p]
    assert len(sent) == 3 and not any(p.startswith("Does the passage") for p in ragas_way.prompts)
    ragas_way.prompts.clear()
    calibrate(ragas_way, [pair], min_kappa=0.4, timeout_s=5, way="ragas")
    assert ragas_way.prompts == [sent[1]]


def test_too_few_context_pairs_say_why_and_a_blank_reference_is_none(
    scored_config: RagpipeConfig, onnx_embedder: Any
) -> None:
    """A probe of 8 pairs has 2 context pairs: context precision is not calibrated, and the
    run's warnings say what the pairs need. A blank expected_answer is no reference: context
    recall is not applicable (it divided by zero sentences)."""
    from ragpipe.evaluation.golden import GoldenItem
    from ragpipe.evaluation.rag import Judge, RagRow

    golden = load_golden(scored_config.eval.golden)
    evaluation = scored_config.eval.model_copy(update={"judge_probe_size": 8})
    config = scored_config.model_copy(update={"eval": evaluation})
    result = run_rag_eval(config, golden, generator=SCRIPT, judge_llm=YES,
                          embedder=onnx_embedder, limit=1)  # fmt: skip
    assert result.calibration is not None
    assert result.calibration.by_judgement["contexts"].n == 2
    # Too few of its own pairs to decide; the yes-man failed the probe as a whole, which
    # withholds it (distrust carries over, trust does not).
    assert result.calibration.reliable_for("context_precision") is False
    assert "contexts" in result.calibration.uncalibrated
    said = [w for w in result.warnings if "context pair(s), fewer than 6" in w]
    assert said == [
        "the calibration probe has 2 context pair(s), fewer than 6: context precision cannot be "
        "calibrated (each pair needs an answerable item whose target chunk of 12+ words holds "
        "half its expected_answer's words, and a third of eval.judge_probe_size 8, rounded "
        "down to even, must be 6 or more: 18 pairs or more)"
    ]
    item = GoldenItem("oven", "How long should bread bake?", {"bread.md": 1},
                      expected_answer="  \n ")  # fmt: skip
    row = RagRow("oven", item.query, "Bake it for 35 minutes [1].", False,
                 ["Bake the loaf for thirty-five minutes."], 1, [], 0, 0, 0.0)  # fmt: skip
    asyncio.run(Judge(YES, onnx_embedder, timeout_s=5, max_tokens=1536).judge(row, item))
    recall = row.judged["context_recall"]
    assert (recall.status, recall.reason) == (NOT_APPLICABLE, "no expected_answer")
    assert row.context_precision_kind == "without_reference"


def test_reference_sentences_keep_short_pieces_with_a_neighbour() -> None:
    from ragpipe.evaluation.rag import reference_sentences

    assert reference_sentences("Yes. R runs on Unix. See e.g. CRAN for binaries.") == [
        "Yes. R runs on Unix.", "See e.g. CRAN for binaries."]  # fmt: skip
    assert reference_sentences("Call install.packages() there.\nIt is  in utils.") == [
        "Call install.packages() there.", "It is in utils."]  # fmt: skip
    assert reference_sentences("It is 3.2.1.") == ["It is 3.2.1."]
    assert reference_sentences("Done. Ok.") == ["Done. Ok."]


class Scripted:
    """A greedy judge that continues replies: statements for the statement prompt, a reply
    cut at its token limit for every verdict, one question for answer relevancy."""

    name = "scripted"
    takes_grammar = True
    continues_reply = True
    temperature = 0.0

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def chat(self, messages: Any, **kwargs: Any) -> Completion:
        self.prompts.append(messages[0]["content"])
        if messages[-1]["role"] == "assistant":  # a verdict, cut short
            return Completion(messages[-1]["content"] + "The context", 9, 2, self.name, 0.0,
                              "length")  # fmt: skip
        if '"noncommittal"' in messages[0]["content"]:
            reply = '{"question": "How long should bread bake?", "noncommittal": 0}'
        else:
            reply = '{"statements": ["Bread bakes for 35 minutes."]}'
        return Completion(reply, 9, 9, self.name, 0.0)

    def count_tokens(self, text: str) -> int:
        return len(text) // 4


def test_a_verdict_cut_at_its_limit_fails_faithfulness_and_a_greedy_judge_asks_once(
    onnx_embedder: Any,
) -> None:
    from ragpipe.evaluation.golden import GoldenItem
    from ragpipe.evaluation.rag import Judge, RagRow

    scripted = Scripted()
    judge = Judge(
        scripted, onnx_embedder, timeout_s=5, max_tokens=64, verdicts="ragas", claims="generated"
    )
    assert (judge.prefill, judge.questions) == (True, 1)
    assert judge.faithfulness_verdicts == "ragas, prefilled; claims: ragas's statements"
    item = GoldenItem("oven", "How long should bread bake?", {"bread.md": 1})
    row = RagRow("oven", item.query, "Bake it for 35 minutes [1].", False,
                 ["Bake the loaf for thirty-five minutes."], 1, [], 0, 0, 0.0)  # fmt: skip
    asyncio.run(judge.judge(row, item))
    faithfulness = row.judged["faithfulness"]
    assert (faithfulness.value, faithfulness.status) == (None, FAILED)
    assert faithfulness.reason == "ValueError: verdict 1 cut at 192 tokens"
    # at temperature 0, ragas's three questions would be one question three times
    assert sum('"noncommittal"' in p for p in scripted.prompts) == 1
    assert row.judged["answer_relevancy"].status == OK
    hot = Scripted()
    hot.temperature = 0.7
    assert Judge(hot, onnx_embedder, timeout_s=5, max_tokens=64).questions == 3


class Short:
    """A judge writing all verdicts in one reply, as the 1.5B did: two statements, one
    verdict."""

    name = "short"
    takes_grammar = False
    temperature = 0.0

    def chat(self, messages: Any, **kwargs: Any) -> Completion:
        prompt = messages[0]["content"]
        if '"noncommittal"' in prompt:
            reply = '{"question": "How long should bread bake?", "noncommittal": 0}'
        elif "verdict" in prompt and "Bread bakes for 35 minutes." in prompt.split("--")[-1]:
            reply = ('{"statements": [{"statement": "Bread bakes for 35 minutes.", '
                     '"reason": "said", "verdict": 1}]}')  # fmt: skip
        else:
            reply = '{"statements": ["Bread bakes for 35 minutes.", "It rises twice."]}'
        return Completion(reply, 9, 9, self.name, 0.0)

    def count_tokens(self, text: str) -> int:
        return len(text) // 4


def test_fewer_verdicts_than_statements_fail_faithfulness_not_score_a_subset(
    onnx_embedder: Any,
) -> None:
    """ragas scores whatever verdicts come back: 1 verdict of 1 for 2 statements scored
    faithfulness 1.0, said of an answer half unjudged."""
    from ragpipe.evaluation.golden import GoldenItem
    from ragpipe.evaluation.rag import Judge, RagRow

    judge = Judge(
        Short(), onnx_embedder, timeout_s=5, max_tokens=1536, verdicts="ragas", claims="generated"
    )
    assert judge.prefill is False
    assert judge.faithfulness_verdicts == "ragas, one reply; claims: ragas's statements"
    item = GoldenItem("oven", "How long should bread bake?", {"bread.md": 1})
    row = RagRow("oven", item.query, "Bake it for 35 minutes; it rises twice [1].", False,
                 ["Bake the loaf for thirty-five minutes."], 1, [], 0, 0, 0.0)  # fmt: skip
    asyncio.run(judge.judge(row, item))
    faithfulness = row.judged["faithfulness"]
    assert (faithfulness.value, faithfulness.status) == (None, FAILED)
    assert faithfulness.reason == (
        "ValueError: 1 verdicts for 2 statements: a score over some of them is not the answer's"
    )


class Listing:
    """A one-reply judge that splits the answer into ``claims`` statements (all supported)
    and the reference into ``claims`` sentences (all attributed), as a judge writing under
    the grammar's item bound would at that bound."""

    name = "listing"
    takes_grammar = False
    temperature = 0.0

    def __init__(self, claims: int) -> None:
        self.claims = claims

    def chat(self, messages: Any, **kwargs: Any) -> Completion:
        prompt = messages[0]["content"]
        items = [f"Bread fact {i}." for i in range(self.claims)]
        if '"noncommittal"' in prompt:
            reply: Any = {"question": "How long should bread bake?", "noncommittal": 0}
        elif prompt.startswith("Given a context and an answer"):  # context recall
            reply = {"classifications": [{"statement": s, "reason": "said", "attributed": 1}
                                         for s in items]}  # fmt: skip
        elif prompt.startswith("Does the passage say everything the statement says?"):  # a verdict
            reply = {"verdict": 1}
        elif prompt.startswith("Given a question and an answer"):  # the statements
            reply = {"statements": items}
        else:  # context precision
            reply = {"reason": "useful", "verdict": 1}
        return Completion(json.dumps(reply), 9, 9, self.name, 0.0)

    def count_tokens(self, text: str) -> int:
        return len(text) // 4


@pytest.mark.parametrize("claims", [2, 3, 4])
def test_a_list_at_the_grammars_item_bound_fails_not_scores_the_first_items(
    onnx_embedder: Any, monkeypatch: pytest.MonkeyPatch, claims: int
) -> None:
    """The grammar closes every list the judge writes at MAX_STATEMENTS items: an answer of
    more claims (or a reference of more sentences) was scored on its first ones, in silence.
    A list at the bound is a failure with the reason; under it, or past it (a judge that
    ignores the bound wrote every item), the score stands. The bound is 3 here."""
    import ragpipe.evaluation.rag as rag
    from ragpipe.evaluation.golden import GoldenItem
    from ragpipe.evaluation.rag import Judge, RagRow

    monkeypatch.setattr(rag, "MAX_STATEMENTS", 3)
    judge = Judge(Listing(claims), onnx_embedder, timeout_s=5, max_tokens=1536, claims="generated")
    item = GoldenItem("oven", "How long should bread bake?", {"bread.md": 1},
                      expected_answer="Bake it for 35 minutes. Let it rise twice.")  # fmt: skip
    row = RagRow("oven", item.query, "Bake it for 35 minutes; it rises twice [1].", False,
                 ["Bake the loaf for thirty-five minutes."], 1, [], 0, 0, 0.0)  # fmt: skip
    asyncio.run(judge.judge(row, item))
    faithfulness = row.judged["faithfulness"]
    # By default the reference's two sentences are asked one call each: no list to cut.
    assert (row.judged["context_recall"].value, row.judged["context_recall"].status) == (1.0, OK)
    # ragas's context recall classifies the reference's sentences in one list.
    ragas_way = Judge(Listing(claims), onnx_embedder, timeout_s=5, max_tokens=1536,
                      verdicts="ragas")  # fmt: skip
    recall = asyncio.run(ragas_way._one(ragas_way.context_recall, "context_recall",
                                        user_input=item.query, retrieved_contexts=row.contexts,
                                        reference=item.expected_answer))  # fmt: skip
    if claims == 3:
        for judged, key in ((faithfulness, "statements"), (recall, "classifications")):
            assert (judged.value, judged.status) == (None, FAILED)
            assert judged.reason == (
                f"ValueError: the judge's {key!r} list holds 3 items, the most its grammar "
                "allows: it may be cut there, and a score over those items would be said of "
                "more than was judged"
            )
    else:
        assert (faithfulness.value, faithfulness.status) == (1.0, OK)
        assert (recall.value, recall.status) == (1.0, OK)
    assert row.judged["context_precision"].status == OK


class Budgeted:
    """A served judge (one reply, no prefill) that splits the answer into ``claims``
    statements, every fourth one unsupported, and writes ``per_verdict`` tokens a verdict:
    a reply that would run past its ``max_tokens`` is cut there, as a server cuts it."""

    name = "budgeted"
    takes_grammar = False
    temperature = 0.0

    def __init__(self, claims: int, per_verdict: int) -> None:
        self.claims, self.per_verdict = claims, per_verdict
        self.groups: list[int] = []

    def chat(self, messages: Any, **kwargs: Any) -> Completion:
        prompt = messages[0]["content"]
        if prompt.startswith("Your task is to judge the faithfulness"):
            asked = json.loads(verdicts_json(prompt, 1))["statements"]
            self.groups.append(len(asked))
            said = [{**v, "verdict": int(int(v["statement"][11:-1]) % 4 != 0)} for v in asked]
            reply = json.dumps({"statements": said})
            if len(asked) * self.per_verdict > kwargs["max_tokens"]:
                return Completion(reply[: len(reply) // 2], 9, kwargs["max_tokens"],
                                  self.name, 0.0, "length")  # fmt: skip
            return Completion(reply, 9, len(asked) * self.per_verdict, self.name, 0.0, "stop")
        if '"noncommittal"' in prompt:
            reply = json.dumps({"question": "How long should bread bake?", "noncommittal": 0})
        else:  # the statements
            reply = json.dumps({"statements": [f"Bread fact {i}." for i in range(self.claims)]})
        return Completion(reply, 9, 9, self.name, 0.0, "stop")

    def count_tokens(self, text: str) -> int:
        return len(text) // 4


def test_a_served_judge_is_asked_its_verdicts_in_groups_that_fit_one_reply(
    onnx_embedder: Any,
) -> None:
    """An answer of 20 statements at 77 tokens a verdict (the 1.5B's rate) ran past
    judge_max_tokens (1536) in one reply, and its faithfulness was lost as cut JSON. Asked
    10 at a time, it is scored: 15 of 20 supported. A reply cut anyway says so."""
    from ragpipe.evaluation.golden import GoldenItem
    from ragpipe.evaluation.rag import Judge, RagRow, reply_groups

    claims = [f"Bread fact {i}." for i in range(20)]
    assert [len(g) for g in reply_groups(claims, 1536)] == [10, 10]
    assert [len(g) for g in reply_groups(claims[:4], 300)] == [2, 2]
    assert [len(g) for g in reply_groups(claims[:2], 64)] == [1, 1]
    item = GoldenItem("oven", "How long should bread bake?", {"bread.md": 1})
    row = RagRow("oven", item.query, "Bake it for 35 minutes; it rises twice [1].", False,
                 ["Bake the loaf for thirty-five minutes."], 1, [], 0, 0, 0.0)  # fmt: skip
    served = Budgeted(claims=20, per_verdict=77)
    asyncio.run(Judge(served, onnx_embedder, timeout_s=5, max_tokens=1536,
                      verdicts="ragas", claims="generated").judge(row, item))  # fmt: skip
    assert served.groups == [10, 10]
    assert (row.judged["faithfulness"].value, row.judged["faithfulness"].status) == (0.75, OK)

    wordy = Budgeted(claims=3, per_verdict=200)
    asyncio.run(Judge(wordy, onnx_embedder, timeout_s=5, max_tokens=160,
                      verdicts="ragas", claims="generated").judge(row, item))  # fmt: skip
    assert wordy.groups == [1]
    faithfulness = row.judged["faithfulness"]
    assert (faithfulness.value, faithfulness.status) == (None, FAILED)
    assert faithfulness.reason == (
        "ValueError: the judge's reply was cut at 160 tokens (eval.judge_max_tokens): raise "
        "it, or judge with a model that writes less"
    )


def test_a_runs_item_selection_is_said_in_words() -> None:
    from ragpipe.evaluation.rag import item_selection

    assert item_selection(40, 40, None, 7) == "all 40 items"
    assert item_selection(40, 10, None, 7) == "the first 10 of 40 items (--limit)"
    assert item_selection(40, None, 10, 7) == (
        "a sample of 10 of 40 items (seed 7; every item equally likely, strata in proportion)"
    )
    assert item_selection(40, 20, 10, 3) == (
        "a sample of 10 of the first 20 of 40 items (seed 3; every item equally likely, "
        "strata in proportion)"
    )


def test_a_withheld_metric_has_no_mean_in_summary_json() -> None:
    # The attack review: report.md said "judge unreliable" while summary.json's .mean held
    # the judge's 0.925 for any script to read.
    from ragpipe.evaluation.metrics import bootstrap_ci
    from ragpipe.evaluation.run import stats

    ci = bootstrap_ci([0.85, 0.9, 0.95, 1.0] * 3, 200, 0)
    assert ci.mean == pytest.approx(0.925) and ci.has_ci
    shown = stats(ci, failed=1, flag="judge unreliable (kappa 0.10)", withheld=True)
    assert (shown["mean"], shown["ci_low"], shown["ci_high"]) == (None, None, None)
    assert (shown["n"], shown["n_failed"], shown["withheld"]) == (12, 1, True)
    assert shown["flag"] == "judge unreliable (kappa 0.10)"
    kept = stats(ci)
    assert kept["mean"] == pytest.approx(0.925) and kept["ci_low"] is not None


def test_an_answer_metric_that_could_not_score_most_replies_is_flagged(
    rag_config: RagpipeConfig, tmp_path: Path
) -> None:
    """The attack review: ten unanswerable questions, two refused with the not-found
    sentence, eight hedged in other words (which the refusal metrics cannot score): the
    headline said "correct_refusal 1.000 (n=2, 8 failed)" and history kept 1.0, a model
    that refuses well. Past eval.max_judge_failure_share (20%) it is flagged and no trend
    point; at 2 of 10 it is not."""
    import types

    from ragpipe.evaluation.golden import GoldenItem, GoldenSet
    from ragpipe.evaluation.rag import ALL_RAG_METRICS, Judged, RagRow, _result
    from ragpipe.evaluation.report import headline_cell
    from ragpipe.evaluation.run import read_history

    items = [GoldenItem(f"q{i}", f"question {i}?", {}, answerable=False) for i in range(10)]
    golden = GoldenSet("refusals", items, "", "refusals.yaml")
    judge = types.SimpleNamespace(classes=["x"], faithfulness_verdicts="statement",
                                  verdicts="statement", context_verdicts="statement",
                                  questions=1)  # fmt: skip
    hedge = Judged(None, FAILED, "the reply says the sources lack the answer, not in the form")

    def run(refused: int) -> Any:
        rows = []
        for i, item in enumerate(items):
            row = RagRow(item.id, item.query, "x", i < refused, [], 0, [], 1, 1, 0.1,
                         answerable=False)  # fmt: skip
            row.judged = {m: Judged(None, NOT_APPLICABLE, "answerable: false")
                          for m in ALL_RAG_METRICS}  # fmt: skip
            row.judged["degenerate"] = Judged(0.0, OK)
            row.judged["correct_refusal"] = Judged(1.0, OK) if i < refused else hedge
            rows.append(row)
        model = types.SimpleNamespace(name="m")
        result = _result(rag_config, golden, "refusals", rows, judge, model, model, None, [], {})
        result.selection = "all 10 items"
        summary = rag_summary(result, rag_config, {"files": 1, "points": 1, "sha256": "x"})
        table = rag_table(result)
        return write_run(summary, table, tmp_path / f"refused-{refused}"), table

    hedged, table = run(refused=2)
    assert headline_cell(hedged.metrics["rag"]["correct_refusal"]) == (
        "1.000 (n=2, no CI: under 10, 8 failed); 8 of 10 could not be scored (> 20%): "
        "the mean is over the rest only"
    )
    assert hedged.metrics["rag"]["degenerate"].get("flag") is None  # scored on all ten
    trend = {r["metric"] for r in read_history(tmp_path / "refused-2")}
    assert "degenerate" in trend and "correct_refusal" not in trend
    # The per-question view says it beside each score too (the review: a flagged metric's
    # scores were shown there as plain values).
    from ragpipe.evaluation.report import drill_down

    page = drill_down(hedged, table)
    flag = "8 of 10 could not be scored (&gt; 20%): the mean is over the rest only"
    assert f"<li>correct_refusal: 1.000 <i>(flagged: {flag})</i></li>" in page
    assert (
        "<li>correct_refusal: failed <i>(the reply says the sources lack the answer, not in "
        f"the form)</i> <i>(flagged: {flag})</i></li>"
    ) in page
    assert "<li>degenerate: 0.000</li>" in page
    # Two of ten unscored: 20%, not over it: a value and a trend point, its failures shown.
    most, _ = run(refused=8)
    assert headline_cell(most.metrics["rag"]["correct_refusal"]) == (
        "1.000 (n=8, no CI: under 10, 2 failed)"
    )
    assert "correct_refusal" in {r["metric"] for r in read_history(tmp_path / "refused-8")}


def test_a_judged_metric_shares_a_trend_only_with_runs_of_the_same_judge(tmp_path: Path) -> None:
    """The attack review: faithfulness by one judge model (or prompt, or ragas) and by
    another shared one trend line: two instruments read as one history. A judged metric's
    history row names the judge (model, and a hash of the settings that make its verdicts);
    the answer metrics' rows name none; the scope (which items, what depth) is the same
    for both, so `ragpipe report` keeps one table per run."""
    import types

    from ragpipe.evaluation.report import trend_series
    from ragpipe.evaluation.run import append_history, judge_identity, read_history

    judge = {"model": "qwen2.5-coder-1.5b", "temperature": 0.0, "ragas": "0.3.9",
             "metric_classes": ["Faithfulness"], "faithfulness_verdicts": "statement",
             "prompts": "a1b2c3d4e5f6", "context_verdicts": "statement",
             "answer_relevancy_questions": 1, "embedder": "onnx:all-MiniLM-L6-v2",
             "max_tokens": 512, "counts": {"faithfulness": {"ok": 3}}}  # fmt: skip
    golden = GoldenInfo("g", "g.yaml", 6, "all 6 items")
    run = types.SimpleNamespace(kind="rag", depth=5, golden=golden, judge=judge)
    who = judge_identity(run, "faithfulness")  # type: ignore[arg-type]
    assert re.fullmatch(r"qwen2\.5-coder-1\.5b \(settings [0-9a-f]{8}\)", who)
    # The answer metrics scored by other rules before 2026-12-03 start a new line then.
    assert judge_identity(run, "answer_f1") == "answer rules 2026-12-03"  # type: ignore[arg-type]
    assert judge_identity(run, "citation_precision") == ""  # type: ignore[arg-type]
    # degenerate's too: a loop is a run that repeats itself, no table of one shape.
    assert judge_identity(run, "degenerate") == "answer rules 2026-12-03"  # type: ignore[arg-type]
    # answer_cosine is measured by an embedder: cosines of another are on another scale.
    assert judge_identity(run, "answer_cosine") == (  # type: ignore[arg-type]
        "embedder onnx:all-MiniLM-L6-v2, answer rules 2026-12-03"
    )
    cosine_row = {"kind": "rag", "name": "g-rag", "variant": "rag", "scope": "all 6 items, top_k 5",
                  "judge": "embedder onnx:all-MiniLM-L6-v2"}  # fmt: skip
    assert trend_series(cosine_row) == (
        "rag: g-rag / rag, all 6 items, top_k 5, embedder onnx:all-MiniLM-L6-v2"
    )

    def identity(**changed: Any) -> str:
        other = types.SimpleNamespace(**{**vars(run), "judge": {**judge, **changed}})
        return judge_identity(other, "faithfulness")  # type: ignore[arg-type]

    # Each setting that makes verdicts is another judge; an outcome (counts) is not.
    assert len({who, identity(model="other"), identity(prompts="ffffffffffff"),
                identity(embedder="onnx:other"), identity(ragas="0.4.0")}) == 5  # fmt: skip
    assert identity(counts={}) == who
    for n, model in enumerate(("qwen2.5-coder-1.5b", "other")):
        summary = types.SimpleNamespace(
            run_id=f"r{n}", finished_at=f"r{n}", name="g-rag", golden=golden,
            granularity="answer", kind="rag", depth=5, git_revision="",
            judge={**judge, "model": model},
            metrics={"rag": {m: {"mean": 0.5, "ci_low": 0.4, "ci_high": 0.6, "n": 6}
                             for m in ("faithfulness", "answer_f1")}},
        )  # fmt: skip
        append_history(tmp_path, summary)  # type: ignore[arg-type]
    rows = read_history(tmp_path)
    assert {r["scope"] for r in rows} == {"all 6 items, top_k 5"}
    lines = {trend_series(r) for r in rows}
    assert lines == {
        "rag: g-rag / rag, all 6 items, top_k 5, answer rules 2026-12-03",  # answer_f1: one
        f"rag: g-rag / rag, all 6 items, top_k 5, judge {who}",
        f"rag: g-rag / rag, all 6 items, top_k 5, judge {identity(model='other')}",
    }


def test_scores_given_without_the_judge_do_not_dilute_its_failure_share(
    rag_config: RagpipeConfig,
) -> None:
    """The review: the 0s of context recall for items that got no context count as scored,
    so 2 judge failures in 6 trials (33%, withheld) read as 2 of 10 (20%, shown). Only the
    judge's trials count: 4 items without context, 4 judged, 2 failed: "2 of 6"."""
    import types

    from ragpipe.evaluation.golden import GoldenItem, GoldenSet
    from ragpipe.evaluation.rag import ALL_RAG_METRICS, Judged, RagRow, _result

    items = [GoldenItem(f"q{i}", f"question {i}?", {"a.md": 1}, expected_answer="yes")
             for i in range(10)]  # fmt: skip
    rows = []
    for i, item in enumerate(items):
        row = RagRow(item.id, item.query, "x", False, [], 0, [], 1, 1, 0.1)
        row.judged = {m: Judged(None, NOT_APPLICABLE, "-") for m in ALL_RAG_METRICS}
        row.judged["context_recall"] = (
            Judged(0.0, OK, "nothing was retrieved: no context", asked=False) if i < 4
            else Judged(None, FAILED, "timeout after 5s") if i < 6
            else Judged(1.0, OK)
        )  # fmt: skip
        rows.append(row)
    judge = types.SimpleNamespace(classes=["x"], faithfulness_verdicts="statement",
                                  verdicts="statement", context_verdicts="statement",
                                  questions=1)  # fmt: skip
    model = types.SimpleNamespace(name="m")
    golden = GoldenSet("g", items, "", "g.yaml")
    result = _result(rag_config, golden, "g", rows, judge, model, model, None, [], {})
    assert result.counts["context_recall"] == {OK: 8, FAILED: 2, NOT_APPLICABLE: 0}
    assert "context_recall" in result.withheld
    assert result.flags["context_recall"].startswith("judge failed on 2 of 6 (> 20%)")
    # The warning gives each withheld metric its own reason; it blamed the calibration
    # ("judge reliable (...): context_recall not shown as values") for the judge's failures.
    assert (
        "not shown as values and feeding no gate: context_recall (judge failed on 2 of 6 "
        "(> 20%); judge not calibrated)" in result.warnings
    )


def test_eval_rags_options_keep_a_configured_judge() -> None:
    """`eval rag` without --judge-model replaced eval.judge with None: the generator judged
    its own answers while the config named a judge server."""
    from flows.cli_eval import rag_models

    judge = {"provider": "openai", "model": "big-judge", "base_url": "http://127.0.0.1:9"}
    cfg = RagpipeConfig.model_validate({"eval": {"judge": judge}})
    kept = rag_models(cfg, None, None, None)
    assert kept.eval.judge is not None and kept.eval.judge.model == "big-judge"
    assert kept.eval.judge.base_url == "http://127.0.0.1:9"
    renamed = rag_models(cfg, "ollama", "small-gen", "bigger-judge")
    assert renamed.llm.model == "small-gen" and renamed.llm.provider == "ollama"
    assert renamed.eval.judge is not None and renamed.eval.judge.model == "bigger-judge"
    assert renamed.eval.judge.provider == "openai"  # eval.judge's server, another model
    plain = RagpipeConfig()
    assert rag_models(plain, None, None, None).eval.judge is None  # the generator judges
    own = rag_models(plain, "ollama", "small-gen", "big-judge").eval.judge
    assert own is not None and own.model == "big-judge" and own.provider == "ollama"
    with pytest.raises(ConfigError, match=r"--llm/--model: .*/nope\.gguf does not exist"):
        rag_models(plain, None, "/nope.gguf", None)  # at once, not after the probe
    with pytest.raises(ConfigError, match=r"--judge-model: .*/nope\.gguf does not exist"):
        rag_models(plain, None, None, "/nope.gguf")


def _scored_reply(text: str, cited: list[int], item: Any) -> dict[str, Any]:
    """``score_answer`` on three given chunks of one "Oven" section, only the first of which
    holds the answer sentence."""
    from ragpipe.evaluation.rag import score_answer
    from ragpipe.query.generate import Answer, Source
    from ragpipe.query.results import Retrieved

    texts = ["Bake the loaf at 230 degrees for thirty-five minutes.", "Preheat well.",
             "Use a stone."]  # fmt: skip
    hits = [Retrieved(f"p{n}", 0.5, {"file_path": "/d/bread.md", "heading_path": ["Bread", "Oven"],
                                     "text": t}) for n, t in enumerate(texts, 1)]  # fmt: skip
    sources = [Source(n, f"p{n}", "/d/bread.md", None, "Bread > Oven", t)
               for n, t in enumerate(texts, 1)]  # fmt: skip
    reply = Answer("q", text, sources, [sources[n - 1] for n in cited])
    scores, _, _, _ = score_answer(item, reply, hits, None)
    return {m: (j.value, j.status) for m, j in scores.items()}


def test_answer_metrics_count_targets_refusals_and_empty_answers_as_they_are() -> None:
    """A review: citing the one chunk of a section that answers scored citation recall 1/3
    (three chunks of the section given); a refusal on an answerable item earned F1 0.2 for
    sharing "in" and "the" with the answer; an empty answer counted as "not a refusal"."""
    from ragpipe.evaluation.golden import ChunkTarget, GoldenItem

    oven = ChunkTarget("bread.md", heading="Oven", grade=3)
    item = GoldenItem("oven", "How hot?", {"bread.md": 3}, (oven,),
                      expected_answer="Set it in the oven at 230 degrees.")  # fmt: skip
    cited = _scored_reply("Bake the loaf at 230 degrees for thirty-five minutes [1].", [1], item)
    assert cited["citation_recall"] == (1.0, "ok")  # one target, cited: all of it
    assert cited["citation_precision"] == (1.0, "ok")
    refusal = _scored_reply("Not found in the provided documents.", [], item)
    for m in ("answer_f1", "answer_rouge_l", "answer_cosine"):
        assert refusal[m] == (0.0, "ok"), m  # F1 was 0.2 ("in", "the")
    assert refusal["false_refusal"] == (1.0, "ok")
    empty = _scored_reply("", [], item)
    assert empty["false_refusal"] == (None, "failed")  # it was 0.0: "did not refuse"
    assert empty["answer_cosine"] == (0.0, "ok")  # "" embedded scored 0.26
    # Citations alone are no answer either (precision and recall read 1.0).
    bare = _scored_reply("[1]", [1], item)
    assert bare["false_refusal"] == (None, "failed")
    assert bare["citation_precision"][1] == bare["citation_recall"][1] == "not_applicable"
    # A refusal in other words earns no answer credit for its "in" and "the" (F1 0.333).
    hedge = _scored_reply("Not found in the sources.", [], item)
    assert hedge["answer_f1"] == hedge["answer_rouge_l"] == (0.0, "ok")
    # A file target: one cited chunk of the file is all of it (as before).
    by_file = GoldenItem("oven", "How hot?", {"bread.md": 3})
    assert _scored_reply("Bake at 230 degrees [2].", [2], by_file)["citation_recall"] == (1.0, "ok")


def test_a_hedge_and_an_empty_answer_are_no_claims_for_the_judge(onnx_embedder: Any) -> None:
    """A review: "The provided documents do not contain this information [1]." was judged
    for faithfulness as a claim about the passage (1.0 from a lenient judge); an empty
    answer failed ragas's check and was counted as the judge's failure."""
    from ragpipe.evaluation.calibration import statement_prompt
    from ragpipe.evaluation.golden import GoldenItem
    from ragpipe.evaluation.rag import EMPTY_ANSWER, Judge, RagRow
    from ragpipe.query.generate import NO_TEXT

    item = GoldenItem("oven", "How long should bread bake?", {"bread.md": 1})
    contexts = ["Bake the loaf for thirty-five minutes."]
    judge = Verdicts({})
    scorer = Judge(judge, onnx_embedder, timeout_s=5, max_tokens=1536)
    hedge = RagRow("oven", item.query, "The provided documents do not contain this "
                   "information [1].", False, contexts, 1, [], 0, 0, 0.0)  # fmt: skip
    asyncio.run(scorer.judge(hedge, item))
    faithfulness = hedge.judged["faithfulness"]
    assert (faithfulness.value, faithfulness.status) == (None, NOT_APPLICABLE)
    assert not any(p.startswith("Does the passage say") for p in judge.prompts)
    empty = RagRow("oven", item.query, "", False, contexts, 0, [], 0, 0, 0.0)
    asyncio.run(scorer.judge(empty, item))
    assert (empty.judged["faithfulness"].status, empty.judged["faithfulness"].reason) == (
        NOT_APPLICABLE, EMPTY_ANSWER)  # fmt: skip
    relevancy = empty.judged["answer_relevancy"]
    assert (relevancy.value, relevancy.status, relevancy.asked) == (0.0, OK, False)
    # Citations with marks around them are empty too (generate flags them no_answer_text;
    # faithfulness judged "." and answer relevancy was asked), and so is a flagged reply.
    for said, flags in [("[1].", []), ("\u2014 [1]", []), ("**[1]**", []), ("_[1]_", [NO_TEXT])]:
        judge.prompts.clear()
        bare = RagRow("oven", item.query, said, False, contexts, 1, [], 0, 0, 0.0, flags=flags)
        asyncio.run(scorer.judge(bare, item))
        faithfulness, relevancy = bare.judged["faithfulness"], bare.judged["answer_relevancy"]
        assert (faithfulness.status, faithfulness.reason) == (NOT_APPLICABLE, EMPTY_ANSWER), said
        assert (relevancy.value, relevancy.status, relevancy.asked) == (0.0, OK, False), said
        assert not any(p.startswith("Does the passage say") for p in judge.prompts), said
    # An answer beside a clause saying the sources lack a detail is an answer: judged (it
    # was not applicable, read as a hedge, one sentence with a "lacks" phrase).
    claim = "Bake the loaf for thirty-five minutes; the sources do not say whether to preheat."
    judge = Verdicts({claim: '{"verdict": 1}'})
    scorer = Judge(judge, onnx_embedder, timeout_s=5, max_tokens=1536)
    answered = RagRow("oven", item.query, claim.replace(".", " [1]."), False, contexts, 1, [],
                      0, 0, 0.0)  # fmt: skip
    asyncio.run(scorer.judge(answered, item))
    faithfulness = answered.judged["faithfulness"]
    assert (faithfulness.value, faithfulness.status) == (1.0, OK)
    assert [p for p in judge.prompts if p.startswith("Does the passage say")] == [
        statement_prompt("\n".join(contexts), claim)
    ]


def test_an_unscorable_answer_is_among_the_worst_questions() -> None:
    """An empty answer and a hedge left the HTML's worst questions once the judge no longer
    failed on them: only judged metrics' failures were counted."""
    import pyarrow as pa

    from ragpipe.evaluation.rag import ALL_RAG_METRICS
    from ragpipe.evaluation.report import _worst_rag

    def row(item: str, failed: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"item_id": item, "query": item, "answer": item,
                               "not_found": False, "withdrawn": None, "flags": []}  # fmt: skip
        for m in ALL_RAG_METRICS:
            bad = m == failed
            out |= {m: None if bad else 1.0, f"{m}_status": "failed" if bad else "ok",
                    f"{m}_reason": "the answer is empty" if bad else ""}  # fmt: skip
        out["false_refusal"] = out["degenerate"] = 0.0
        out["correct_refusal"] = None
        out["correct_refusal_status"] = "not_applicable"
        return out

    rows = [row(f"fine{i}") for i in range(10)] + [row("z-empty", failed="false_refusal")]
    shown = _worst_rag(pa.Table.from_pylist(rows), 3)  # ties go by id: "z-empty" last
    assert "z-empty" in shown and shown.index("z-empty") < min(
        shown.index(f"fine{i}") for i in range(10) if f"fine{i}" in shown
    )


def test_a_rag_run_through_a_search_filter_says_so(
    scored_config: RagpipeConfig, onnx_embedder: Any
) -> None:
    """Items outside retrieve.filter_file read "no given source holds a golden target" and
    context scores 0, without a word (the retrieval eval said so; eval rag did not)."""
    retrieve = scored_config.retrieve.model_copy(update={"filter_file": "kitchen/bread.md"})
    evaluation = scored_config.eval.model_copy(update={"judge_probe_size": 0})
    config = scored_config.model_copy(update={"retrieve": retrieve, "eval": evaluation})
    result = run_rag_eval(config, load_golden(config.eval.golden), generator=SCRIPT,
                          judge_llm=YES, embedder=onnx_embedder)  # fmt: skip
    assert (
        "the search: searches only what filter_file='kitchen/bread.md' lets through; an item "
        "whose targets lie outside it scores 0, whatever the ranking"
    ) in " ".join(result.warnings)


# -- found by attack: judge prompts past the judge's own window ---------------------------


def test_a_judge_prompt_past_the_judges_window_is_a_failure_not_a_score(
    smollm: Any, onnx_embedder: Any
) -> None:
    """Only the generator's window was budgeted: a judge prompt with every context joined
    (faithfulness, context recall) went to the judge whatever its size, and Ollama cut it
    from its start in silence and its verdicts were scored. A prompt that leaves its reply
    no room in the judge's window is not sent and fails the metric saying why; one context
    at a time (context precision) fits and is asked. A reply given what the window left
    and cut there fails too."""
    from ragpipe.evaluation.golden import GoldenItem
    from ragpipe.evaluation.rag import Judge, JudgeWindowExceeded, RagRow, Windowed
    from ragpipe.models.llm import OllamaLLM
    from ragpipe.query.generate import PROMPT_MARGIN
    from tests.support.ollama_server import ollama_server

    fact = "The loaf bakes at 230 degrees Celsius for thirty-five minutes in a hot oven. "
    contexts = [fact * 20, fact.replace("230", "250") * 20]
    item = GoldenItem("oven", "How long should bread bake?", {"bread.md": 1},
                      expected_answer="Bake the loaf for thirty-five minutes.")  # fmt: skip
    row = RagRow("oven", item.query, "Bake it for thirty-five minutes [1].", False, contexts,
                 1, [], 0, 0, 0.0)  # fmt: skip
    with ollama_server({}, {"smollm": smollm}) as (host, state):
        judge = OllamaLLM("smollm", host=host, context_size=1024, max_tokens=64)
        assert judge.count_tokens("\n".join(contexts)) > 1024 - PROMPT_MARGIN
        assert all(judge.count_tokens(c) < 1024 // 2 for c in contexts)
        asyncio.run(Judge(judge, onnx_embedder, timeout_s=120, max_tokens=160).judge(row, item))
        prompts = [str(m["content"]) for r in state.requests if r["path"] == "/api/chat"
                   for m in r["body"]["messages"]]  # fmt: skip

        for metric in ("faithfulness", "context_recall"):
            judged = row.judged[metric]
            assert (judged.value, judged.status) == (None, FAILED), metric
            assert re.fullmatch(
                r"JudgeWindowExceeded: the judge's prompt \(\d+ tokens\) and its reply \(up to "
                r"16\) do not fit its window of 1024 tokens: not asked\. Lower "
                r"generate\.context_tokens, or raise the judge's context_size \(eval\.judge, "
                r"else llm\)",
                judged.reason or "",
            ), judged.reason
        assert not any("\n".join(contexts) in p for p in prompts)  # never sent
        precision = row.judged["context_precision"]  # one context a call: asked
        assert "window" not in (precision.reason or "") and sum(contexts[0] in p for p in prompts)

        # What the window leaves: the reply may take it, and one cut there fails.
        windowed = Windowed(judge)
        count = fact * 31 + "List every number from 1 to 1000, one per line."
        story = [{"role": "user", "content": count}]  # greedy: a long list, cut at the limit
        room = 1024 - judge.count_tokens(count) - PROMPT_MARGIN
        assert 150 <= room < 200  # at least a verdict's 150: the call is made
        with pytest.raises(JudgeWindowExceeded, match=rf"reply was cut at {room} tokens, what "
                           r"its window of 1024 left beside a \d+-token prompt"):  # fmt: skip
            windowed.chat(story, max_tokens=400)
        assert state.requests[-1]["body"]["options"]["num_predict"] == room
        short = [{"role": "user", "content": "Say yes." + fact * 31}]
        assert windowed.chat(short, max_tokens=4).tokens_out <= 4  # room enough: as asked


# -- found by attack: answers the pipeline itself flags as untrusted ----------------------


class Served:
    """``SCRIPT``'s replies behind a loopback Ollama server, streamed; a question holding
    one of ``full``'s words is answered as by a model whose window filled (``TIN`` prompt
    tokens read, as Ollama reports what it kept)."""

    name = "served"
    takes_grammar = False
    TIN = 4090

    def __init__(self, full: tuple[str, ...]) -> None:
        self.full = full

    def count_tokens(self, text: str) -> int:
        return len(text) // 4

    def chat(self, messages: Any, on_token: Any = None, **kwargs: Any) -> Completion:
        reply = SCRIPT.chat(messages)
        if on_token is not None:
            on_token(reply.text)
        question = messages[-1]["content"].rsplit("Question:", 1)[-1]
        tokens_in = self.TIN if any(w in question for w in self.full) else 10
        return Completion(reply.text, tokens_in, 10, self.name, 0.0, finish_reason="stop")


def test_answers_the_pipeline_flags_as_untrusted_are_counted_and_withhold_the_answer_metrics(
    scored_config: RagpipeConfig, onnx_embedder: Any, tmp_path: Path
) -> None:
    """The attack review: through Ollama, every answer window_full (its prompt cut from its
    start) headlined answer F1 and citation precision 1.000 with no warning; the flags were
    in per_query.parquet and the drill-down only. Each untrusted flag is counted in
    summary.json and warned of; past eval.max_judge_failure_share of the answers, the
    answer metrics are withheld (no value, no trend point), degenerate aside; the
    drill-down puts those answers first."""
    from ragpipe.evaluation.report import headline_cell
    from ragpipe.evaluation.run import FLAGGED_HISTORY, read_history
    from ragpipe.models.llm import OllamaLLM
    from tests.support.ollama_server import ollama_server

    golden = load_golden(scored_config.eval.golden)

    def run(max_share: float) -> Any:
        evaluation = scored_config.eval.model_copy(
            update={"judge_probe_size": 0, "max_judge_failure_share": max_share,
                    "reports_dir": tmp_path / f"reports-{max_share}"}
        )  # fmt: skip
        config = scored_config.model_copy(update={"eval": evaluation})
        backend = Served(full=("bread",))
        with ollama_server({}, {"gen": backend}) as (host, _):
            generator = OllamaLLM("gen", host=host, context_size=4096)
            result = run_rag_eval(config, golden, generator=generator, judge_llm=YES,
                                  embedder=onnx_embedder)  # fmt: skip
        summary = rag_summary(result, config, {"files": 5, "points": 0, "sha256": "x"})
        return result, write_run(summary, rag_table(result), evaluation.reports_dir)

    result, summary = run(0.2)
    rows = {r.item_id: r for r in result.rows}
    # Ollama's window: 4090 prompt + 10 reply tokens >= num_ctx 4096.
    assert rows["oven"].flags == ["window_full", "invalid_citations_removed"]
    assert rows["lovelace"].flags == ["degenerate", "uncited"]
    # Its scores are kept per item, as any answer's.
    assert rows["oven"].judged["answer_f1"].value == pytest.approx(16 / 17)
    window = (
        "the prompt and answer filled the generator's window (llm.context_size): the prompt "
        "was probably cut from its start, instructions first; raise llm.context_size or lower "
        "generate.context_tokens"
    )
    reason = "2 of 6 answers untrusted (window_full 1, degenerate 1) (> 20%)"
    assert result.answer_flags == {
        "answers": 6,
        "counts": {"answer_withdrawn": 1, "degenerate": 1, "invalid_citations_removed": 1,
                   "uncited": 1, "window_full": 1},
        "untrusted": 2,
        "untrusted_counts": {"window_full": 1, "degenerate": 1},
        "untrusted_share": pytest.approx(1 / 3),
        "max_share": 0.2,
        "withheld": True,
    }  # fmt: skip
    withheld = [m for m in ANSWER_METRICS if m != "degenerate"]
    warnings = [
        f"1 of 6 answers window_full: {window}",
        "1 of 6 answers degenerate: the answer repeats itself (a loop, stopped where it was "
        "caught)",
        f"not shown as values and no trend points: {', '.join(withheld)} ({reason}: more than "
        "eval.max_judge_failure_share of the answers carry a flag the pipeline does not "
        "trust; degenerate is shown, as it counts loops itself; per_query.parquet keeps every "
        "score)",
    ]
    assert [w for w in result.warnings if " answers " in w or "no trend points" in w] == warnings
    assert result.withheld & set(ANSWER_METRICS) == set(withheld)
    stored = json.loads((Path(summary.report_dir) / "summary.json").read_text())
    assert stored["answer_flags"]["untrusted_counts"] == {"window_full": 1, "degenerate": 1}
    f1 = stored["metrics"]["rag"]["answer_f1"]
    assert (f1["mean"], f1["withheld"], f1["flag"]) == (None, True, reason)
    assert stored["metrics"]["rag"]["degenerate"]["withheld"] is False
    assert headline_cell(f1) == f"{reason} (n=2, 4 n/a)"
    md = (Path(summary.report_dir) / "report.md").read_text()
    assert f"| answer_f1 | {reason} (n=2, 4 n/a) |" in md
    assert "| degenerate | 0.167 (n=6, no CI: under 10) |" in md
    assert (
        "- answers flagged, of 6: answer_withdrawn 1, degenerate 1, invalid_citations_removed "
        "1, uncited 1, window_full 1; untrusted (window_full, truncated, "
        "misattributed_citation, no_answer_text, degenerate): 2 of 6"
    ) in md
    assert f"> **warning:** 1 of 6 answers window_full: {window}" in md
    # No trend point: the history-flagged file holds it, with its reason.
    reports = tmp_path / "reports-0.2"
    assert {r["metric"] for r in read_history(reports)} == {"degenerate"}
    flagged = {r["metric"]: r["flag"] for r in read_history(reports, flagged=True)}
    assert flagged["answer_f1"] == f"withheld: {reason}"
    assert (reports / FLAGGED_HISTORY).is_file()
    # The drill-down: the untrusted answers first (the window_full one, F1 0.941, came
    # after the false refusal), the loop before it (wrong), then the false refusal.
    page = (Path(summary.report_dir) / "report.html").read_text()
    drill = page[page.index("<h2>Worst 6 of 6 questions (untrusted answers first: "
                            "window_full, truncated, misattributed_citation, no_answer_text, "
                            "degenerate; then degenerate answers") :]  # fmt: skip
    order = [drill.index(q) for q in ("Analytical Engine", "bread bake", "backed up")]
    assert order == sorted(order)

    # Under the share: counted and warned of, the metrics shown as values.
    result, summary = run(0.5)
    assert result.answer_flags["withheld"] is False
    assert not result.withheld & set(ANSWER_METRICS)
    assert [w for w in result.warnings if " answers " in w or "no trend points" in w] == (
        warnings[:2]
    )
    assert headline_cell(summary.metrics["rag"]["answer_f1"]).startswith("0.")
    assert "answer_f1" in {r["metric"] for r in read_history(tmp_path / "reports-0.5")}


def test_a_misattributed_citation_counts_as_wrong_in_citation_precision() -> None:
    """The attack review: "Knead the dough ... [1]" citing the Oven section, its words all
    in source [2] (Dough), scored citation precision 1.0 since [1] holds the target;
    generate flags it misattributed_citation. Each source cited for a sentence another
    source holds counts as a wrong citation."""
    from ragpipe.evaluation.answers import citation_scores
    from ragpipe.evaluation.golden import ChunkTarget, GoldenItem
    from ragpipe.evaluation.rag import score_answer
    from ragpipe.query.generate import Answer, Source, check_citations
    from ragpipe.query.results import Retrieved

    texts = ["Bake the loaf at 230 degrees Celsius for thirty-five minutes.",
             "Knead the dough for ten minutes until it is smooth and elastic."]  # fmt: skip
    heads = ["Oven", "Dough"]
    hits = [Retrieved(f"p{n}", 0.5, {"file_path": "/d/bread.md", "heading_path": ["Bread", h],
                                     "text": t})
            for n, (t, h) in enumerate(zip(texts, heads, strict=True), 1)]  # fmt: skip
    sources = [Source(n, f"p{n}", "/d/bread.md", None, f"Bread > {h}", t)
               for n, (t, h) in enumerate(zip(texts, heads, strict=True), 1)]  # fmt: skip
    oven = GoldenItem("oven", "How long should bread bake?", {"bread.md": 3},
                      (ChunkTarget("bread.md", heading="Oven", grade=3),),
                      expected_answer="Bake the loaf at 230 degrees Celsius for thirty-five "
                      "minutes.")  # fmt: skip

    def cites(text: str) -> tuple[float | None, float | None]:
        cited, invalid = check_citations(text, sources)
        scores, *_ = score_answer(oven, Answer("q", text, sources, cited, invalid), hits, None)
        return scores["citation_precision"].value, scores["citation_recall"].value

    assert cites("Knead the dough for ten minutes until it is smooth and elastic [1].") == (
        0.0, 1.0)  # fmt: skip
    assert cites("Bake the loaf at 230 degrees Celsius for thirty-five minutes [1].") == (1.0, 1.0)
    # Cited rightly once and wrongly once: the source was credited with another's words.
    assert cites("Bake the loaf at 230 degrees for thirty-five minutes [1]. Knead the dough "
                 "for ten minutes until it is smooth and elastic [1].") == (0.0, 1.0)  # fmt: skip
    assert citation_scores([1, 2], {1}, {1, 2}, wrong={1}) == (0.0, 1.0)
    assert citation_scores([1, 2], {1, 2}, {1, 2}, wrong={2}) == (0.5, 1.0)


def test_the_generator_is_named_in_the_report_and_parts_the_trend_lines(
    scored_config: RagpipeConfig,
    onnx_embedder: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The attack review: report.md (so report.html, the Prefect artifact) and the terminal
    named the embedder but never the generator, and `ragpipe report --metric answer_f1` drew
    a big model's 1.000 and a tiny one's 0.156 as one line, read as a regression. The
    report names the generator and its settings; history records it (generator column) and
    each generator, or the same one with other settings, is a trend line of its own."""
    import pyarrow as pa

    from flows.cli_eval import _print_eval
    from ragpipe.evaluation.report import trend_series
    from ragpipe.evaluation.run import HISTORY_SCHEMA, read_history

    golden = load_golden(scored_config.eval.golden)
    reports = tmp_path / "trend"

    def run(model: str, temperature: float = 0.0) -> Any:
        llm = scored_config.llm.model_copy(update={"temperature": temperature})
        evaluation = scored_config.eval.model_copy(update={"judge_probe_size": 0})
        config = scored_config.model_copy(update={"llm": llm, "eval": evaluation})
        generator = Served(full=())
        generator.name = model  # no temperature of its own: the llm section's is its
        result = run_rag_eval(config, golden, generator=generator, judge_llm=YES,
                              embedder=onnx_embedder)  # fmt: skip
        summary = rag_summary(result, config, {"files": 5, "points": 0, "sha256": "x"})
        return write_run(summary, rag_table(result), reports)

    big = run("big-model")
    settings = {
        "model": "big-model", "provider": "llamacpp", "temperature": 0.0, "seed": 0,
        "max_tokens": 384, "context_size": 4096, "context_tokens": 2800, "cite_grammar": True,
        "takes_grammar": False, "min_relevance": None, "stop_looping": True,
    }  # fmt: skip
    stored = json.loads((Path(big.report_dir) / "summary.json").read_text())
    assert stored["models"]["generator"] == "big-model"
    assert stored["models"]["generator_settings"] == settings
    said = (
        "big-model: provider llamacpp, temperature 0.0, seed 0, max_tokens 384, context_size "
        "4096, context_tokens 2800, cite_grammar true, takes_grammar false, min_relevance "
        "none, stop_looping true"
    )
    md = (Path(big.report_dir) / "report.md").read_text()
    assert f"\n- generator: {said}\n" in md
    assert f"generator: {said}" in (Path(big.report_dir) / "report.html").read_text()
    _print_eval(big)
    assert f"generator: {said}\n" in capsys.readouterr().out
    tiny = run("tiny-model")
    warm = run("big-model", temperature=0.7)
    rows = [r for r in read_history(reports) if r["metric"] == "answer_f1"]
    by_run = {r["run_id"]: r["generator"] for r in rows}
    digest = re.fullmatch(r"big-model \(settings ([0-9a-f]{8})\)", by_run[big.run_id])
    assert digest is not None
    assert by_run[tiny.run_id] == f"tiny-model (settings {digest[1]})"  # the same settings
    assert re.fullmatch(r"big-model \(settings [0-9a-f]{8}\)", by_run[warm.run_id])
    assert by_run[warm.run_id] != by_run[big.run_id]  # temperature 0.7: another line
    lines = {r["run_id"]: trend_series(r) for r in rows}
    assert len(set(lines.values())) == 3
    assert lines[tiny.run_id].endswith(f", generator tiny-model (settings {digest[1]})")
    # Every metric of the run, judged ones too: the judge reads the generator's answers and
    # the sources cut to its budget.
    assert {r["generator"] for r in read_history(reports, flagged=True)
            if r["run_id"] == big.run_id} == {by_run[big.run_id]}  # fmt: skip
    # A history file from before the column is read, its rows on a line of their own.
    old = pa.schema([f for f in HISTORY_SCHEMA if f.name != "generator"])
    table = pa.Table.from_pylist([{k: v for k, v in rows[0].items() if k != "generator"}],
                                 schema=old)  # fmt: skip
    before = tmp_path / "before"
    before.mkdir()
    pq.write_table(table, before / "history.parquet")
    (row,) = read_history(before)
    assert row["generator"] is None
    assert trend_series(row) == lines[big.run_id].removesuffix(f", generator {by_run[big.run_id]}")


def test_context_precision_says_how_many_items_each_variant_scored(
    scored_config: RagpipeConfig, onnx_embedder: Any, tmp_path: Path
) -> None:
    """The attack review: context precision is ragas's reference-based variant where an
    item has expected_answer and the reference-free one (judged against the generated
    answer) where it has not, averaged under one number with nothing to say so. The judge's
    section counts the scored items of each; a run that mixes them warns."""
    evaluation = scored_config.eval.model_copy(update={"judge_probe_size": 0})
    config = scored_config.model_copy(update={"eval": evaluation})
    golden = load_golden(config.eval.golden)
    result = run_rag_eval(config, golden, generator=SCRIPT, judge_llm=YES,
                          embedder=onnx_embedder)  # fmt: skip
    kinds = {r.item_id: r.context_precision_kind for r in result.rows}
    # oven and lovelace have an expected_answer, backups and miss none; capital and moon
    # are answerable: false (not judged).
    assert kinds == {"oven": "with_reference", "lovelace": "with_reference",
                     "backups": "without_reference", "miss": "without_reference",
                     "capital": "", "moon": ""}  # fmt: skip
    assert result.judge["context_precision_kinds"] == {"with_reference": 2, "without_reference": 2}
    said = (
        "context_precision is one mean over 2 item(s) judged against expected_answer and 2 "
        "judged against the generated answer (no expected_answer: ragas's reference-free "
        "variant): two measures under one number; per_query.parquet's context_precision_kind "
        "says which is which"
    )
    assert said in result.warnings
    summary = rag_summary(result, config, {"files": 5, "points": 0, "sha256": "x"})
    md = Path(write_run(summary, rag_table(result), tmp_path / "r").report_dir) / "report.md"
    assert (
        "- context_precision's scored items: 2 judged against expected_answer (ragas's "
        "ContextPrecision), 2 against the generated answer (no expected_answer: "
        "ContextPrecisionWithoutReference)"
    ) in md.read_text()
    # One variant only: counted, no warning.
    first = run_rag_eval(config, golden, limit=2, generator=SCRIPT, judge_llm=YES,
                         embedder=onnx_embedder)  # fmt: skip
    assert first.judge["context_precision_kinds"] == {"with_reference": 2, "without_reference": 0}
    assert not any(w.startswith("context_precision is one mean") for w in first.warnings)
