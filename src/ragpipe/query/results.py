"""What a search returns: ranked hits with their scores and the trace of how they were found."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Retrieved:
    """One chunk in a result list, with the score of every stage it passed."""

    point_id: str
    score: float
    payload: dict[str, Any]
    scores: dict[str, float] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return str(self.payload.get("text", ""))

    @property
    def file_path(self) -> str:
        return str(self.payload.get("file_path", ""))

    @property
    def heading(self) -> str:
        return " > ".join(self.payload.get("heading_path") or [])

    @property
    def page(self) -> int | None:
        page = self.payload.get("page")
        return int(page) if page is not None else None


@dataclass
class RetrievalResult:
    """Ranked chunks plus what the retriever did to get them."""

    query: str
    hits: list[Retrieved]
    trace: dict[str, Any] = field(default_factory=dict)


def ranked(hits: Iterable[Retrieved]) -> list[Retrieved]:
    """Best first; ties broken by point id so every run gives the same order."""
    return sorted(hits, key=lambda h: (-h.score, h.point_id))
