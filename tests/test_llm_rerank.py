"""The LLM reranker's arithmetic by hand, and its config shorthand (no model)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ragpipe.config import LLM_RERANKER, RagpipeConfig
from ragpipe.models.llm import first_token_logprobs
from ragpipe.query.llm_rerank import ScoreCache, yes_probability


def test_yes_probability_from_the_first_tokens_alternatives_by_hand() -> None:
    alternatives = {
        "Yes": math.log(0.6),
        " yes": math.log(0.1),  # every spelling of yes counts
        "No": math.log(0.2),
        "Maybe": math.log(0.1),  # neither: left out of both
    }
    score, kind = yes_probability(alternatives, "Yes")
    assert kind == "logprob"
    assert score == pytest.approx(0.7 / 0.9)  # (0.6 + 0.1) / (0.6 + 0.1 + 0.2)
    assert yes_probability({"no": math.log(0.5)}, "no") == (0.0, "logprob")


@pytest.mark.parametrize(
    ("alternatives", "text", "expected"),
    [
        (None, "Yes.", 1.0),
        (None, " no", 0.0),
        (None, "Perhaps", 0.5),
        (None, "", 0.5),
        ({"The": -0.1, "A": -2.0}, "No", 0.0),  # neither word among the alternatives
    ],
)
def test_without_log_probabilities_the_reply_is_the_verdict(
    alternatives: dict[str, float] | None, text: str, expected: float
) -> None:
    assert yes_probability(alternatives, text) == (expected, "verdict")


def test_first_token_logprobs_reads_the_openai_shape() -> None:
    choice = {
        "logprobs": {
            "content": [
                {"token": "Yes", "logprob": -0.5, "top_logprobs": [
                    {"token": "Yes", "logprob": -0.5}, {"token": "No", "logprob": -1.5},
                    {"token": "Yes", "logprob": -3.0}, {"token": None, "logprob": -1.0},
                ]},
                {"token": ".", "logprob": -0.1, "top_logprobs": [{"token": ".", "logprob": -0.1}]},
            ]
        }
    }  # fmt: skip
    assert first_token_logprobs(choice) == {"Yes": -0.5, "No": -1.5}
    assert first_token_logprobs({"message": {"content": "Yes"}}) is None
    assert first_token_logprobs({"logprobs": None}) is None
    # A server that sends something else: as if it sent nothing (the reply's verdict counts).
    impossible = {"token": "Yes", "logprob": 3.0}  # a probability above 1
    odd_shapes = [
        "yes",
        ["x"],
        {"content": "x"},
        {"content": ["x"]},
        {"content": [{"top_logprobs": "x"}]},
        {"content": [{"top_logprobs": [None, impossible]}]},
    ]
    for odd in odd_shapes:
        assert first_token_logprobs({"logprobs": odd}) is None, odd


def test_rerank_llm_is_short_for_the_llm_reranker() -> None:
    config = RagpipeConfig.model_validate({"retrieve": {"rerank": "llm"}})
    assert config.retrieve.rerank is True and config.retrieve.reranker == LLM_RERANKER
    plain = RagpipeConfig.model_validate({"retrieve": {"rerank": True}})
    assert plain.retrieve.reranker.startswith("cross-encoder/")
    upper = RagpipeConfig.model_validate({"retrieve": {"rerank": "LLM", "reranker": "LLM"}})
    assert upper.retrieve.reranker == LLM_RERANKER
    spelled = RagpipeConfig.model_validate({"retrieve": {"rerank": True, "reranker": "Llm"}})
    assert spelled.retrieve.reranker == LLM_RERANKER


def test_the_text_output_says_what_an_llm_rerank_cost_even_with_no_results() -> None:
    from ragpipe.query.render import to_text
    from ragpipe.query.results import RetrievalResult

    cost = {"model": "m\nx", "pairs": 10, "model_calls": 7, "cached": 3, "seconds": 21.04}
    text = to_text(RetrievalResult("q", [], {"llm_rerank": cost}))
    assert text.splitlines() == [
        "(no results)",
        "llm rerank (m\\nx): 10 candidates, 7 model calls, 3 cached, 21.0 s",
    ]


def test_the_score_cache_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "llm_rerank.sqlite"
    cache = ScoreCache(path)
    assert cache.get("k") is None
    cache.put("k", 0.25, "logprob")
    cache.put("k", 0.75, "logprob")  # the newer score replaces the older
    cache.close()
    assert ScoreCache(path).get("k") == (0.75, "logprob")


def test_a_damaged_cache_file_is_a_warning_not_a_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from ragpipe.models.llm import Completion
    from ragpipe.query.llm_rerank import LLMReranker

    class Yes:
        name = "yes-model"
        takes_grammar = False

        def chat(self, messages: object, **options: object) -> Completion:
            return Completion("No", 1, 1, self.name, 0.0, top_logprobs={"yes": math.log(0.8)})

        def count_tokens(self, text: str) -> int:
            return 1

    damaged = tmp_path / "llm_rerank.sqlite"
    damaged.write_bytes(b"this is not a database" * 100)
    reranker = LLMReranker(Yes(), damaged)
    assert reranker.cache is not None and not reranker.cache.on
    assert "unusable" in caplog.text
    scores, cost = reranker.score_with_cost("q", ["a", "b"])
    assert scores == [1.0, 1.0]  # P(yes) 0.8 / (0.8 + 0)
    assert (cost.model_calls, cost.cached) == (2, 0)
    assert reranker.score_with_cost("q", ["a"])[1].model_calls == 1  # nothing was cached


def test_a_cache_that_refuses_writes_is_turned_off_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "llm_rerank.sqlite"
    ScoreCache(path).put("k", 0.5, "logprob")
    cache = ScoreCache(path)
    assert cache._db is not None
    # Writes fail as on a read-only file (root writes a chmod 444 file, so SQLite is told).
    cache._db.execute("PRAGMA query_only = ON")
    assert cache.get("k") == (0.5, "logprob")
    cache.put("other", 0.1, "logprob")  # refused by SQLite: a warning, and the cache is off
    assert not cache.on and "unusable" in caplog.text
    assert cache.get("k") is None
