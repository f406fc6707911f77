"""RAG evaluation: real retrieval, real generation, the real ragas metrics judged by
the real SmolLM2; judge failures are null with a reason, never 0."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ragpipe.config import RagpipeConfig
from ragpipe.evaluation.golden import load_golden
from ragpipe.evaluation.rag import FAILED, NOT_APPLICABLE, OK, RAG_METRICS, run_rag_eval
from ragpipe.evaluation.run import RAG_QUERY_SCHEMA, rag_summary, rag_table, write_run
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
    drill = page[page.index("<h2>Worst 2 of 2 questions (degenerate answers and") :]
    assert drill.count("<details>") == 2
    assert "answer_relevancy: failed" in drill and "ValidationError" in drill
    assert html.escape(lovelace.answer) in drill
    assert "context_recall: not_applicable" in drill


def test_a_score_outside_the_metrics_range_is_a_failure_not_a_value(
    rag_config: RagpipeConfig, smollm: Any
) -> None:
    golden = load_golden(rag_config.eval.golden)
    result = run_rag_eval(rag_config, golden, generator=smollm, judge_llm=TWOS)
    for row in result.rows:  # average precision over verdicts of 2 comes to 2.0
        judged = row.judged["context_precision"]
        assert (judged.value, judged.status) == (None, FAILED)
        assert judged.reason == "score 2 outside [0, 1]: malformed verdicts"
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
    assert result.judge["ragas"] == "0.4.3" and "Faithfulness" in result.judge["metric_classes"]
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
    assert all(row.judged[m].status in (OK, FAILED) for m in RAG_METRICS)  # it has a reference
    chats = [r["body"] for r in state.requests if r["path"] == "/api/chat"]
    assert len(chats) >= 5  # the answer, then the judge's structured calls
    assert sum(1 for body in chats if isinstance(body.get("format"), dict)) == len(chats) - 1
