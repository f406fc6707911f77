"""Which prompt faithfulness and the calibration probe should ask about a statement (issue 32).

The probe's statement pairs (a sentence of a target chunk with that chunk; not supported:
a sentence of another section of the same file since 2026-12-02, of another file before
and where the file has no other section, or the sentence with a number changed or a
negation added; since late on 2026-12-02 also the sentence with a generic reason its passage
does not give, ``calibration.REASONS``) have a known truth. The probe's third
is context pairs since 2026-12-02, so ``--size 144`` gives 48 statement pairs (``--size 96``
gave 48 before). This asks the
statement pairs the ways of ``--ways`` with the default judge (the packaged 1.5B) and
prints each way's accuracy, Cohen's kappa and seconds per pair:

- ``short``: ``calibration.STATEMENT_PROMPT``, the passage then the statement,
  ``{"verdict": 0|1}`` only (``eval.judge_verdicts: statement``, faithfulness's way since
  2026-12-02; the probe's own until 2026-12-01); since later on 2026-12-02 it asks whether the
  statement adds anything the passage does not say;
- ``lenient``: the short prompt until later on 2026-12-02 (is the statement stated or directly
  implied?), ``faithfulness_claims.LENIENT_PROMPT``;
- ``ragas``: ragas's NLI prompt with the statement prefilled in the reply and a reason of
  at most 160 characters before the verdict (``eval.judge_verdicts: ragas``,
  faithfulness's way until 2026-12-01);
- ``ragas-no-reason``: the same with the reason bounded at 0 characters.

Then it calibrates the judge on the probe ``eval rag`` asks (``eval.judge_probe_size``
pairs, statement pairs asked the ``eval.judge_verdicts`` way) and prints its label, the
README's kappa.

Usage: python bench/probe_prompt.py [--size 48] [--ways short,lenient,ragas,ragas-no-reason]
       [--json bench/results/probe_prompt.json]
Needs the sample index (``ragpipe ingest``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from faithfulness_claims import _verdict as faithfulness_verdict

from ragpipe.config import load_config
from ragpipe.evaluation import calibration, rag
from ragpipe.evaluation.agreement import agreement
from ragpipe.evaluation.check import IndexView
from ragpipe.evaluation.golden import load_golden
from ragpipe.models.embedders import make_embedder
from ragpipe.models.llm import LlamaCppLLM
from ragpipe.query.retrieve import Retriever


def ragas_verdict(model: LlamaCppLLM, pair: calibration.ProbePair, reason_chars: int) -> int | None:
    """``eval.judge_verdicts: ragas`` (``calibration._ask``), reasons bounded here."""
    rag.REASON_MAX_CHARS = reason_chars
    verdict, failure = asyncio.run(calibration._ask(model, pair, 600, 1536, "ragas"))
    if failure:
        print(f"  {pair.item_id}: {failure}")
    return verdict


def short_verdict(model: LlamaCppLLM, pair: calibration.ProbePair) -> int | None:
    """``eval.judge_verdicts: statement``, faithfulness's own call (``ask_statement``)."""
    return calibration.ask_statement(model, pair.passage, pair.shown)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=48, help="probe pairs built (about half "
                        "are statement pairs)")  # fmt: skip
    parser.add_argument("--json", type=Path)
    parser.add_argument("--ways", default="short,ragas,ragas-no-reason")
    args = parser.parse_args()
    config = load_config(None)
    golden = load_golden(Path("eval/golden/r-faq-dev.yaml"))
    retriever = Retriever(config, embedder=make_embedder(config.embed, query_side=True))
    probe = calibration.build_probe(golden, IndexView(retriever.store), args.size,
                                    config.eval.seed)  # fmt: skip
    pairs = [p for p in probe if calibration.JUDGEMENT[p.kind] == calibration.STATEMENTS]
    truth = [p.truth for p in pairs]
    print(f"{len(pairs)} statement pairs of a {len(probe)}-pair probe "
          f"({sum(truth)} true)")  # fmt: skip
    model = LlamaCppLLM()
    model.chat([{"role": "user", "content": "Hi"}], max_tokens=1)  # loaded before timing
    ways: dict[str, Any] = {
        "short": lambda p: short_verdict(model, p),
        "lenient": lambda p: faithfulness_verdict("lenient", model, p.passage, p.shown),
        "ragas": lambda p: ragas_verdict(model, p, 160),
        "ragas-no-reason": lambda p: ragas_verdict(model, p, 0),
    }
    results: dict[str, Any] = {}
    for way, ask in ((w, ways[w]) for w in args.ways.split(",")):
        verdicts: list[int | None] = []
        started = time.perf_counter()
        for pair in pairs:
            try:
                verdicts.append(ask(pair))
            except Exception as exc:  # a failed verdict counts as none
                print(f"  {way} {pair.item_id}: {type(exc).__name__}: {exc}")
                verdicts.append(None)
        seconds = time.perf_counter() - started
        measured = agreement(truth, verdicts, 1000, 0)
        answered = list(zip(pairs, verdicts, strict=True))
        by_kind = {
            kind: f"{sum(v == p.truth for p, v in answered if p.kind == kind)}"
            f"/{sum(p.kind == kind for p in pairs)}"
            for kind in (
                calibration.SUPPORTED,
                calibration.OTHER_SECTION,
                calibration.UNRELATED,
                calibration.ALTERED,
                calibration.INVENTED,
            )
        }
        results[way] = {**measured.as_dict(), "seconds_per_pair": round(seconds / len(pairs), 2),
                        "correct_by_kind": by_kind, "verdicts": verdicts}  # fmt: skip
        print(f"{way:>16}: accuracy {measured.accuracy:.3f}, kappa {measured.kappa:.2f} "
              f"[{measured.kappa_low:.2f}, {measured.kappa_high:.2f}], "
              f"{seconds / len(pairs):.1f} s a pair, correct by kind {by_kind}")  # fmt: skip
    # The probe `eval rag` asks (eval.judge_probe_size pairs), as it asks it now.
    rag.REASON_MAX_CHARS = 160
    ev = config.eval
    default = calibration.build_probe(golden, IndexView(retriever.store), ev.judge_probe_size,
                                      ev.seed)  # fmt: skip
    started = time.perf_counter()
    measured_default = calibration.calibrate(
        model, default, min_kappa=ev.judge_min_kappa, timeout_s=600,
        max_tokens=ev.judge_max_tokens, resamples=ev.resamples, seed=ev.seed,
        way=ev.judge_verdicts,
    )  # fmt: skip
    took = time.perf_counter() - started
    print(f"eval rag's probe ({len(default)} pairs, {took:.0f} s): {measured_default.label()}")
    if args.json:
        report = {"pairs": [{"kind": p.kind, "item_id": p.item_id, "truth": p.truth,
                             "statement": p.shown} for p in pairs],
                  "model": model.name, "ways": results,
                  "eval_rag_probe": {"label": measured_default.label(),
                                     "seconds": round(took, 1),
                                     **measured_default.as_dict()}}  # fmt: skip
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
