"""Measure the judge before believing it: a calibration probe from the golden set and index.

The RAGAS metrics rest on three judgements the judge model makes over and over:
*is this statement supported by this passage?* (faithfulness, context recall),
*does this passage state any of this answer?* (context precision) and *does this
answer address this question?* (answer relevancy). Before a RAG run scores
anything, the judge answers each kind of question on pairs whose truth is known by
construction, built from the run's own golden set and index:

- **supported**: a sentence taken from a target chunk, with that chunk as passage;
- **other section**: a sentence from another section of the same file, with the same
  passage: the document's vocabulary and domain, not stated by the passage (since
  2026-12-02; the judge lets such claims through more often than other files');
- **unrelated**: a sentence from a chunk of another file, with the same passage, where
  the file has no other section;
- **altered**: the supported sentence with a number changed or a negation added;
- **invented reason**: the supported sentence with a generic reason its passage does not
  give (``REASONS``: "…, because it is the recommended way."), the form most of a real
  answer's unsupported sentences take, a stated claim with something the model added
  (since late on 2026-12-02; before, the false statements were whole sentences of the
  corpus or one-word edits, and a prompt that let every real answer's additions through
  scored kappa 0.75 on the probe, 0.00 against a person's labels of real answers);
- **matching answer**: a question with its own expected answer (or the opening of
  its target chunk);
- **mismatched answer**: the question with another item's answer;
- **useful context**: a question and its reference answer with the target chunk that
  holds the most of the answer's words, at least half (context precision's judgement);
- **unrelated / neighbour context**: the same with a chunk of a file the item does not
  name, or of the target's file outside the target's sections, holding under half of
  the answer's words. A context pair's answer is always a reference (or a chunk's
  opening): the reference-free context precision, which judges against the generated
  answer, is calibrated by them only as far as the judgement is the same.

A statement pair is asked the way faithfulness asks about each statement
(``eval.judge_verdicts``): by default ``STATEMENT_PROMPT``, the passage then the statement,
for a bare verdict (``ask_statement``); with ``ragas``, ragas's NLI prompt with the passage
as context, a reason, then the verdict (``statement_verdict``). Until 2026-12-01 the probe
asked its own short prompt while faithfulness asked ragas's, and so vouched for a
judgement the metrics did not make; since 2026-12-02 faithfulness asks the short prompt
too, which the 1.5B judge answers better and faster (``STATEMENT_PROMPT``).
A context pair is asked the way context precision asks about each context
(``ask_context``): ``CONTEXT_PROMPT`` for a bare verdict, or ragas's prompt with
``ragas``. Answer relevancy has no verdict to copy (ragas compares generated questions), so answer
pairs keep a short prompt of their own.

Half the pairs are true, half false. The judge's accuracy and Cohen's kappa, with
bootstrap CIs (``ragpipe.evaluation.agreement``), say whether its verdicts carry
information: a judge that says "yes" to everything scores kappa 0. Kappa is also
measured per judgement, and each metric is trusted by the kappa of the judgement it
rests on (``METRIC_JUDGEMENT``): a judge that reads passages well but calls every
answer relevant cannot vouch for answer relevancy.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ragpipe.evaluation.agreement import Agreement, agreement
from ragpipe.evaluation.check import IndexView
from ragpipe.evaluation.golden import GoldenItem, GoldenSet
from ragpipe.models.llm import LLM, Completion, DelegatingLLM, Message

SUPPORTED, UNRELATED, ALTERED = "supported", "unrelated", "altered"
OTHER_SECTION, INVENTED = "other_section", "invented_reason"
MATCHING, MISMATCHED = "matching_answer", "mismatched_answer"
USEFUL, UNRELATED_CONTEXT, NEIGHBOUR = "useful_context", "unrelated_context", "neighbour_context"

STATEMENTS, ANSWERS, CONTEXTS = "statements", "answers", "contexts"
JUDGEMENTS = (STATEMENTS, ANSWERS, CONTEXTS)
JUDGEMENT = {SUPPORTED: STATEMENTS, UNRELATED: STATEMENTS, ALTERED: STATEMENTS,
             OTHER_SECTION: STATEMENTS, INVENTED: STATEMENTS,
             MATCHING: ANSWERS, MISMATCHED: ANSWERS,
             USEFUL: CONTEXTS, UNRELATED_CONTEXT: CONTEXTS, NEIGHBOUR: CONTEXTS}  # fmt: skip
# The judgement each RAGAS metric's verdicts are made of.
METRIC_JUDGEMENT = {
    "faithfulness": STATEMENTS,
    "context_recall": STATEMENTS,
    "context_precision": CONTEXTS,
    "answer_relevancy": ANSWERS,
}
MIN_PAIRS = 4  # fewer pairs of a judgement calibrate nothing
# A judgement is believed only when a judge blind to the truth would score as well with a
# chance under this (agreement.chance_p): kappa alone passes a coin on 8 pairs one time in
# seven. On 8 pairs, half true, it takes 7 right (chance 9/256); 4 pairs never suffice.
CHANCE_P = 0.05
# The fewest pairs of a judgement, half true, that can be trusted: all 6 right, which a
# coin matches with chance 1/64 (4 pairs: 1/16, never).
TRUSTABLE_PAIRS = 6
# How a failed verdict's reason starts when the judge replied without one (any other
# reason is a call that raised or timed out: the judge did not answer).
NO_VERDICT = "no verdict in"
VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"verdict": {"type": "integer", "enum": [0, 1]}},
    "required": ["verdict"],
}
# Faithfulness's verdict on one statement, and the probe's on a statement pair, where
# eval.judge_verdicts is "statement" (the default since 2026-12-02): this prompt, one call a
# statement, {"verdict": 0|1} only. The passage comes before the statement, so the
# statements of one answer share all of a prompt but their own line, which llama.cpp's
# prompt cache (and vLLM's prefix cache) reads once. It asks whether the statement adds
# anything, since later on 2026-12-02: asked only whether the passage "states it or directly
# implies it" (LENIENT_PROMPT in bench/faithfulness_claims.py), the packaged 1.5B called
# all 112 sentences of 19 real answers supported, the 10 a person found unsupported
# among them (invented reasons, a contradicted "efficient", a wrong reference) too: kappa
# 0.00, faithfulness 1.000 where the hand labels give 0.882. This prompt: kappa 0.40 [0.09,
# 0.65], 5 of the 10 caught, 7 of the 102 supported ones called unsupported, faithfulness
# 0.842, at the same 3.3 s a sentence (bench/faithfulness_claims.py hand). ragas's NLI
# prompt with a reason: see that bench's results. On the probe's statement pairs of
# 2026-12-02 (bench/probe_prompt.py, 48 pairs) the lenient prompt scored 0.875, kappa 0.75.
STATEMENT_PROMPT = """Does the passage say everything the statement says?
Answer 0 if the statement adds anything the passage does not say (a reason, a claim, a \
recommendation, a source) or contradicts it; answer 1 if all of it is stated in the passage.

Passage:
{passage}

Statement: {statement}

Reply with JSON only: {{"verdict": 1}} or {{"verdict": 0}}."""
VERDICTS = ("statement", "ragas")  # the ways of eval.judge_verdicts
VERDICT_TOKENS = 16  # a bare verdict's reply: {"verdict": 1} is about 6 tokens
_VERDICT_OBJECT = re.compile(r'\{\s*"verdict"\s*:\s*([01])\s*\}')
# Context precision's verdict on one retrieved context, where eval.judge_verdicts is
# "statement": this prompt, one call a context, {"verdict": 0|1} only. The question and
# the reference answer come before the passage, so the contexts of one question share all
# of a prompt but the passage and the last line (llama.cpp's prompt cache reads them once).
# With eval.judge_verdicts: ragas, ragas's ContextPrecisionPrompt (three worked examples,
# the context between question and answer, a reason before the verdict). Measured with
# bench/context_prompt.py, the packaged 1.5B judge on 32 context pairs of known truth from
# each dev set (``build_context_pairs``; 2026-12-02), accuracy and kappa, r-faq / debfaq:
# this prompt 0.750, 0.50 / 0.844, 0.69 at 3.5 s a pair; ragas's prompt 0.781, 0.56 /
# 0.781, 0.56 at 9.2 s; ragas's prompt with the reason bounded at 0 characters 0.562 /
# 0.594 (it called 2 and 3 of 16 useful contexts useful); asked whether the passage was
# "useful for arriving at the answer" with a bare verdict, 0.594 / 0.781 (it called 7 of 8
# unrelated r-faq passages useful). The two ways err in opposite directions: ragas's
# prompt called 6 of 16 contexts holding the reference word for word not useful (on each
# set), this prompt 6 of 8 r-faq passages of another file useful (lorem ipsum among them)
# but 19 of 24 same-topic passages (a neighbouring section, another debfaq answer) right,
# against 22 of 24 for ragas's. Equal accuracy within the noise, 2.6 times faster, and no
# reason to sway the verdict: this one. The probe's context pairs say how far to trust it.
CONTEXT_PROMPT = """Does the passage contain any of the information given in the answer?
Answer 1 if at least one fact of the answer is stated in the passage; answer 0 if none is.

Question: {question}

Answer: {answer}

Passage:
{passage}

Reply with JSON only: {{"verdict": 1}} or {{"verdict": 0}}."""
ANSWER_PROMPT = """Does the answer address the question?
Answer 1 if it answers this question; answer 0 if it is about something else.

Question: {question}

Answer: {answer}

Reply with JSON only: {{"verdict": 1}} or {{"verdict": 0}}."""
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_NUMBER = re.compile(r"\b\d+(?:\.\d+)?\b")
_AUXILIARY = re.compile(r"\b(is|are|was|were|can|does|do|should|will|must|has|have)\b")
PASSAGE_CHARS = 1200
CONTEXT_MIN_WORDS = 12  # a context pair's passage: a heading alone is useful to nothing
USEFUL_SHARE = 0.5  # a useful context holds at least half the answer's words, a false one less
CLAIM_WORDS = 40  # a statement given an invented reason: at most this many words
PROBE_ROUNDS = 4  # passes over the golden items while the probe has room


@dataclass(frozen=True)
class ProbePair:
    """One question to the judge whose answer is known."""

    kind: str
    truth: int  # 1: supported / addresses the question
    prompt: str
    item_id: str
    shown: str  # the statement, answer or passage, for the report
    passage: str = ""  # a statement or context pair's passage
    question: str = ""  # a context pair's question
    answer: str = ""  # a context pair's reference answer


@dataclass
class Calibration:
    """The judge's verdicts on the probe and what they say about it."""

    pairs: list[ProbePair]
    verdicts: list[int | None]
    reasons: list[str | None]
    agreement: Agreement
    min_kappa: float
    model: str
    notes: list[str] = field(default_factory=list)
    by_judgement: dict[str, Agreement] = field(default_factory=dict)
    way: str = "statement"  # how statement and context pairs were asked (eval.judge_verdicts)

    def _passes(self, a: Agreement) -> bool:
        return not np.isnan(a.kappa) and a.kappa >= self.min_kappa

    @staticmethod
    def _unavailable(a: Agreement) -> bool:
        """More than half of the pairs got no verdict: the kappa, failures counted as wrong
        answers, says nothing of the judge's judgement (every call failing read as kappa
        -1.00, a judge that always says the opposite)."""
        return 2 * a.failed > a.n

    def _trusted(self, a: Agreement) -> bool | None:
        """False: kappa under the bar, or most pairs unanswered; None: too few pairs, or a
        kappa a judge blind to the truth reaches too often (chance ``>= CHANCE_P``) to tell
        it from luck; else True."""
        if self._unavailable(a):
            return False
        if a.n < MIN_PAIRS:
            return None
        if not self._passes(a):
            return False
        return True if a.p_chance < CHANCE_P else None

    @property
    def unavailable(self) -> bool:
        """More than half of the probe's calls gave no verdict (they raised, timed out, or
        the reply held none): the judge was not measured, and its metrics are withheld."""
        return self._unavailable(self.agreement)

    @property
    def unreachable(self) -> bool:
        """Every probe call raised or timed out: not one was answered (a judge that is
        down, or that errs or times out on every request)."""
        return bool(self.reasons) and all(
            r is not None and not r.startswith(NO_VERDICT) for r in self.reasons
        )

    def failures(self) -> str:
        """How many probe calls failed, and the first one's reason: ``12 of 12 probe calls
        failed (first: ConnectionError: ...)``."""
        failed = [r for r in self.reasons if r is not None]
        first = f" (first: {failed[0]})" if failed else ""
        return f"{len(failed)} of {len(self.reasons)} probe calls failed{first}"

    @property
    def failed(self) -> bool:
        """Kappa under the bar (or undefined) overall or for a judgement asked enough pairs,
        or most calls failed."""
        return (
            self.unavailable
            or not self._passes(self.agreement)
            or any(
                self._unavailable(a) or (a.n >= MIN_PAIRS and not self._passes(a))
                for a in self.by_judgement.values()
            )
        )

    @property
    def uncalibrated(self) -> list[str]:
        """The judgements asked too few pairs to say anything, or passed on pairs a judge
        blind to the truth passes too often (their metrics are "judge not calibrated", so the
        judge as a whole is not vouched for)."""
        return [
            j for j in JUDGEMENTS
            if (a := self.by_judgement.get(j)) is None or self._trusted(a) is None
        ]  # fmt: skip

    @property
    def reliable(self) -> bool:
        """Kappa at or above the bar overall and for every judgement, each asked at least
        MIN_PAIRS pairs (an undefined kappa is not), on as many right as a judge blind to the
        truth would reach with a chance under CHANCE_P."""
        return not self.failed and not self.uncalibrated and self._trusted(self.agreement) is True

    def _deciding(self, metric: str) -> Agreement | None:
        """The agreement that decides ``metric``: its judgement's when that says trusted or
        not; else the whole probe's when that failed (distrust carries over, trust does
        not); else its judgement's when it had MIN_PAIRS pairs (not calibrated: a blind
        judge does as well); else None. A probe most of whose calls failed decides every
        metric: the judge is unavailable, whatever the few answered pairs said."""
        if self.unavailable:
            return self.agreement
        a = self.by_judgement.get(METRIC_JUDGEMENT.get(metric, ""))
        if a is not None and self._trusted(a) is not None:
            return a
        whole = self.agreement
        if self._trusted(whole) is False:
            return whole
        return a if a is not None and a.n >= MIN_PAIRS else None

    def reliable_for(self, metric: str) -> bool | None:
        """Whether the judgement ``metric`` rests on passed (None: not calibrated: too few
        of its pairs, or a pass a judge blind to the truth makes too often, and nothing else
        says the judge fails)."""
        a = self._deciding(metric)
        return None if a is None else self._trusted(a)

    def label(self) -> str:
        a = self.agreement
        if self.unavailable:  # a kappa of failures (-1.00 when all failed) is no measure
            return f"judge unavailable: {self.failures()}"
        state = "reliable" if self.reliable else "unreliable" if self.failed else (
            f"not calibrated on {', '.join(self._why_uncalibrated())}"
        )  # fmt: skip
        parts = [
            f"{j} unavailable ({b.failed} of {b.n} probe calls failed)"
            if self._unavailable(b) else f"{j} {_kappa(b)}{_chance(b)}"
            for j, b in self.by_judgement.items()
        ]  # fmt: skip
        per = f"; {', '.join(parts)}" if parts else ""
        return (
            f"judge {state} (kappa {_kappa(a, ci=True)} on {a.n} probe pairs{per}; "
            f"min {self.min_kappa:g})"
        )

    def _why_uncalibrated(self) -> list[str]:
        """Each judgement not vouched for, and why: no pairs, too few, or a pass a judge
        blind to the truth makes too often."""
        why = []
        for j in self.uncalibrated:
            a = self.by_judgement.get(j)
            if a is None:
                why.append(f"{j} (no pairs)")
            elif a.n < MIN_PAIRS:
                why.append(f"{j} ({a.n} pairs, fewer than {MIN_PAIRS})")
            else:
                why.append(f"{j} ({a.n} pairs{_chance(a)})")
        if not why:  # every judgement passed; the whole probe did not beat chance
            whole = self.agreement
            why.append(f"the whole probe ({whole.n} pairs{_chance(whole)})")
        return why

    def short_for(self, metric: str) -> str:
        """What a flagged or withheld metric's headline cell says (the section heading has
        the rest)."""
        judgement = METRIC_JUDGEMENT.get(metric, "")
        deciding = self._deciding(metric)
        if deciding is None:
            return "judge not calibrated"
        on = f" on {judgement}" if deciding is not self.agreement else ""
        if self._unavailable(deciding):
            failed = f"{deciding.failed} of {deciding.n} probe calls failed"
            return f"judge unavailable{on} ({failed})"
        trusted = self._trusted(deciding)
        if trusted is None:  # kappa passed, on too few pairs to tell it from luck
            return (
                f"judge not calibrated{on} (kappa {_kappa(deciding)} on {deciding.n} pairs"
                f"{_chance(deciding)})"
            )
        return f"judge {'reliable' if trusted else 'unreliable'}{on} (kappa {_kappa(deciding)})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "statement_pairs_asked": self.way,
            "reliable": self.reliable,
            "unavailable": self.unavailable,
            "min_kappa": self.min_kappa,
            "label": self.label(),
            **self.agreement.as_dict(),
            "by_judgement": {
                j: {**a.as_dict(), "reliable": self._trusted(a)}
                for j, a in self.by_judgement.items()
            },
            "by_kind": {
                kind: {
                    "truth": next(p.truth for p in self.pairs if p.kind == kind),
                    "pairs": sum(p.kind == kind for p in self.pairs),
                    "correct": sum(
                        p.kind == kind and v == p.truth
                        for p, v in zip(self.pairs, self.verdicts, strict=True)
                    ),
                }
                for kind in dict.fromkeys(p.kind for p in self.pairs)
            },
            "pairs": [
                {
                    "kind": p.kind,
                    "item_id": p.item_id,
                    "truth": p.truth,
                    "verdict": v,
                    "shown": p.shown[:200],
                    "failure": r,
                }
                for p, v, r in zip(self.pairs, self.verdicts, self.reasons, strict=True)
            ],
            "notes": self.notes,
        }


def _chance(a: Agreement) -> str:
    """What a kappa is worth when a judge blind to the truth reaches it too often."""
    if a.p_chance < CHANCE_P or np.isnan(a.kappa) or a.kappa <= 0:
        return ""
    return f", a blind judge does as well with p={a.p_chance:.2g}"


def _kappa(a: Agreement, ci: bool = False) -> str:
    kappa = "undefined" if np.isnan(a.kappa) else f"{a.kappa:.2f}"
    if not ci:
        return kappa
    bounds = "no CI" if np.isnan(a.kappa_low) else f"[{a.kappa_low:.2f}, {a.kappa_high:.2f}]"
    return f"{kappa} {bounds}"


def sentences(text: str, min_words: int = 6) -> list[str]:
    """Sentences of a chunk worth stating: at least ``min_words`` words, no table rows."""
    out = []
    for part in _SENTENCE.split(" ".join(text.split())):
        part = part.strip()
        if len(part.split()) >= min_words and "|" not in part and not part.startswith("#"):
            out.append(part)
    return out


def alter(sentence: str) -> str | None:
    """The sentence made false: its first number changed, else a negation added."""
    number = _NUMBER.search(sentence)
    if number:
        value = number.group(0)
        # x3 for a decimal, +7 for a zero one: 0.0 x 3 is "0", the same value (a true
        # statement the probe counted false)
        number_ = float(value)
        changed = (
            str(int(number_) + 7)
            if "." not in value
            else f"{number_ * 3 if number_ else number_ + 7:g}"
        )
        return sentence[: number.start()] + changed + sentence[number.end() :]
    aux = _AUXILIARY.search(sentence)
    if aux and not re.search(r"\bnot\b|n't\b", sentence):
        return sentence[: aux.end()] + " not" + sentence[aux.end() :]
    return None


# What a model adds to a stated claim (the hand-labelled answers' unsupported sentences: an
# invented reason, "as it can be difficult to manage and customize"; a quality the passage
# does not give, "This is efficient and easy to remember"): a generic justification, on the
# topic of any claim. Each with the word beginnings that, found in the passage, rule it out:
# the passage might say it in other words ("the most convenient way" is near enough to "the
# recommended way").
REASONS = (
    ("because it is the fastest way", ("fast", "quick", "speed", "rapid", "slow")),
    ("because it is the recommended way",
     ("recommend", "advis", "suggest", "prefer", "best", "convenient", "should")),
    ("which makes it more reliable", ("reliab", "robust", "stabl", "safe")),
    ("as this is easier to maintain", ("maint", "easie", "simpl")),
    ("because it uses less memory", ("memor", "ram", "space", "large", "big")),
    ("which is the most efficient approach", ("efficien", "perform", "fast", "optim")),
    ("as it avoids common errors",
     ("error", "mistake", "wrong", "bug", "fail", "problem", "pitfall", "avoid", "warn")),
    ("because it is more secure", ("secur", "safe", "protect", "attack")),
    ("since it works the same on every platform",
     ("platform", "windows", "linux", "mac", "unix", "portab", "system")),
)  # fmt: skip


def invent(sentence: str, reason: str) -> str:
    """``sentence`` with a reason it does not give, joined on after a comma."""
    return f"{sentence.rstrip(' .!?;:')}, {reason}."


def _reasons_for(passage: str) -> list[str]:
    """The REASONS ``passage`` does not state: no word of it begins as one of a reason's
    word beginnings."""
    words = set(re.findall(r"[a-z]+", passage.lower()))
    return [
        reason for reason, beginnings in REASONS
        if not any(w.startswith(beginnings) for w in words)
    ]  # fmt: skip


def _claim(sentence: str) -> bool:
    """Whether ``sentence`` can take an invented reason as an answer's sentence would: a
    statement (a full stop at the end) of at most CLAIM_WORDS words."""
    return sentence.endswith(".") and len(sentence.split()) <= CLAIM_WORDS


def _target_chunks(item: GoldenItem, view: IndexView) -> list[dict[str, Any]]:
    """Chunks that answer the item: its graded chunk targets' matches (a grade-0 target is
    a distractor, never an answer), else, with no chunk targets, its files' chunks."""
    found = []
    for target in (t for t in item.chunks if t.grade > 0):
        for path in view.matching(target.file):
            found += [p for p in view.payloads(path) if target.matches(p)]
    if found or item.chunks:
        return found
    files = [s for s, g in sorted(item.relevance.items(), key=lambda kv: -kv[1]) if g > 0]
    for suffix in files[:1]:
        for path in view.matching(suffix)[:1]:
            found += view.payloads(path)[:2]
    return found


def build_probe(golden: GoldenSet, view: IndexView, size: int, seed: int) -> list[ProbePair]:
    """About ``size`` pairs, half true, seeded.

    A third of them, rounded down to even, are context pairs (``build_context_pairs``);
    of the rest, rounded down to a multiple of 4, statement pairs and answer pairs
    alternate over the items in a seeded order (a statement pair's false half: the kinds
    in turn as ``false_quota`` divides them; each pair the kind with the most still to
    make that can be made), for up
    to PROBE_ROUNDS passes, never asking the same statement or answer twice; an item that
    gives no usable sentence is passed over. Fewer pairs come back when the golden set
    and index cannot supply enough.
    """
    contexts = build_context_pairs(golden, view, 2 * (size // 6), seed)
    size -= len(contexts)
    rng = np.random.default_rng(seed)
    items = [i for i in golden.items if i.answerable]
    order = [items[j] for j in rng.permutation(len(items))]
    quota = {SUPPORTED: size // 4, MATCHING: size // 4, MISMATCHED: size // 4}
    quota |= false_quota(size // 4)
    pairs: list[ProbePair] = []
    files = view.files
    seen: set[str] = set()
    # Several rounds over the items, each item taking the other kind of pair in the next
    # round, so a small golden set still fills the probe.
    for turn in range(PROBE_ROUNDS * len(order)):
        item = order[turn % len(order)]
        chunks = _target_chunks(item, view)
        passages = [" ".join(str(c.get("text", "")).split())[:PASSAGE_CHARS] for c in chunks]
        usable = [(p, sentences(p)) for p in passages if sentences(p)]
        if not usable:
            continue
        passage, said = usable[int(rng.integers(len(usable)))]
        said = [said[j] for j in rng.permutation(len(said))]
        statement = next((s for s in said if s not in seen), said[0])
        statement_turn = (turn + turn // len(order)) % 2 == 0 or quota[MATCHING] == 0
        if statement_turn and quota[SUPPORTED] > 0:
            if statement in seen:
                continue
            # The false kinds with pairs still to make, the most first (ties: invented
            # reasons, other-section sentences, altered ones): the first that can be made.
            made = None
            for kind in sorted((INVENTED, UNRELATED, ALTERED), key=lambda k: -quota[k]):
                if quota[kind] > 0:
                    made = _false_statement(kind, statement, said, seen, passage, chunks,
                                            item, view, files, rng)  # fmt: skip
                    if made is not None:
                        break
            if made is None:
                continue  # the pair's false half cannot be made: keep the probe balanced
            statement, false, false_kind = made
            quota_kind = UNRELATED if false_kind == OTHER_SECTION else false_kind
            seen.add(statement)
            quota[SUPPORTED] -= 1
            quota[quota_kind] -= 1
            pairs.append(_statement(SUPPORTED, 1, item, passage, statement))
            pairs.append(_statement(false_kind, 0, item, passage, false))
        elif quota[MATCHING] > 0:
            answer = item.expected_answer or " ".join(said[:2])
            others = [o for o in items if o.id != item.id]
            if not others:
                continue
            other = others[int(rng.integers(len(others)))]
            other_chunks = _target_chunks(other, view)
            other_said = [s for c in other_chunks for s in sentences(str(c.get("text", "")))]
            wrong = other.expected_answer or " ".join(other_said[:2])
            if not wrong or wrong == answer or answer in seen:
                continue
            seen.add(answer)
            quota[MATCHING] -= 1
            pairs.append(_answer(MATCHING, 1, item, answer))
            quota[MISMATCHED] -= 1
            pairs.append(_answer(MISMATCHED, 0, item, wrong))
        if not any(quota.values()):
            break
    return pairs + contexts


def false_quota(n: int) -> dict[str, int]:
    """How ``n`` false statements divide among the false kinds: handed out in turn, an
    invented reason, an other-section (or unrelated) sentence, an altered one, again."""
    return {INVENTED: (n + 2) // 3, UNRELATED: (n + 1) // 3, ALTERED: n // 3}


def _false_statement(
    kind: str,
    statement: str,
    said: list[str],
    seen: set[str],
    passage: str,
    chunks: list[dict[str, Any]],
    item: GoldenItem,
    view: IndexView,
    files: Sequence[str],
    rng: np.random.Generator,
) -> tuple[str, str, str] | None:
    """A statement pair's two halves and the false one's kind, for a false ``kind``, or
    None when the passage and index cannot make one: an invented reason needs a reason the
    passage does not hold and takes a statement as long as an answer's; an unrelated one is
    a sentence of another section of the file, else of another file; an altered one, the
    first sentence that can be altered."""
    if kind == INVENTED:
        reasons = _reasons_for(passage)
        if not reasons:
            return None
        claim = next((s for s in said if s not in seen and _claim(s)), statement)
        return claim, invent(claim, reasons[int(rng.integers(len(reasons)))]), INVENTED
    if kind == UNRELATED:
        other = _other_section(chunks, view, rng)
        if other is not None:
            return statement, other, OTHER_SECTION
        other = _unrelated(item, view, files, rng)
        return None if other is None else (statement, other, UNRELATED)
    for s in said:
        if s not in seen and (altered := alter(s)) is not None:
            return s, altered, ALTERED
    return None


def _other_section(
    chunks: list[dict[str, Any]], view: IndexView, rng: np.random.Generator
) -> str | None:
    """A sentence of the target chunks' file from outside their sections: on the topic of
    the passage, in its words, and not stated by it (the claim a judge lets through)."""
    sections = {str(c.get("heading_path")) for c in chunks}
    texts = {str(c.get("text")) for c in chunks}
    stated = " ".join(" ".join(t.split()) for t in texts)  # chunks may overlap
    said = [
        s
        for path in sorted({str(c.get("file_path")) for c in chunks})
        for p in view.payloads(path)
        if str(p.get("heading_path")) not in sections and str(p.get("text")) not in texts
        for s in sentences(str(p.get("text", "")))
        if s not in stated
    ]
    return said[int(rng.integers(len(said)))] if said else None


def _unrelated(
    item: GoldenItem, view: IndexView, files: Sequence[str], rng: np.random.Generator
) -> str | None:
    own = {f for s in item.relevance for f in view.matching(s)}
    others = [f for f in files if f not in own]
    for j in rng.permutation(len(others))[:5]:
        said = [s for p in view.payloads(others[j]) for s in sentences(str(p.get("text", "")))]
        if said:
            return said[int(rng.integers(len(said)))]
    return None


def build_context_pairs(
    golden: GoldenSet, view: IndexView, size: int, seed: int
) -> list[ProbePair]:
    """``size`` context pairs (rounded down to even), half useful, seeded.

    Each is an answerable item's question and reference answer (``expected_answer``, else
    the first two sentences of the useful chunk) with one passage: the target chunk holding
    the most of the answer's words, and at least USEFUL_SHARE of them (USEFUL, truth 1); or,
    truth 0, a chunk of a file the item does not name (UNRELATED_CONTEXT) or, for an item
    with chunk targets, of a target's file outside the target sections (NEIGHBOUR), the
    two false kinds taking turns. A false chunk holding USEFUL_SHARE of the answer's words,
    or a target's text (a copied file), is never drawn. An item with no target chunk of
    CONTEXT_MIN_WORDS words is passed over.
    """
    rng = np.random.default_rng(seed)
    items = [i for i in golden.items if i.answerable]
    order = [items[j] for j in rng.permutation(len(items))]
    pairs: list[ProbePair] = []
    for item in order:
        if len(pairs) + 2 > size:
            break
        found = _target_chunks(item, view)
        targets = [c for c in found if _words(c) >= CONTEXT_MIN_WORDS]
        if not targets:
            continue
        useful = max(targets, key=lambda c: _share(c, item.expected_answer or ""))
        answer = item.expected_answer or " ".join(sentences(str(useful.get("text", "")))[:2])
        if not answer or _share(useful, answer) < USEFUL_SHARE:
            continue  # no target chunk holds the reference: no useful pair to be sure of
        kinds = (UNRELATED_CONTEXT, NEIGHBOUR) if len(pairs) % 4 == 0 else (
            NEIGHBOUR, UNRELATED_CONTEXT)  # fmt: skip
        for false_kind in kinds:  # the other false kind where this one has no chunk
            wrong = _other_chunk(item, view, found, answer, false_kind, rng)
            if wrong is not None:
                for kind, truth, chunk in ((USEFUL, 1, useful), (false_kind, 0, wrong)):
                    text = str(chunk.get("text", ""))
                    pairs.append(_context(kind, truth, item, answer, text))
                break
    return pairs


_WORD = re.compile(r"[a-z0-9]{4,}")


def _share(chunk: dict[str, Any], answer: str) -> float:
    """The share of ``answer``'s words of 4+ letters the chunk holds (0 with none)."""
    wanted = set(_WORD.findall(answer.lower()))
    held = set(_WORD.findall(str(chunk.get("text", "")).lower()))
    return len(wanted & held) / len(wanted) if wanted else 0.0


def _words(chunk: dict[str, Any]) -> int:
    return len(str(chunk.get("text", "")).split())


def _other_chunk(
    item: GoldenItem,
    view: IndexView,
    found: list[dict[str, Any]],
    answer: str,
    kind: str,
    rng: np.random.Generator,
) -> dict[str, Any] | None:
    """A chunk of a file neither the item's targets nor its relevance name
    (UNRELATED_CONTEXT), or, for an item with chunk targets, of a target's file outside
    the target chunks' sections (NEIGHBOUR); CONTEXT_MIN_WORDS words or more, not a
    target's text, and holding less than USEFUL_SHARE of the answer's words."""
    own = {str(c.get("file_path")) for c in found}
    named = own | {f for suffix in item.relevance for f in view.matching(suffix)}
    if kind == UNRELATED_CONTEXT:
        candidates = [c for f in view.files if f not in named for c in view.payloads(f)]
    elif item.chunks:
        sections = {str(c.get("heading_path")) for c in found}
        candidates = [
            c for f in sorted(own) for c in view.payloads(f)
            if str(c.get("heading_path")) not in sections
        ]  # fmt: skip
    else:  # a file-level target: any chunk of the file may hold the answer
        return None
    texts = {str(c.get("text")) for c in found}
    candidates = [
        c for c in candidates
        if _words(c) >= CONTEXT_MIN_WORDS and str(c.get("text")) not in texts
        and _share(c, answer) < USEFUL_SHARE
    ]  # fmt: skip
    return candidates[int(rng.integers(len(candidates)))] if candidates else None


def _context(kind: str, truth: int, item: GoldenItem, answer: str, passage: str) -> ProbePair:
    prompt = context_prompt(item.query, answer, passage)
    return ProbePair(kind, truth, prompt, item.id, passage, passage, item.query, answer)


def context_prompt(question: str, answer: str, passage: str) -> str:
    """``CONTEXT_PROMPT`` about ``passage`` for ``question`` and its ``answer``."""
    return CONTEXT_PROMPT.format(question=question, answer=answer, passage=passage)


def ask_context(
    judge: LLM,
    question: str,
    answer: str,
    passage: str,
    way: str = "statement",
    max_tokens: int = 1536,
) -> tuple[int | None, str]:
    """The judge's verdict on whether ``passage`` was useful for ``answer`` to ``question``
    (context precision's verdict on one context), None when its reply holds none, and the
    reply's text: ``CONTEXT_PROMPT`` held to ``{"verdict": 0|1}`` (way ``statement``), or
    ragas's ContextPrecisionPrompt, a reason (bounded) then the verdict (way ``ragas``)."""
    if way == "statement":
        messages = [{"role": "user", "content": context_prompt(question, answer, passage)}]
        return _bare_verdict(judge, messages)
    from ragas.metrics.collections.context_precision.util import (
        ContextPrecisionInput,
        ContextPrecisionOutput,
        ContextPrecisionPrompt,
    )

    from ragpipe.evaluation.rag import bounded_reasons

    data = ContextPrecisionInput(question=question, context=passage, answer=answer)
    messages = [{"role": "user", "content": ContextPrecisionPrompt().to_string(data)}]
    schema = bounded_reasons(ContextPrecisionOutput.model_json_schema())
    reply = judge.chat(messages, schema=schema, max_tokens=max_tokens)
    return parse_verdict(reply.text), reply.text


def nli_prompt(passage: str, statement: str) -> str:
    """ragas's faithfulness prompt about one statement, with ``passage`` as its context."""
    from ragas.metrics.collections.faithfulness.util import NLIStatementInput, NLIStatementPrompt

    data = NLIStatementInput(context=passage, statements=[statement])
    return str(NLIStatementPrompt().to_string(data))


def statement_prompt(passage: str, statement: str) -> str:
    """``STATEMENT_PROMPT`` about ``statement`` and ``passage``."""
    return STATEMENT_PROMPT.format(passage=passage, statement=statement)


def ask_statement(judge: LLM, passage: str, statement: str) -> tuple[int | None, str]:
    """The judge's verdict on ``statement`` against ``passage`` (``STATEMENT_PROMPT``, held
    to ``{"verdict": 0|1}``), None when its reply holds none, and the reply's text. Raises
    ValueError when the reply was cut at its VERDICT_TOKENS (a model that thinks first)."""
    messages = [{"role": "user", "content": statement_prompt(passage, statement)}]
    return _bare_verdict(judge, messages)


def _bare_verdict(judge: LLM, messages: list[dict[str, str]]) -> tuple[int | None, str]:
    reply = judge.chat(messages, schema=VERDICT_SCHEMA, max_tokens=VERDICT_TOKENS)
    verdict = parse_verdict(reply.text)
    if verdict is None and reply.finish_reason == "length":
        raise ValueError(
            f"the judge's reply was cut at {VERDICT_TOKENS} tokens before a verdict "
            f'({reply.text[:60]!r}): judge with a model that answers {{"verdict": 0|1}} '
            "at once (not one that reasons first)"
        )
    return verdict, reply.text


def _statement(kind: str, truth: int, item: GoldenItem, passage: str, text: str) -> ProbePair:
    return ProbePair(kind, truth, statement_prompt(passage, text), item.id, text, passage)


def _answer(kind: str, truth: int, item: GoldenItem, text: str) -> ProbePair:
    prompt = ANSWER_PROMPT.format(question=item.query, answer=text)
    return ProbePair(kind, truth, prompt, item.id, text)


def parse_verdict(text: str) -> int | None:
    """``{"verdict": 0|1}`` (the schema the judge is held to) or None. A served model that
    ignores the schema and wraps that object in a code fence or words is read too, when
    the reply holds it exactly once."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        found = _VERDICT_OBJECT.findall(text)
        return int(found[0]) if len(found) == 1 else None
    verdict = data.get("verdict") if isinstance(data, dict) else None
    return verdict if verdict in (0, 1) and not isinstance(verdict, bool) else None


def statement_verdict(judge: LLM, pair: ProbePair, max_tokens: int) -> str:
    """The judge's reply to ragas's NLI prompt about a statement pair (``nli_prompt``), as
    faithfulness gets it with ``eval.judge_verdicts: ragas``: the statement prefilled and
    only its reason and verdict written where the judge continues a reply it is given
    (``rag.verdict_reply``), else one reply held to ragas's verdicts schema with the reason
    bounded (``rag.bounded_reasons``)."""
    from ragas.metrics.collections.faithfulness.util import NLIStatementOutput

    from ragpipe.evaluation.rag import bounded_reasons, verdict_reply

    prompt = nli_prompt(pair.passage, pair.shown)
    if getattr(judge, "continues_reply", False):
        return verdict_reply(judge, prompt, [pair.shown])
    schema = bounded_reasons(NLIStatementOutput.model_json_schema())
    messages = [{"role": "user", "content": prompt}]
    return judge.chat(messages, schema=schema, max_tokens=max_tokens).text


_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def _echo(statement: str) -> str:
    """A statement as its echo is compared: a judge that writes the statement again (not
    prefilled) may change quotes, case, spacing or the final full stop, not its words."""
    text = unicodedata.normalize("NFKC", statement).translate(_QUOTES).casefold()
    return " ".join(text.split()).rstrip(" .!?")


def parse_statement_verdict(text: str, statement: str) -> int | None:
    """The one verdict of ragas's verdicts JSON about ``statement``, 0 or 1, or None."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    verdicts = data.get("statements") if isinstance(data, dict) else None
    if not isinstance(verdicts, list) or len(verdicts) != 1 or not isinstance(verdicts[0], dict):
        return None
    if _echo(str(verdicts[0].get("statement", ""))) != _echo(statement):
        return None  # a verdict about another statement is none about this one
    verdict = verdicts[0].get("verdict")
    return verdict if verdict in (0, 1) and not isinstance(verdict, bool) else None


def _verdict(judge: LLM, pair: ProbePair, max_tokens: int, verdicts: str) -> tuple[int | None, str]:
    """The judge's verdict on ``pair`` and its reply's text: a statement pair asked as
    faithfulness asks and a context pair as context precision asks (``verdicts``), an
    answer pair with its own prompt."""
    if JUDGEMENT[pair.kind] == ANSWERS:
        return _bare_verdict(judge, [{"role": "user", "content": pair.prompt}])
    if JUDGEMENT[pair.kind] == CONTEXTS:  # asked as context precision asks
        return ask_context(judge, pair.question, pair.answer, pair.passage, verdicts, max_tokens)
    if verdicts == "ragas":
        text = statement_verdict(judge, pair, max_tokens)
        return parse_statement_verdict(text, pair.shown), text
    return ask_statement(judge, pair.passage, pair.shown)


class Settling(DelegatingLLM):
    """A judge model whose calls can be waited out. A call the eval gave up on
    (``eval.judge_timeout_s``) runs on in its thread, holding the model; the next metric's
    clock started while it ran, and that metric timed out waiting for the model (the
    review: context recall "timeout after 1s" behind faithfulness's timed-out call, its own
    prompt answered at once). After a timeout the eval waits for the call to end
    (``settle``) before it asks anything else."""

    def __init__(self, llm: LLM) -> None:
        super().__init__(llm)
        self._calls = 0
        self._ended = threading.Condition()

    def chat(self, messages: Sequence[Message], **options: Any) -> Completion:
        with self._ended:
            self._calls += 1
        try:
            return self.llm.chat(messages, **options)
        finally:
            with self._ended:
                self._calls -= 1
                self._ended.notify_all()

    def settle(self, timeout_s: float) -> bool:
        """Wait until no call is running, ``timeout_s`` at most; whether none is."""
        with self._ended:
            return self._ended.wait_for(lambda: self._calls == 0, timeout_s)


async def timed_out(llm: LLM, timeout_s: float) -> str:
    """The reason a judge call that ran past ``timeout_s`` failed, once the call has ended
    (``Settling.settle``, another ``timeout_s`` at most) so that the next is timed alone."""
    settle = getattr(llm, "settle", None)
    ended = True if settle is None else await asyncio.to_thread(settle, timeout_s)
    why = f"timeout after {timeout_s:.0f}s"
    if not ended:
        why += f"; the call still ran {timeout_s:.0f}s later, and holds the model"
    return why


async def _ask(
    judge: LLM, pair: ProbePair, timeout_s: float, max_tokens: int, verdicts: str = "statement"
) -> tuple[int | None, str | None]:
    try:
        asked = asyncio.to_thread(_verdict, judge, pair, max_tokens, verdicts)
        verdict, text = await asyncio.wait_for(asked, timeout_s)
    except TimeoutError:
        return None, await timed_out(judge, timeout_s)
    except Exception as exc:  # a model error is a failed verdict, not a crash
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"
    return verdict, None if verdict is not None else f"{NO_VERDICT} {text[:80]!r}"


def calibrate(
    judge: LLM,
    pairs: Sequence[ProbePair],
    *,
    min_kappa: float,
    timeout_s: float,
    max_tokens: int = 1536,
    resamples: int = 1000,
    seed: int = 0,
    way: str = "statement",
) -> Calibration:
    """Ask the judge every probe pair; score its verdicts against the truth.

    Args:
        max_tokens: Most tokens of a statement pair's reply asked ragas's way (a reason
            and a verdict; ``eval.judge_max_tokens``).
        way: How statement pairs are asked: as faithfulness asks (``eval.judge_verdicts``,
            one of VERDICTS).
    """
    if way not in VERDICTS:
        raise ValueError(f"way must be one of {VERDICTS}, not {way!r}")
    verdicts: list[int | None] = []
    reasons: list[str | None] = []
    for pair in pairs:
        verdict, reason = asyncio.run(_ask(judge, pair, timeout_s, max_tokens, way))
        verdicts.append(verdict)
        reasons.append(reason)
    truth = [p.truth for p in pairs]
    measured = agreement(truth, verdicts, resamples, seed)
    by_judgement = {}
    for judgement in JUDGEMENTS:
        mine = [i for i, p in enumerate(pairs) if JUDGEMENT[p.kind] == judgement]
        if mine:
            by_judgement[judgement] = agreement(
                [truth[i] for i in mine], [verdicts[i] for i in mine], resamples, seed
            )
    return Calibration(list(pairs), verdicts, reasons, measured, min_kappa, judge.name,
                       by_judgement=by_judgement, way=way)  # fmt: skip
