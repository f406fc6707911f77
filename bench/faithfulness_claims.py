"""Faithfulness over the answer's sentences: against ragas's statements, and by hand (issue 32).

ragas's faithfulness first asks the judge to rewrite the answer as statements (the
judge's longest call: 30-55 s a question with the packaged 1.5B, bench/judge_speed.py),
then asks a verdict on each. ``eval.faithfulness_claims: sentences`` judges the answer's
own sentences instead (``rag.answer_claims``). Two measurements:

- ``replay [RUN_DIR]``: a finished ``eval rag`` run's answers and contexts (its
  per_query.parquet, whose faithfulness was judged over ragas's statements) through
  today's ``Judge`` with the answer's sentences, the configured judge, the statement
  prompt of today (or of before 2026-12-02's change, ``--lenient``, as that run asked):
  both scores, the seconds, every sentence the judge called unsupported.
- ``hand``: the 112 sentences of 19 such answers labelled by hand
  (bench/results/faithfulness_hand_labels.json), each asked of the configured judge in
  each of ``--ways``: ``statement`` (``calibration.STATEMENT_PROMPT``, faithfulness's
  call: does the statement add anything the passage does not say?), ``lenient`` (the
  statement prompt until later on 2026-12-02: is it stated or directly implied?) and ``ragas``
  (ragas's NLI prompt, a reason before the verdict, as with ``eval.judge_verdicts:
  ragas``). It prints each way's accuracy and kappa against the labels,
  the unsupported sentences it caught, faithfulness's mean against the hand mean, and the
  seconds.

Usage: python bench/faithfulness_claims.py replay [RUN_DIR] [--lenient] [--json FILE]
       python bench/faithfulness_claims.py hand [--ways statement,lenient,ragas] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pandas as pd

from ragpipe.config import load_config
from ragpipe.evaluation import calibration, rag
from ragpipe.evaluation.agreement import agreement
from ragpipe.evaluation.calibration import parse_verdict
from ragpipe.models.embedders import make_embedder
from ragpipe.models.llm import LLM, make_llm

HAND = Path(__file__).parent / "results" / "faithfulness_hand_labels.json"

# The statement prompt until later on 2026-12-02: asked only whether the passage "states it or
# directly implies it", the packaged 1.5B called every sentence of 19 real answers
# supported, the 10 a person found unsupported too.
LENIENT_PROMPT = """Is the statement supported by the passage?
Answer 1 if the passage states it or directly implies it; answer 0 if the passage does not \
say it or contradicts it.

Passage:
{passage}

Statement: {statement}

Reply with JSON only: {{"verdict": 1}} or {{"verdict": 0}}."""


def _recorded(model: LLM) -> list[str]:
    replies: list[str] = []
    chat = model.chat

    def recorded(messages: Any, **kwargs: Any) -> Any:
        reply = chat(messages, **kwargs)
        replies.append(reply.text)
        return reply

    model.chat = recorded  # type: ignore[method-assign]
    return replies


def replay(run: Path | None, lenient: bool, out: Path | None) -> None:
    runs = sorted(Path("eval/reports").glob("*-rag*"))
    run = run or (runs[-1] if runs else None)
    if run is None:
        raise SystemExit("no eval rag run under eval/reports: run `ragpipe eval rag` first")
    rows = pd.read_parquet(run / "per_query.parquet")
    rows = rows[rows["faithfulness_status"] == "ok"]
    if rows.empty:
        raise SystemExit(f"{run}: no answer's faithfulness was judged")
    if lenient:  # the statement prompt the run of 2026-12-02 04:46 asked
        calibration.STATEMENT_PROMPT = LENIENT_PROMPT
    config = load_config(None)
    model = make_llm(config.eval.judge or config.llm)
    replies = _recorded(model)
    judge = rag.Judge(model, make_embedder(config.embed, query_side=True),
                      config.eval.judge_timeout_s, config.eval.judge_max_tokens,
                      verdicts="statement", claims="sentences")  # fmt: skip
    results: list[dict[str, Any]] = []
    for row in rows.itertuples():
        claims = rag.answer_claims(row.answer)
        first, started = len(replies), time.perf_counter()
        judged = asyncio.run(
            judge._one(judge.faithfulness, "faithfulness", user_input=row.query,
                       response=row.answer, retrieved_contexts=list(row.contexts))
        )  # fmt: skip
        took = round(time.perf_counter() - started, 1)
        verdicts = [parse_verdict(text) for text in replies[first:]]
        if judged.value is not None and len(verdicts) != len(claims):
            raise SystemExit(f"{row.item_id}: {len(verdicts)} replies for {len(claims)} claims")
        results.append({
            "id": row.item_id, "generated": row.faithfulness, "sentences": judged.value,
            "reason": judged.reason, "seconds": took,
            "claims": [{"sentence": c, "verdict": v}
                       for c, v in zip(claims, verdicts, strict=False)],
        })  # fmt: skip
        print(
            f"{row.item_id}: generated {row.faithfulness:.3f}, sentences "
            f"{judged.value if judged.value is None else round(judged.value, 3)} "
            f"({len(claims)} sentences, {took} s)",
            flush=True,
        )
        for claim, verdict in zip(claims, verdicts, strict=False):
            if verdict != 1:
                print(f"    {verdict}: {claim[:160]}", flush=True)
    scored = [r for r in results if r["sentences"] is not None]
    gaps = [abs(r["sentences"] - r["generated"]) for r in scored]
    seconds = sum(r["seconds"] for r in results)
    print(
        f"{len(scored)} of {len(results)} answers scored; mean generated "
        f"{sum(r['generated'] for r in scored) / len(scored):.3f}, sentences "
        f"{sum(r['sentences'] for r in scored) / len(scored):.3f}; mean |difference| "
        f"{sum(gaps) / len(gaps):.3f}; {seconds:.0f} s judging ({seconds / len(results):.1f} s "
        "an answer)"
    )
    _record(out, "replay", {"run": str(run), "prompt": "lenient" if lenient else "statement",
                            "results": results})  # fmt: skip


def _record(out: Path | None, key: str, value: dict[str, Any]) -> None:
    """``value`` under ``key`` of the JSON file ``out``, its other keys kept."""
    if out is None:
        return
    kept = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {}
    kept[key] = value
    out.write_text(json.dumps(kept, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _verdict(way: str, model: LLM, passage: str, sentence: str) -> int | None:
    """The judge's verdict on ``sentence``, None when it gave none (a failed verdict)."""
    if way in ("statement", "lenient"):
        prompt = (LENIENT_PROMPT if way == "lenient" else calibration.STATEMENT_PROMPT).format(
            passage=passage, statement=sentence
        )
        try:
            return calibration._bare_verdict(model, [{"role": "user", "content": prompt}])[0]
        except ValueError as exc:  # cut at its token limit
            print(f"    {way}: {exc}", flush=True)
            return None
    pair = calibration.ProbePair(calibration.SUPPORTED, 1, "", "hand", sentence, passage)
    verdict, failure = asyncio.run(calibration._ask(model, pair, 600, 1536, "ragas"))
    if failure:
        print(f"    ragas: {failure}", flush=True)
    return verdict


def hand(ways: list[str], out: Path | None) -> None:
    labels = json.loads(HAND.read_text())
    config = load_config(None)
    model = make_llm(config.eval.judge or config.llm)
    report: dict[str, Any] = {}
    truth = [s["supported"] for i in labels["items"] for s in i["sentences"]]
    hand_mean = sum(
        sum(s["supported"] for s in i["sentences"]) / len(i["sentences"]) for i in labels["items"]
    ) / len(labels["items"])
    for way in ways:
        said: list[int | None] = []
        per_answer: list[float | None] = []
        started = time.perf_counter()
        for item in labels["items"]:
            passage = "\n".join(item["contexts"])  # as faithfulness joins them
            got = [_verdict(way, model, passage, s["sentence"]) for s in item["sentences"]]
            said.extend(got)
            per_answer.append(None if None in got else sum(v or 0 for v in got) / len(got))
            for s, v in zip(item["sentences"], got, strict=True):
                if v != s["supported"]:
                    print(f"  {way} {item['id']}: said {v}, hand {s['supported']}: "
                          f"{s['sentence'][:120]}", flush=True)  # fmt: skip
        seconds = time.perf_counter() - started
        agreed = agreement(truth, said)
        caught = sum(1 for t, v in zip(truth, said, strict=True) if t == 0 and v == 0)
        wrongly = sum(1 for t, v in zip(truth, said, strict=True) if t == 1 and v != 1)
        scored = [v for v in per_answer if v is not None]
        mean = sum(scored) / len(scored) if scored else None
        gaps = [
            abs(v - sum(s["supported"] for s in i["sentences"]) / len(i["sentences"]))
            for v, i in zip(per_answer, labels["items"], strict=True)
            if v is not None
        ]
        report[way] = {
            "agreement": agreed.as_dict(), "unsupported_caught": caught,
            "unsupported": truth.count(0), "supported_called_unsupported": wrongly,
            "faithfulness_mean": mean, "hand_mean": hand_mean,
            "mean_abs_difference": sum(gaps) / len(gaps) if gaps else None,
            "answers_scored": len(scored), "seconds": round(seconds, 1),
            "seconds_a_sentence": round(seconds / len(truth), 2),
            "verdicts": said,
        }  # fmt: skip
        print(
            f"{way}: accuracy {agreed.accuracy:.3f}, kappa {agreed.kappa:.2f} "
            f"[{agreed.kappa_low:.2f}, {agreed.kappa_high:.2f}]; unsupported caught {caught} of "
            f"{truth.count(0)}, supported called unsupported {wrongly} of {truth.count(1)}; "
            f"faithfulness {mean if mean is None else round(mean, 3)} against {hand_mean:.3f} "
            f"by hand; {seconds:.0f} s ({seconds / len(truth):.1f} s a sentence)",
            flush=True,
        )
    _record(out, "ways", report)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["replay", "hand"])
    parser.add_argument("run", type=Path, nargs="?", help="replay: the run (the newest)")
    parser.add_argument("--ways", default="statement,lenient,ragas", help="hand: the ways")
    parser.add_argument(
        "--lenient",
        action="store_true",
        help="replay: ask LENIENT_PROMPT, the statement prompt before the change",
    )
    parser.add_argument("--json", type=Path, help="the results file: the measurement's key "
                        "(ways, replay) is replaced, the others kept")  # fmt: skip
    args = parser.parse_args()
    if args.what == "replay":
        replay(args.run, args.lenient, args.json)
    else:
        hand(args.ways.split(","), args.json)


if __name__ == "__main__":
    main()
