"""Judge-free answer metrics: correctness, citations and degenerate outputs.

These score generated answers without an LLM judge, so they are cheap,
deterministic and reproducible; a judge can be added later, not relied on.

- ``normalize_answer`` / ``token_f1``: SQuAD's normalisation and bag-of-tokens
  F1 against the golden ``expected_answer``; the standard extractive-QA
  correctness score, tolerant of articles, punctuation and case.
- ``rouge_l``: ROUGE-L F1 (longest common subsequence of tokens, as Google's
  ``rouge-score`` without stemming); unlike token F1 it rewards word order.
- ``cosine``: cosine similarity of two embeddings (e.g. answer vs expected
  answer), to credit paraphrases that share few tokens.
- ``repetition_share`` / ``is_degenerate``: the share of word n-grams that
  repeat an earlier one; flags looping generations ("the answer is: the
  answer is: ...") that token overlap can still score well.
- ``citation_scores``: precision and recall of the ``[n]`` citations an answer
  makes against the given sources that hold a golden target; a citation of a
  source that was never given counts as wrong.

All functions are pure: stdlib and numpy only, inputs never mutated.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

DEGENERATE_SHARE = 0.3
"""Repetition share at or above which an answer counts as degenerate."""

DEGENERATE_MIN_NGRAMS = 8
"""Answers with fewer n-grams than this are never flagged as degenerate."""

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
# Scripts written without spaces between words: each character is a token (Hangul,
# written with spaces, is split at them as other scripts are).
_UNSPACED = "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
UNSPACED = _UNSPACED  # for other word counts (generate.sourced_share)
_TOKEN = re.compile(f"[{_UNSPACED}]|[^\\s{_UNSPACED}]+")
# rouge-score's tokens, [a-z0-9]+, for every script: a run of letters and digits (no
# underscore), or one Chinese or Japanese character.
_UNSPACED_CHAR = re.compile(f"[{_UNSPACED}]")


def _is_punctuation(ch: str) -> bool:
    """SQuAD's punctuation (``string.punctuation``), and any script's (a Chinese 。, a
    «quote», an em dash: SQuAD keeps them as tokens, so "北京。" scored F1 0.8 against
    "北京")."""
    return ch in _PUNCTUATION or (ch > "\x7f" and unicodedata.category(ch).startswith("P"))


def normalize_answer(text: str) -> str:
    """Normalise an answer as the official SQuAD v1.1 evaluation script does.

    Lower case, drop every character in ``string.punctuation`` and every
    other script's punctuation (Unicode category P: 。, «», —, curly quotes,
    which SQuAD's script keeps as tokens), drop the articles "a", "an",
    "the" as whole words, and collapse whitespace. On ASCII text, SQuAD's.

    Args:
        text: Raw answer text.

    Returns:
        The normalised text, tokens separated by single spaces.
    """
    lowered = unicodedata.normalize("NFC", text).lower()
    no_punct = "".join(ch for ch in lowered if not _is_punctuation(ch))
    no_articles = _ARTICLES.sub(" ", no_punct)
    return " ".join(no_articles.split())


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD token F1 between a prediction and a reference answer.

    Tokens are ``normalize_answer(...).split()``, a Chinese or Japanese character
    a token of its own (as CMRC scores Chinese; else an answer in those scripts is one
    token per sentence, all right or all wrong); overlap is the multiset
    (``Counter``) intersection, so a repeated token matches at most as often
    as it occurs in both.

    Args:
        prediction: The generated answer.
        reference: The expected answer.

    Returns:
        F1 in [0, 1]. When either side has no tokens: 1.0 if both are empty,
        else 0.0 (the SQuAD v2 rule).
    """
    pred_tokens = _TOKEN.findall(normalize_answer(prediction))
    ref_tokens = _TOKEN.findall(normalize_answer(reference))
    if not pred_tokens or not ref_tokens:
        return 1.0 if pred_tokens == ref_tokens else 0.0
    common = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def _rouge_tokens(text: str) -> list[str]:
    """rouge-score's default tokens without stemming, for every script: runs of letters,
    digits and combining marks (a Devanagari word's vowel signs are marks, which ``\\w``
    leaves out), or one Chinese or Japanese character. On ASCII, rouge-score's own."""
    tokens: list[str] = []
    run: list[str] = []
    for ch in unicodedata.normalize("NFC", text).lower():
        kind = unicodedata.category(ch)[0]
        if kind not in "LNM" or _UNSPACED_CHAR.match(ch):  # "・" is punctuation, not a word
            if run:
                tokens.append("".join(run))
                run.clear()
            if kind in "LN" and _UNSPACED_CHAR.match(ch):
                tokens.append(ch)
        else:
            run.append(ch)
    if run:
        tokens.append("".join(run))
    return tokens


def _lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    # Two-row dynamic programme: O(len(a) * len(b)) time, O(len(b)) memory.
    previous = [0] * (len(b) + 1)
    for token_a in a:
        current = [0] * (len(b) + 1)
        for j, token_b in enumerate(b, start=1):
            if token_a == token_b:
                current[j] = previous[j - 1] + 1
            else:
                current[j] = max(previous[j], current[j - 1])
        previous = current
    return previous[-1]


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F1 (beta = 1) between a prediction and a reference answer.

    Tokenised like Google's ``rouge-score`` default tokenizer without
    stemming: lower case, runs of letters and digits, everything else a
    separator; rouge-score's letters are ``[a-z]`` only, so "Москва" and
    "北京" were no token and an exact answer in them scored 0: here a letter
    is any script's, and a Chinese or Japanese character is a token of its
    own. On ASCII text the tokens are rouge-score's. Precision and recall are
    the longest common subsequence length over the prediction and reference
    lengths.

    Args:
        prediction: The generated answer.
        reference: The expected answer.

    Returns:
        F1 in [0, 1]; 0.0 when either side has no tokens.
    """
    pred_tokens = _rouge_tokens(prediction)
    ref_tokens = _rouge_tokens(reference)
    if not pred_tokens or not ref_tokens:
        return 0.0
    lcs = _lcs_length(pred_tokens, ref_tokens)
    if lcs == 0:
        return 0.0
    precision = lcs / len(pred_tokens)
    recall = lcs / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def cosine(
    a: Sequence[float] | npt.NDArray[Any],
    b: Sequence[float] | npt.NDArray[Any],
) -> float:
    """Cosine similarity of two vectors.

    Args:
        a: First vector.
        b: Second vector, of the same length.

    Returns:
        The cosine in [-1, 1]; 0.0 when either vector has zero norm.

    Raises:
        ValueError: If the vectors are not one-dimensional of equal length.
    """
    va = np.asarray(a, dtype=np.float64)
    vb = np.asarray(b, dtype=np.float64)
    if va.ndim != 1 or va.shape != vb.shape:
        raise ValueError(
            f"cosine needs two 1-D vectors of equal length, got shapes {va.shape} and "
            f"{vb.shape}; pass one embedding per argument"
        )
    norm = float(np.linalg.norm(va)) * float(np.linalg.norm(vb))
    if norm == 0.0:
        return 0.0
    return float(np.dot(va, vb)) / norm


def _check_n(n: int) -> None:
    if n < 1:
        raise ValueError(f"n-gram size must be at least 1, got n={n}")


def answer_tokens(text: str, n: int = 3) -> tuple[list[str], int]:
    """The tokens ``repetition_share`` counts, and the n-gram size it counts them in.

    Tokens are the lower-cased text's whitespace-separated words, except that a Chinese
    or Japanese character is a token of its own; a text mostly of such characters is
    counted in n-grams of ``2 * n`` of them (a word of these scripts is about two
    characters long: Japanese prose repeats 21 % of its character trigrams, 7 % of its
    6-grams). Without this a Chinese answer was one "word" per sentence and never looped.
    """
    tokens = _TOKEN.findall(unicodedata.normalize("NFC", text).lower())
    unspaced = sum(1 for t in tokens if len(t) == 1 and _UNSPACED_CHAR.match(t))
    return tokens, 2 * n if 2 * unspaced > len(tokens) else n


def repetition_share(text: str, n: int = 3) -> float:
    """Share of the word n-grams of a text that repeat an earlier n-gram.

    Tokens are the lower-cased text's whitespace-separated words (a Chinese or Japanese
    character is a token, counted in n-grams of ``2 * n``: ``answer_tokens``); a text
    of ``k`` tokens has ``k - n + 1`` n-grams. The first occurrence of each n-gram is
    new, every later occurrence is a repeat.

    Args:
        text: The answer text.
        n: The n-gram size.

    Returns:
        Repeats over n-grams in [0, 1); 0.0 when the text has no n-grams.

    Raises:
        ValueError: If ``n`` is less than 1.
    """
    _check_n(n)
    tokens, n = answer_tokens(text, n)
    total = len(tokens) - n + 1
    if total <= 0:
        return 0.0
    seen: set[tuple[str, ...]] = set()
    repeats = 0
    for i in range(total):
        gram = tuple(tokens[i : i + n])
        if gram in seen:
            repeats += 1
        else:
            seen.add(gram)
    return repeats / total


# A citation is a word of its own when loops are counted ("[1][1][1]..." ran to
# max_tokens as one "word"); markup ("|", "|---|", "-", "**") and list numbers ("2.",
# "(3)") are no words: a table of yes/no rows repeated its pipes, not itself.
_LOOP_CITATION = re.compile(r"(\[[^\[\]\s]{1,12}\])")
_ENUMERATOR = re.compile(r"\(?\d{1,3}[.):]\)?")


_DIGITS = re.compile(r"\d+")
# The periods tried: the distances most often seen between an n-gram and its last
# occurrence (a loop's period is the commonest), at most this many.
LOOP_PERIODS = 32


def loop_tokens(text: str, n: int = 3) -> tuple[list[str], int]:
    """``answer_tokens`` as loops are counted: citations split off as words of their own,
    markup and list numbers left out."""
    tokens, size = answer_tokens(_LOOP_CITATION.sub(r" \1 ", text), n)
    return [t for t in tokens if any(c.isalnum() for c in t) and not _ENUMERATOR.fullmatch(t)], size


def _counted(tokens: Sequence[str]) -> list[str]:
    """Every number the same number: "[7] The answer is" and "[8] The answer is" are one
    loop that counts (``_repeats_itself`` checks that it counts)."""
    return [_DIGITS.sub("0", t) for t in tokens]


def _periods(tokens: Sequence[str], size: int) -> list[int]:
    """The distances most often seen between an n-gram of ``tokens`` and its last
    occurrence: the periods a loop could have (no cap on their length: a paragraph of 141
    words said three times is a loop)."""
    last: dict[tuple[str, ...], int] = {}
    seen: Counter[int] = Counter()
    for i in range(len(tokens) - size + 1):
        gram = tuple(tokens[i : i + size])
        if gram in last:
            seen[i - last[gram]] += 1
        last[gram] = i
    return [p for p, _ in seen.most_common(LOOP_PERIODS)]


# A word as copies are compared: a run of letters and digits, or one Chinese or Japanese
# character ("v1.2.0," is v1, 2, 0; "`opt3`" is opt3).
_COPY_WORD = re.compile(f"[{_UNSPACED}]|(?:(?![{_UNSPACED}])\\w)+")


def _copy_words(tokens: Sequence[str]) -> str:
    """``tokens`` (``loop_tokens``) as the words a copy is compared in, citations left out,
    one space between them and around them."""
    words = [w for t in tokens if not _LOOP_CITATION.fullmatch(t) for w in _COPY_WORD.findall(t)]
    return f" {' '.join(words)} "


def _copied(run: Sequence[str], sources: Sequence[str], known: list[str]) -> bool:
    """Whether the tokens of ``run`` occur word for word, numbers as written, in one of
    ``sources`` (their ``_copy_words`` kept in ``known`` once worked out). A list that
    spans chunks is in one of them only when the caller joins a file's neighbouring chunks
    (``generate.copy_texts``)."""
    if not sources:
        return False
    if not known:
        known.extend(_copy_words(loop_tokens(s)[0]) for s in sources)
    words = _copy_words(run)
    return words.strip() != "" and any(words in source for source in known)


def _repeats_itself(
    tokens: Sequence[str], least: int, size: int, sources: Sequence[str] = ()
) -> bool:
    """Whether a run of ``tokens`` follows itself (``x x``, ``x`` of any length p) over at
    least ``max(2p, least)`` tokens, with a word or a citation in it, its numbers equal or
    counting: each number one period on differs from it as it did one period before
    ("[7] ... [8] ... [9]", "Step 5 ... Step 6"). What a loop does, and a templated list of
    steps or a table of rows does not, each with a name or a figure of its own ("revenue
    was 2.1 million", "2.4", "3.0"), nor a table of numbers alone.

    Nor a list copied from one of ``sources``: a run whose last two periods, the seam
    between them included, occur word for word (numbers as written, citations aside) in
    one source ("Week 7: run 11 km ... Week 8: run 12 km ..." of a 10-week plan, cut at
    week 8 as a loop). A loop's seam is its own: "[8] The answer is [9] The answer is"
    occurs in no source, nor a whole list said again after its last item."""
    known: list[str] = []
    counted = _counted(tokens)
    codes = {t: i for i, t in enumerate(dict.fromkeys([*tokens, *counted]))}
    raw = np.fromiter((codes[t] for t in tokens), dtype=np.int64, count=len(tokens))
    ids = np.fromiter((codes[t] for t in counted), dtype=np.int64, count=len(tokens))
    worded = np.fromiter((any(c.isalpha() for c in t) for t in tokens), dtype=bool,
                         count=len(tokens))  # fmt: skip

    def step(j: int, period: int) -> tuple[int, ...]:
        a, b = _DIGITS.findall(tokens[j]), _DIGITS.findall(tokens[j + period])
        return tuple(int(y) - int(x) for x, y in zip(a, b, strict=True))

    for period in _periods(counted, size):
        if period > len(ids) // 2:
            continue
        counted_same = ids[period:] == ids[:-period]
        same = counted_same.copy()
        for j in np.flatnonzero(same & (raw[period:] != raw[:-period])).tolist():  # a number:
            same[j] = (  # it counts on (as it did one period before), or it breaks the run
                j >= period and counted_same[j - period]
                and step(j, period) == step(j - period, period)
            )  # fmt: skip
        runs = np.concatenate(([0], same.astype(np.int8), [0]))
        edges = np.flatnonzero(np.diff(runs))  # starts and ends of runs of matches
        for start, end in zip(edges[::2], edges[1::2], strict=True):
            if (
                end - start >= max(period, least - period)
                and worded[start : end + period].any()
                and not _copied(tokens[end - period : end + period], sources, known)
            ):
                return True
    return False


# A piece of 2 to 8 characters written 64 times in a row with no space ("[1][1]...",
# "|---|---..."), or one character 256 times: a loop whatever the words around it. Not
# in code: a test runner's 70 dashes, a hash of 64 zeros.
_UNIT_RUN = re.compile(r"(\S{1,8}?)\1{63,}")
# Code in an answer: a fenced block (to the end if unclosed) or an inline span.
CODE_SPAN = re.compile(r"```.*?(?:```|\Z)|`[^`\n]+`", re.DOTALL)


def unit_run(text: str) -> bool:
    """Whether ``text`` (its code aside) writes a piece of 2 to 8 characters 64 times
    running, or one character 256 times."""
    for found in _UNIT_RUN.finditer(CODE_SPAN.sub(" ", text)):
        if len(set(found.group(1))) > 1 or len(found.group(0)) >= 256:
            return True
    return False


def is_degenerate(
    text: str, n: int = 3, share: float = DEGENERATE_SHARE, sources: Sequence[str] = ()
) -> bool:
    """Whether an answer loops: long enough, mostly repeated n-grams, and a run of it
    repeated verbatim right after itself, not copied from one of ``sources``.

    Counted over ``loop_tokens`` (citations are words, markup and list numbers are not).
    The repeated run tells a loop from a list or a table whose every item has the same
    shape ("1. Install vim with apt [2]. 2. Install git with apt [3]."): such answers
    repeat a third of their n-grams too, and were cut as loops.

    Args:
        text: The answer text.
        n: The n-gram size.
        share: The repetition share at or above which the answer is flagged.
        sources: The texts the answer was written from: a run whose last two periods
            occur in one of them word for word is a list copied from it, not a loop (a
            12-week plan, 15 numbered settings). Neighbouring chunks of a file go in
            joined (``generate.copy_texts``), or a list across two is cut at their seam.

    Returns:
        True when the answer has at least ``DEGENERATE_MIN_NGRAMS`` n-grams, at least
        ``share`` of them repeat an earlier one, and a run of it repeats itself at once
        over as many tokens as those n-grams span, not copied from a source; or when it
        writes a piece of up to 8 characters 64 times running (``unit_run``).

    Raises:
        ValueError: If ``n`` is less than 1.
    """
    _check_n(n)
    if unit_run(text):
        return True
    tokens, size = loop_tokens(text, n)
    n_grams = len(tokens) - size + 1
    if n_grams < DEGENERATE_MIN_NGRAMS:
        return False
    counted = _counted(tokens)
    seen: set[tuple[str, ...]] = set()
    repeats = 0
    for i in range(n_grams):
        gram = tuple(counted[i : i + size])
        repeats += gram in seen
        seen.add(gram)
    least = DEGENERATE_MIN_NGRAMS + size - 1
    return repeats / n_grams >= share and _repeats_itself(tokens, least, size, sources)


def citation_scores(
    cited: Sequence[int],
    supporting: Collection[int],
    given: Collection[int],
    wrong: Collection[int] = (),
) -> tuple[float | None, float | None]:
    """Citation precision and recall of one answer.

    Args:
        cited: Every citation number the answer used, in order, including
            numbers that point at no given source; duplicates count once.
        supporting: Numbers of the given sources that contain a golden target.
        given: Numbers of every source given to the model.
        wrong: Cited numbers that count as wrong in precision whatever they
            hold (a source cited for a sentence another source holds).

    Returns:
        ``(precision, recall)``. Precision is the share of distinct cited
        numbers that are given, supporting sources and not ``wrong`` (an
        invalid citation counts as wrong); None when nothing is cited. Recall
        is the share of given, supporting sources that are cited; None when no
        given source supports.
    """
    cited_set = set(cited)
    supported = set(supporting) & set(given)
    correct = len(cited_set & supported)
    precision = len((cited_set & supported) - set(wrong)) / len(cited_set) if cited_set else None
    recall = correct / len(supported) if supported else None
    return precision, recall
