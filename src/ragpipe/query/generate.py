"""Grounded generation: numbered sources in, a cited answer (or "not found") out."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragpipe.models.llm import LLM, Message
from ragpipe.query.fusion import lost_in_the_middle
from ragpipe.query.results import Retrieved

NOT_FOUND = "Not found in the provided documents."
_CITATION = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")

SYSTEM_PROMPT = f"""You answer questions using only the numbered sources you are given.
Rules:
- Use only facts stated in the sources. Do not use outside knowledge.
- After each sentence, cite the sources it relies on by number, like [1] or [2][3].
- If the sources do not contain the answer, reply with exactly: {NOT_FOUND}
- Be brief: at most a few sentences."""


@dataclass
class Source:
    """One numbered source as the model saw it."""

    number: int
    point_id: str
    file_path: str
    page: int | None
    heading: str
    text: str


@dataclass
class Answer:
    """The generator's output, with citations checked against the sources."""

    question: str
    text: str
    sources: list[Source]  # every source in the prompt, by number
    cited: list[Source]  # the sources the answer cites, in order of first citation
    invalid_citations: list[int] = field(default_factory=list)  # numbers with no source
    not_found: bool = False
    tokens_in: int = 0
    tokens_out: int = 0
    model: str = ""
    seconds: float = 0.0
    dropped_sources: int = 0  # retrieved chunks left out by the token budget

    def as_dict(self) -> dict[str, Any]:
        def source(s: Source) -> dict[str, Any]:
            return {
                "number": s.number,
                "file_path": s.file_path,
                "page": s.page,
                "heading": s.heading,
                "point_id": s.point_id,
            }

        return {
            "question": self.question,
            "answer": self.text,
            "not_found": self.not_found,
            "cited": [source(s) for s in self.cited],
            "sources": [source(s) for s in self.sources],
            "invalid_citations": self.invalid_citations,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "model": self.model,
            "seconds": self.seconds,
            "dropped_sources": self.dropped_sources,
        }


def select_sources(
    hits: Sequence[Retrieved], budget: int, count_tokens: Callable[[str], int]
) -> tuple[list[Source], int]:
    """Sources in "lost in the middle" order, the weakest dropped until they fit ``budget``.

    Returns the numbered sources and how many hits were dropped. At least the
    best hit is kept (cut to the budget) so a non-empty retrieval never
    becomes an empty prompt.
    """
    kept = list(hits)
    while kept and sum(count_tokens(_block(0, h)) for h in kept) > budget and len(kept) > 1:
        kept.pop()  # hits arrive best first: drop the weakest
    dropped = len(hits) - len(kept)
    ordered = lost_in_the_middle(kept)
    sources = []
    for number, hit in enumerate(ordered, start=1):
        text = hit.text
        if len(kept) == 1 and count_tokens(_block(number, hit)) > budget:
            text = _cut(text, budget, count_tokens)
        sources.append(Source(number, hit.point_id, hit.file_path, hit.page, hit.heading, text))
    return sources, dropped


def _cut(text: str, budget: int, count_tokens: Callable[[str], int]) -> str:
    words = text.split()
    lo, hi = 0, len(words)
    while lo < hi:  # the longest prefix of words within the budget
        mid = (lo + hi + 1) // 2
        if count_tokens(" ".join(words[:mid])) <= budget - 32:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def _block(number: int, hit: Retrieved | Source) -> str:
    where = hit.file_path
    if hit.page is not None:
        where += f", page {hit.page}"
    if hit.heading:
        where += f", section: {hit.heading}"
    return f"[{number}] ({where})\n{hit.text}\n"


def build_messages(question: str, sources: Sequence[Source]) -> list[Message]:
    context = "\n".join(_block(s.number, s) for s in sources)
    user = f"Sources:\n\n{context}\nQuestion: {question}\nAnswer with citations:"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def check_citations(text: str, sources: Sequence[Source]) -> tuple[list[Source], list[int]]:
    """Sources cited in ``text`` (first-citation order) and cited numbers with no source."""
    by_number = {s.number: s for s in sources}
    cited: list[Source] = []
    invalid: list[int] = []
    for match in _CITATION.finditer(text):
        for part in match.group(1).split(","):
            n = int(part)
            if n in by_number:
                if by_number[n] not in cited:
                    cited.append(by_number[n])
            elif n not in invalid:
                invalid.append(n)
    return cited, invalid


def is_not_found(text: str) -> bool:
    """Whether the model gave the explicit not-found answer."""
    return NOT_FOUND.lower().rstrip(".") in " ".join(text.lower().split())


def answer(
    question: str,
    hits: Sequence[Retrieved],
    llm: LLM,
    context_tokens: int = 2800,
    on_token: Callable[[str], None] | None = None,
) -> Answer:
    """A cited answer to ``question`` from the retrieved ``hits`` (best first)."""
    started = time.perf_counter()
    if not hits:  # nothing retrieved: nothing to ground an answer in
        return Answer(question, NOT_FOUND, [], [], not_found=True, model=llm.name)
    sources, dropped = select_sources(hits, context_tokens, llm.count_tokens)
    reply = llm.chat(build_messages(question, sources), on_token=on_token)
    text = reply.text.strip()
    not_found = is_not_found(text)
    cited, invalid = ([], []) if not_found else check_citations(text, sources)
    return Answer(
        question=question,
        text=text,
        sources=sources,
        cited=cited,
        invalid_citations=invalid,
        not_found=not_found,
        tokens_in=reply.tokens_in,
        tokens_out=reply.tokens_out,
        model=reply.model,
        seconds=time.perf_counter() - started,
        dropped_sources=dropped,
    )
