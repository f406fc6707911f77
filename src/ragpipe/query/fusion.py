"""Combining ranked lists (RRF, DBSF, convex), exact-phrase boosts, MMR, and the order
of sources in a prompt."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ragpipe.config import (
    FusionMethod,
    RetrieveConfig,
)
from ragpipe.models.embedders import normalise
from ragpipe.query.results import Retrieved, ranked
from ragpipe.store import Hit

_QUOTED = re.compile(r"\"([^\"]{2,})\"|“([^”]{2,})”")


_PROPER_NOUN = re.compile(r"\b[A-Z][\w'’-]*(?:\s+(?:of\s+|de\s+|von\s+)?[A-Z][\w'’-]*)+")


Leg = Sequence[Hit | Retrieved]


def _fuse(legs: Sequence[Leg], leg_scores: Sequence[dict[str, float]]) -> list[Retrieved]:
    """Sum each point's per-leg scores; the stage scores a leg carried are kept."""
    fused: dict[str, Retrieved] = {}
    for leg, scores in zip(legs, leg_scores, strict=True):
        for hit in leg:
            entry = fused.setdefault(hit.point_id, Retrieved(hit.point_id, 0.0, hit.payload))
            entry.score += scores[hit.point_id]
            if isinstance(hit, Retrieved):
                entry.scores.update(hit.scores)
    return ranked(fused.values())


def rrf_fuse(
    legs: Sequence[Leg], k: int = 60, weights: Sequence[float] | None = None
) -> list[Retrieved]:
    """Reciprocal Rank Fusion: score = Σ weight / (k + rank), ranks from 1.

    Each leg must be ordered best first. Ties are broken by point id.
    """
    weights = list(weights) if weights is not None else [1.0] * len(legs)
    scores = [
        {h.point_id: w / (k + rank) for rank, h in enumerate(leg, start=1)}
        for leg, w in zip(legs, weights, strict=True)
    ]
    return _fuse(legs, scores)


def dbsf_normalise(scores: Sequence[float]) -> list[float]:
    """Qdrant's DBSF mapping: (s - (μ - 3σ)) / 6σ with the sample σ; 0.5 for one or equal scores."""
    if len(scores) < 2:
        return [0.5] * len(scores)
    values = np.asarray(scores, dtype=np.float64)
    sigma = float(values.std(ddof=1))
    if sigma == 0:
        return [0.5] * len(scores)
    low = float(values.mean()) - 3 * sigma
    return [float(v) for v in (values - low) / (6 * sigma)]


def dbsf_fuse(legs: Sequence[Leg], weights: Sequence[float] | None = None) -> list[Retrieved]:
    """Distribution-based score fusion: Σ weight x DBSF-normalised score over the legs.

    With equal weights of 1 this is exactly Qdrant's ``Fusion.DBSF``.
    """
    weights = list(weights) if weights is not None else [1.0] * len(legs)
    scores = [
        {
            h.point_id: w * n
            for h, n in zip(leg, dbsf_normalise([h.score for h in leg]), strict=True)
        }
        for leg, w in zip(legs, weights, strict=True)
    ]
    return _fuse(legs, scores)


def minmax_normalise(scores: Sequence[float]) -> list[float]:
    """(s - min) / (max - min) over the leg's candidates; 1.0 when they are all equal."""
    if not scores:
        return []
    low, high = min(scores), max(scores)
    if high == low:
        return [1.0] * len(scores)
    return [(s - low) / (high - low) for s in scores]


def convex_fuse(legs: Sequence[Leg], weights: Sequence[float]) -> list[Retrieved]:
    """Convex combination Σ weight x min-max-normalised score (weights summing to 1).

    A point missing from a leg scores 0 there: no better than that leg's
    weakest candidate. Unlike RRF the score gaps inside each leg survive.
    """
    scores = [
        {
            h.point_id: w * n
            for h, n in zip(leg, minmax_normalise([h.score for h in leg]), strict=True)
        }
        for leg, w in zip(legs, weights, strict=True)
    ]
    return _fuse(legs, scores)


def fuse(legs: Sequence[Leg], cfg: RetrieveConfig) -> list[Retrieved]:
    """The dense and sparse legs (in that order) fused by ``cfg.fusion_method``."""
    if cfg.fusion_method == FusionMethod.CONVEX:
        return convex_fuse(legs, [cfg.alpha, 1 - cfg.alpha])
    weights = [cfg.dense_weight, cfg.sparse_weight]
    if cfg.fusion_method == FusionMethod.DBSF:
        return dbsf_fuse(legs, weights)
    return rrf_fuse(legs, cfg.rrf_k, weights)


def exact_phrases(query: str, proper_nouns: bool = False) -> list[str]:
    """Quoted phrases, and with ``proper_nouns`` multi-word names ("Ada Lovelace"), to match."""
    phrases = [a or b for a, b in _QUOTED.findall(query)]
    if proper_nouns:
        unquoted = _QUOTED.sub(" ", query)
        phrases += [m.group(0) for m in _PROPER_NOUN.finditer(unquoted)]
    unique: dict[str, str] = {}
    for phrase in phrases:
        unique.setdefault(phrase.lower(), phrase)
    return list(unique.values())


def boost_exact(hits: list[Retrieved], phrases: Sequence[str], boost: float) -> list[Retrieved]:
    """Raise a hit's score by ``boost`` (a share of its size) per phrase its text contains;
    a negative score (a dense cosine can be) rises too: multiplied, it fell."""
    if not phrases or boost <= 0:
        return hits
    lowered = [p.lower() for p in phrases]
    for hit in hits:
        text = hit.text.lower()
        matched = sum(1 for p in lowered if p in text)
        if matched:
            hit.scores["exact_matches"] = matched
            hit.score += abs(hit.score) * boost * matched
    return ranked(hits)


def mmr_select(
    query_vector: npt.NDArray[np.float32],
    hits: Sequence[Retrieved],
    vectors: dict[str, npt.NDArray[np.float32]],
    k: int,
    lam: float,
) -> list[Retrieved]:
    """Maximal Marginal Relevance on cosine similarities.

    Picks, one at a time, the hit maximising
    ``lam * sim(query, d) - (1 - lam) * max(sim(d, picked))``; ties go to the
    earlier hit. Hits without a stored vector keep their place at the end.
    """
    with_vec = [h for h in hits if h.point_id in vectors]
    without = [h for h in hits if h.point_id not in vectors]
    if not with_vec:
        return list(hits[:k])
    matrix = normalise(np.stack([vectors[h.point_id] for h in with_vec]))
    relevance = matrix @ normalise(query_vector[None, :])[0]
    picked: list[int] = []
    redundancy = np.full(len(with_vec), -np.inf)
    while len(picked) < min(k, len(with_vec)):
        penalty = np.where(np.isinf(redundancy), 0.0, redundancy)
        value = lam * relevance - (1 - lam) * penalty
        value[picked] = -np.inf
        best = int(np.argmax(value))
        picked.append(best)
        similarity = matrix @ matrix[best]
        redundancy = np.maximum(np.where(np.isinf(redundancy), -1.0, redundancy), similarity)
    out = []
    for i in picked:
        hit = with_vec[i]
        hit.scores["mmr_relevance"] = float(relevance[i])
        out.append(hit)
    return (out + without)[:k]


def lost_in_the_middle(hits: Sequence[Retrieved]) -> list[Retrieved]:
    """Best first, second best last, the weakest in the middle."""
    front = list(hits[0::2])
    back = list(hits[1::2])
    return front + back[::-1]
