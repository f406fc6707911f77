"""Grounded generation: source selection, prompt, citation checks, the real model."""

from __future__ import annotations

from typing import Any

import pytest

from ragpipe.config import RagpipeConfig
from ragpipe.models.llm import LlamaCppLLM
from ragpipe.query.generate import (
    NOT_FOUND,
    Source,
    answer,
    build_messages,
    check_citations,
    is_not_found,
    select_sources,
)
from ragpipe.query.results import Retrieved
from ragpipe.query.retrieve import Retriever

pytestmark = pytest.mark.integration


def _hits(n: int, words: int = 20) -> list[Retrieved]:
    return [
        Retrieved(
            f"p{i}",
            1.0 - i / 10,
            {
                "text": f"chunk {i} " + "word " * words,
                "file_path": f"doc{i}.md",
                "page": i,
                "heading_path": ["Top", f"Part {i}"],
            },
        )
        for i in range(n)
    ]


def _words(text: str) -> int:
    return len(text.split())


def test_sources_are_ordered_for_the_middle_and_cut_to_budget() -> None:
    sources, dropped = select_sources(_hits(5), budget=10_000, count_tokens=_words)
    assert [s.point_id for s in sources] == ["p0", "p2", "p4", "p3", "p1"]
    assert [s.number for s in sources] == [1, 2, 3, 4, 5] and dropped == 0
    # A source block is 31 words here: "[n] (docN.md, page N, section: Top > Part N)" is 9,
    # the text 22. A budget of three blocks keeps the three best and drops the weakest two.
    small, dropped = select_sources(_hits(5), budget=3 * 31, count_tokens=_words)
    assert dropped == 2 and [s.point_id for s in small] == ["p0", "p2", "p1"]
    one, _ = select_sources(_hits(1, words=500), budget=100, count_tokens=_words)
    assert len(one) == 1 and _words(one[0].text) <= 100  # never empty: the best, cut down


def test_citations_are_checked_against_the_sources() -> None:
    sources = [Source(n, f"p{n}", f"f{n}.md", None, "", "t") for n in (1, 2, 3)]
    cited, invalid = check_citations("A [2]. B [1, 3] and C [7][2].", sources)
    assert [s.number for s in cited] == [2, 1, 3] and invalid == [7]
    assert is_not_found("  not found in the provided documents ")
    assert not is_not_found("It was found in [1].")


def test_system_prompt_demands_citations_and_the_not_found_answer() -> None:
    messages = build_messages("Why?", select_sources(_hits(2), 10_000, _words)[0])
    assert NOT_FOUND in messages[0]["content"] and "[1]" in messages[0]["content"]
    user = messages[1]["content"]
    assert "[1] (doc0.md, page 0, section: Top > Part 0)" in user and user.endswith(
        "Question: Why?\nAnswer with citations:"
    )


def test_nothing_retrieved_is_not_found_without_asking_the_model() -> None:
    class Unused:
        name = "unused"

        def chat(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the model must not be called")

        def count_tokens(self, text: str) -> int:
            return 0

    reply = answer("anything", [], Unused())
    assert reply.not_found and reply.text == NOT_FOUND and reply.sources == []


def test_answer_from_the_index_with_the_real_model(
    indexed_edge: RagpipeConfig, smollm: LlamaCppLLM
) -> None:
    question = "How long should bread bake in the oven?"
    with Retriever(indexed_edge) as r:
        hits = r.search(question, top_k=3).hits
    pieces: list[str] = []
    reply = answer(question, hits, smollm, context_tokens=2800, on_token=pieces.append)
    assert reply.text == "".join(pieces).strip()
    assert [s.point_id for s in reply.sources] == [hits[0].point_id, hits[2].point_id,
                                                   hits[1].point_id]  # fmt: skip
    assert reply.tokens_in > 100 and reply.tokens_out > 0 and reply.model == smollm.name
    numbers = {s.number for s in reply.sources}
    assert {s.number for s in reply.cited} <= numbers
    assert not set(reply.invalid_citations) & numbers
    data = reply.as_dict()
    assert data["sources"][0]["file_path"].endswith("bread.md")
