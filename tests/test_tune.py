"""`ragpipe eval tune`: the seeded split, the coordinate search, the held-out verdict.

End to end on the small query corpus indexed in Qdrant Edge: the pick never
depends on a confirmation query, a pick the held-out queries reject is
refused, and a recommended pick is written as a config that loads.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from ragpipe.config import ChunkerKind, EmbedProvider, RagpipeConfig, load_config
from ragpipe.errors import ConfigError
from ragpipe.evaluation.golden import ChunkTarget, GoldenItem, GoldenSet, save_golden
from ragpipe.evaluation.metrics import Interval, PairedDelta, paired_delta
from ragpipe.evaluation.retrieval import Granularity
from ragpipe.evaluation.sibling import INGEST_SPACE
from ragpipe.evaluation.tune import (
    Split,
    coordinate_search,
    decide,
    run_tune,
    split_queries,
    tune_and_report,
)
from ragpipe.ingest.pipeline import run_ingest
from ragpipe.query.results import Retrieved
from ragpipe.query.retrieve import Retriever
from tests.support.paths import QUERY_CORPUS

pytestmark = pytest.mark.integration

WORDS = [
    "oxygen",
    "bread",
    "restore",
    "Enigma",
    "sugar",
    "oven",
    "backup",
    "Babbage",
    "yeast",
    "chlorophyll",
    "steam",
    "hour",
]
WORDS += ["water", "program", "service", "night"]
SPACE = {"mode": ["hybrid", "sparse"]}


def _golden(n: int, name: str = "g") -> GoldenSet:
    items = [GoldenItem(f"q{i:02d}", f"query {i}", {"a.md": 1}) for i in range(n)]
    return GoldenSet(name, items)


# -- pure pieces ------------------------------------------------------------------------


def test_split_is_seeded_disjoint_and_depends_only_on_the_ids_when_no_query_repeats() -> None:
    golden = _golden(20)
    split = split_queries(golden, seed=7)
    assert split == split_queries(golden, seed=7)
    assert len(split.tuning) == len(split.confirmation) == 10
    assert set(split.tuning).isdisjoint(split.confirmation)
    assert set(split.tuning) | set(split.confirmation) == {i.id for i in golden.items}
    assert split != split_queries(golden, seed=8)
    # Other queries, other relevance, another item order: the same split.
    shuffled = GoldenSet(
        "g", [GoldenItem(i.id, f"other {i.id}", {"b.md": 2}) for i in golden.items[::-1]]
    )
    assert split_queries(shuffled, seed=7) == split
    # No query asked twice: the seeded shuffle of the ids, as it has always been.
    ids = sorted(i.id for i in golden.items)
    order = [ids[i] for i in np.random.default_rng(7).permutation(20)]
    assert split == Split(sorted(order[:10]), sorted(order[10:]))
    assert len(split_queries(golden, seed=7, share=0.3).tuning) == 6
    with pytest.raises(ConfigError, match="strictly between 0 and 1"):
        split_queries(golden, seed=0, share=1.0)


def test_items_asking_the_same_query_stay_on_one_side_of_the_split() -> None:
    """The review: the split was by id alone, so an item and its copy (the same question,
    another id) could tune and confirm at once."""
    queries = ["How do I install it?", "install the package", "Where are logs kept?",
               "rotate log files", "knead dough", "tomato fertiliser"]  # fmt: skip
    # Each asked twice: as written, and in capitals without its punctuation.
    items = [GoldenItem(f"a{n}", q, {"a.md": 1}) for n, q in enumerate(queries)]
    items += [GoldenItem(f"b{n}", q.upper().strip("?") + " ", {"b.md": 1})
              for n, q in enumerate(queries)]  # fmt: skip
    golden = GoldenSet("twice", items)
    for seed in range(20):
        split = split_queries(golden, seed=seed)
        assert (len(split.tuning), len(split.confirmation)) == (6, 6)
        for n in range(len(queries)):
            assert (f"a{n}" in split.tuning) == (f"b{n}" in split.tuning), (seed, split)
    from ragpipe.evaluation.tune import query_key

    said = query_key(" How do I\tinstall it? ")
    assert said == query_key("how do i install it") == "how do i install it"
    # A group too large to fit the tuning part is held out whole; too little left to tune
    # is refused, naming the query asked most.
    crowd = [GoldenItem(f"c{n:02d}", "Why?" if n < 11 else f"q {n}", {"a.md": 1})
             for n in range(12)]  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        split_queries(GoldenSet("crowd", crowd), seed=0)
    assert str(refused.value) == (
        "golden set 'crowd': items asking the same query stay on one side of the split, and "
        "at share 0.5 that leaves 1 of 12 to tune (tuning needs 2); the largest group asks "
        "one query 11 times (c00, c01, c02, c03, c04, ...). Ask each question once, or tune "
        "on a larger share (--share)"
    )


def test_a_split_whose_held_out_part_cannot_reach_significance_is_refused() -> None:
    """The review: 4 items split 2 + 2, and tune wrote tuned.yaml and --out "recommend, not
    significant" at p = 1. The sign-flip test's smallest p on n held-out queries is 2/2^n:
    every delta of one sign is 0.0625 on 5, 0.031 on 6 (the real test, by hand)."""
    assert paired_delta([0.0] * 5, [1.0] * 5).p_value == pytest.approx(2 / 2**5, abs=0.01)
    assert paired_delta([0.0] * 6, [1.0] * 6).p_value < 0.05
    with pytest.raises(ConfigError) as small:
        split_queries(_golden(7), seed=0)
    assert str(small.value) == (
        "golden set 'g' has 7 item(s); tuning needs at least 8 (2 to tune, 6 held out to "
        "confirm the pick: on fewer held-out queries the sign-flip test cannot reach p < "
        "0.05), and far more for a trustworthy pick"
    )
    with pytest.raises(ConfigError) as half:
        split_queries(_golden(10), seed=0, what="answerable item(s)")
    assert str(half.value) == (
        "golden set 'g' has 10 answerable item(s); a share of 0.5 holds out 5 to confirm the "
        "pick, and on 5 queries the sign-flip test's smallest p is 2/2^5 = 0.0625, never "
        "below 0.05: no pick could be recommended. The held-out part needs at least 6 "
        "queries: add items (12 at share 0.5), or tune on a smaller share (--share 0.4 or "
        "less), and far more for a trustworthy pick"
    )
    # What the message offers does split: 6 held out either way.
    assert len(split_queries(_golden(10), seed=0, share=0.4).confirmation) == 6
    assert len(split_queries(_golden(12), seed=0).confirmation) == 6
    with pytest.raises(ConfigError, match=r"add items \(37 at share 0\.85\).*--share 0\.45 "):
        split_queries(_golden(11), seed=0, share=0.85)


def test_coordinate_search_climbs_and_keeps_the_incumbent_on_small_gains() -> None:
    current = RagpipeConfig().retrieve.model_dump(mode="json")

    def score(settings: dict[str, Any]) -> float:  # best: sparse... unless hybrid alpha 0.9
        if settings["mode"] == "hybrid":
            return 0.5 + 0.2 * settings["alpha"] + (0.003 if settings["prefetch"] == 80 else 0)
        return 0.6

    best, trials, options = coordinate_search(current, score)
    assert best["mode"] == "hybrid" and best["alpha"] == 0.9
    assert best["prefetch"] == 40  # +0.003 is below the minimum gain
    # What the last sweep said of each setting, by hand (alpha 0.9: 0.5 + 0.18).
    assert options["prefetch"] == "refused 80: 0.6830 against 0.6800 for 40 (a change needs +0.005)"
    assert (
        options["mode"]
        == "refused 'dense': 0.6000 against 0.6800 for 'hybrid' (a change needs +0.005)"
    )
    assert options["alpha"] == "kept 0.9: 0.6800 against 0.6300 for 0.65"
    assert options["rrf_k"] == "not tried: does not apply with fusion_method convex"
    assert trials[0].overrides == {} and trials[0].score == pytest.approx(0.63)
    keys = [json.dumps(t.overrides, sort_keys=True) for t in trials]
    assert len(keys) == len(set(keys))  # every configuration scored once
    # Settings that change nothing in the current mode are not tried: alpha only for convex.
    assert not any("rrf_k" in t.overrides and t.overrides.get("fusion_method") != "rrf"
                   for t in trials)  # fmt: skip
    # The report and the CLI set the pick's 0.6800 beside the higher 0.6830 not taken.
    from ragpipe.evaluation.tune import scores_said

    highest = max(t.score for t in trials)
    assert scores_said("ndcg@10", 0.63, 0.68, highest) == (
        "ndcg@10: current 0.6300, picked 0.6800; the highest tried, 0.6830, gained less than "
        "+0.005 on its step"
    )
    assert scores_said("ndcg@10", 0.63, 0.683, highest) == "ndcg@10: current 0.6300, picked 0.6830"


def test_a_setting_the_pick_makes_moot_says_so_not_what_it_once_kept() -> None:
    current = RagpipeConfig().retrieve.model_dump(mode="json")

    def score(settings: dict[str, Any]) -> float:  # rrf wins only once alpha is 0.9
        if settings["mode"] != "hybrid":
            return 0.0
        if settings["fusion_method"] == "rrf":
            return 0.5 + (0.3 if settings["alpha"] == 0.9 else 0.0)
        if settings["fusion_method"] == "convex":
            return 0.5 + 0.2 * settings["alpha"]
        return 0.5

    best, _, options = coordinate_search(current, score)
    assert (best["fusion_method"], best["alpha"]) == ("rrf", 0.9)
    assert options["fusion_method"] == "kept 'rrf': 0.8000 against 0.6800 for 'convex'"
    # alpha 0.9 won in the first sweep, but it does not apply to rrf: the verdict says so.
    assert options["alpha"] == "not tried: does not apply with fusion_method rrf"


def test_turning_an_llm_rerank_off_again_leaves_no_reranker_behind() -> None:
    current = RagpipeConfig().retrieve.model_dump(mode="json")
    seen: list[dict[str, Any]] = []

    def score(settings: dict[str, Any]) -> float:  # the LLM rerank wins, then is tried off
        seen.append(settings)
        return 0.9 if settings["rerank"] else 0.5

    best, trials, options = coordinate_search(current, score, {"rerank": [False, "llm"]})
    assert (best["rerank"], best["reranker"]) == (True, "llm")
    assert [t.overrides for t in trials] == [{}, {"rerank": True, "reranker": "llm"}]
    assert not any(s["reranker"] == "llm" and not s["rerank"] for s in seen)
    assert options["rerank"] == "kept 'llm': 0.9000 against 0.5000 for False"


def _delta(low: float, mean: float, high: float) -> PairedDelta:
    return PairedDelta(Interval(mean, low, high, 40, 1000, 0), 0.04, 10000)


def test_verdicts() -> None:
    change = {"mode": "sparse"}
    assert decide({}, _delta(0, 0, 0), "ndcg@10")[0] == "no change"
    verdict, message = decide(change, _delta(-0.09, -0.05, -0.01), "ndcg@10")
    assert verdict == "refused" and "worse on the held-out queries" in message
    assert "[-0.0900, -0.0100]" in message
    assert decide(change, _delta(-0.05, -0.01, 0.03), "ndcg@10")[0] == "no change"
    verdict, message = decide(change, _delta(-0.01, 0.02, 0.05), "ndcg@10")
    assert verdict == "recommend, not significant"
    verdict, message = decide(change, _delta(0.01, 0.03, 0.05), "ndcg@10")
    assert verdict == "recommend" and "not significant" not in message
    # 2 held-out queries up by 0.1 and 0.3: the percentile CI [+0.1, +0.3] excludes 0, yet
    # the sign-flip p is 2/4 = 0.5 (by hand). It said "better on the held-out queries".
    verdict, message = decide(change, paired_delta([0.5, 0.5], [0.6, 0.8], 1000, 0), "mrr")
    assert verdict == "recommend, not significant" and "p=0.5" in message
    # A mean just under 0 with a CI reaching +0.33 said "no better": not better, and the
    # gain the CI allows is said.
    loss = paired_delta([0.5] * 12, [0.0, 1.0, 0.0, 0.95, 0.9, 0.1] * 2, 1000, 0)
    verdict, message = decide(change, loss, "mrr")
    assert verdict == "no change" and "no better" not in message
    assert f"allows a gain of up to {loss.interval.high:+.4f}" in message
    # Every held-out query moved by 0: a CI of zero width, said as none, never [+0, +0].
    verdict, message = decide(change, _delta(0, 0, 0), "ndcg@10")
    assert verdict == "no change" and "[+0.0000, +0.0000]" not in message
    assert "ndcg@10 +0.0000 on the held-out queries, no CI: every held-out query has the " \
           "same delta, p=0.04" in message  # fmt: skip
    one = PairedDelta(Interval(0.2, float("nan"), float("nan"), 1, 1000, 0), float("nan"), 0)
    assert "no CI: 1 held-out query," in decide(change, one, "ndcg@10")[1]
    # Every one of 2 held-out queries up by 0.1: a zero-width CI is no proof; the sign-flip
    # p (2 of 4 patterns reach |mean| 0.1: about 0.5) says not significant. With 8 such
    # queries p is about 2/256: significant.
    two = paired_delta([0.5, 0.6], [0.6, 0.7])
    verdict, message = decide(change, two, "ndcg@10")
    assert verdict == "recommend, not significant" and "no CI" in message
    eight = paired_delta([0.5] * 8, [0.6] * 8)
    assert eight.p_value < 0.05
    verdict, message = decide(change, eight, "ndcg@10")
    assert verdict == "recommend" and "not significant" not in message


# -- end to end on the indexed query corpus -----------------------------------------------


def _target(hit: Retrieved) -> ChunkTarget:
    return ChunkTarget(file=hit.file_path.split("/", 1)[-1], contains=hit.text[:40])


def _disagreements(cfg: RagpipeConfig) -> list[tuple[str, ChunkTarget, ChunkTarget]]:
    """Queries whose top chunk differs between the default (hybrid) and BM25 alone."""
    out = []
    with Retriever(cfg) as r:
        for a, b in itertools.combinations(WORDS, 2):
            query = f"{a} and {b}"
            default = r.search(query, top_k=1).hits[0]
            sparse = r.search(query, mode="sparse", top_k=1).hits
            if (
                sparse
                and not _target(default).matches(sparse[0].payload)
                and not _target(sparse[0]).matches(default.payload)
            ):
                out.append((query, _target(default), _target(sparse[0])))
    return out


def _write(cfg: RagpipeConfig, tmp_path: Path, items: list[GoldenItem]) -> RagpipeConfig:
    path = tmp_path / "golden.yaml"
    save_golden(GoldenSet("tune-test", items), path)
    evaluation = cfg.eval.model_copy(
        update={"golden": path, "reports_dir": tmp_path / "reports", "resamples": 200}
    )
    return cfg.model_copy(update={"eval": evaluation})


def _items(pairs: list[tuple[str, ChunkTarget, ChunkTarget]], pick: Any) -> list[GoldenItem]:
    items = []
    for i, (query, default, sparse) in enumerate(pairs[:16]):
        target = pick(f"q{i:02d}", default, sparse)
        items.append(GoldenItem(f"q{i:02d}", query, {target.file: 1}, [target]))
    return items


@pytest.fixture(scope="module")
def pairs(indexed_edge: RagpipeConfig) -> list[tuple[str, ChunkTarget, ChunkTarget]]:
    found = _disagreements(indexed_edge)
    assert len(found) >= 16, f"the corpus gives only {len(found)} disagreeing queries"
    return found


def test_confirmation_queries_never_influence_the_pick(
    indexed_edge: RagpipeConfig, pairs: list[tuple[str, ChunkTarget, ChunkTarget]]
) -> None:
    items = _items(pairs, lambda _id, default, sparse: default)
    golden = GoldenSet("g", items)
    split = split_queries(golden, seed=3)
    space = {"mode": ["hybrid", "dense", "sparse"], "alpha": [0.3, 0.65, 0.9]}
    with Retriever(indexed_edge) as r:
        first = run_tune(indexed_edge, golden, seed=3, space=space, retriever=r)
        # Every confirmation item gets another query (each its own: a query asked twice
        # stays on one side of the split) and another target.
        held = set(split.confirmation)
        changed = [
            GoldenItem(i.id, f"sourdough pizza {i.id}", {"ops/backups.md": 1},
                       [ChunkTarget("ops/backups.md", contains="Incremental backups")])
            if i.id in held else i
            for i in items
        ]  # fmt: skip
        second = run_tune(indexed_edge, GoldenSet("g", changed), seed=3, space=space, retriever=r)
    assert first.split == second.split
    assert [(t.overrides, t.score) for t in first.trials] == [
        (t.overrides, t.score) for t in second.trials
    ]
    assert first.overrides == second.overrides
    assert first.means() != second.means()  # the confirmation part did change


def test_a_pick_the_held_out_queries_reject_is_refused(
    indexed_edge: RagpipeConfig,
    pairs: list[tuple[str, ChunkTarget, ChunkTarget]],
    tmp_path: Path,
) -> None:
    # Adversarial golden set: the tuning queries' targets are what BM25 alone ranks first,
    # the held-out queries' targets what the default ranks first.
    ids = [f"q{i:02d}" for i in range(16)]
    split = split_queries(GoldenSet("g", [GoldenItem(i, i, {"x": 1}) for i in ids]), seed=0)
    tuning = set(split.tuning)
    items = _items(pairs, lambda id_, default, sparse: sparse if id_ in tuning else default)
    cfg = _write(indexed_edge, tmp_path, items)
    outcome, report = tune_and_report(cfg, metric="mrr", space=SPACE)
    out = Path(report.report_dir)
    assert outcome.overrides == {"mode": "sparse"}  # it wins on the tuning queries ...
    assert outcome.tuning_best > outcome.tuning_current
    held_out = outcome.delta  # ... and loses on the held-out ones: 8, too few for a CI,
    assert held_out.interval.mean < 0 and held_out.p_value < 0.05  # so the p decides
    assert outcome.decision == "refused"
    summary = json.loads((out / "tune.json").read_text())
    assert summary == report.as_json() and report.tuned_config is None
    assert summary["decision"] == "refused" and "tuned_config" not in summary
    assert not (out / "tuned.yaml").exists()
    report_md = (out / "report.md").read_text()
    assert "refused" in report_md and "## What was tried, on the tuning queries" in report_md
    assert "| mode | kept 'sparse': " in report_md
    assert "| rerank | not tried: asked for with --llm-options" in report_md
    assert "| chunk.whole_sections | not tried: an ingest setting (this index: False)" in report_md
    assert summary["tuning"]["options"] == outcome.options
    # report.html: the same report and the held-out deltas drawn with their CIs.
    page = (out / "report.html").read_text()
    assert page.count("<svg") == 1 and "Held-out confirmation: tuned - current" in page
    assert "refused" in page and summary["golden"]["check"]["unmatched"] == []


def test_a_recommended_pick_is_written_as_a_config_that_loads(
    indexed_edge: RagpipeConfig,
    pairs: list[tuple[str, ChunkTarget, ChunkTarget]],
    tmp_path: Path,
) -> None:
    items = _items(pairs, lambda _id, default, sparse: sparse)  # BM25 is right everywhere
    cfg = _write(indexed_edge, tmp_path, items)
    base = tmp_path / "ragpipe.yaml"
    base.write_text(
        yaml.safe_dump(
            {
                "embed": {"provider": "onnx"},
                "store": {"path": str(cfg.store.path)},
                "retrieve": {"top_k": 7},
            }
        )
    )
    written = tmp_path / "tuned" / "ragpipe.tuned.yaml"
    outcome, report = tune_and_report(
        cfg, metric="mrr", space=SPACE, base_config=base, write_config=written
    )
    out = Path(report.report_dir)
    assert report.tuned_config == str(written)
    # tune.json names the report's own copy: --out is written after it (a stop between
    # left tune.json naming a file never written).
    assert json.loads((out / "tune.json").read_text())["tuned_config"] == str(out / "tuned.yaml")
    assert outcome.decision == "recommend" and outcome.overrides == {"mode": "sparse"}
    assert outcome.delta.interval.mean > 0
    assert written.read_text() == (out / "tuned.yaml").read_text()
    assert written.read_text().startswith("# Written by `ragpipe eval tune`")
    # The held-out part is small: its warning is in the report and tune.json (it was in
    # neither, nor on the terminal).
    assert "> **warning (held-out queries):** only" in (out / "report.md").read_text()
    assert report.warnings and report.warnings[0].startswith("only ")
    tuned = load_config(written)
    assert tuned.retrieve.mode == "sparse" and tuned.retrieve.top_k == 7  # merged, kept
    assert tuned.embed.provider == "onnx" and tuned.store.path == cfg.store.path


def test_at_file_level_a_larger_prefetch_cannot_win_by_letting_more_files_in(
    tmp_path: Path,
) -> None:
    """The review: a long file's chunks filled the 40 candidates, so one file was ranked;
    prefetch 80 let the right files in, and tune recommended it (held-out NDCG 0 -> 0.57)
    though a user's top 5 was the same. Each variant now ranks 10 files: a tie."""
    from tests.support.corpora import INSTALL_QUERIES, long_file_project

    cfg = long_file_project(tmp_path / "project")
    assert run_ingest(cfg).failed == 0
    items = [GoldenItem(f"q{i:02d}", q, {"widget.md" if i % 2 else "gadget.md": 1})
             for i, q in enumerate(INSTALL_QUERIES)]  # fmt: skip
    with Retriever(cfg) as r:
        outcome = run_tune(
            cfg, GoldenSet("install", items), granularity=Granularity.FILE,
            space={"prefetch": [10, 40]}, retriever=r,
        )  # fmt: skip
    assert [(t.overrides, t.score) for t in outcome.trials] == [
        ({}, outcome.tuning_current),
        ({"prefetch": 40}, outcome.tuning_current),
    ]
    assert outcome.overrides == {} and outcome.decision == "no change"
    assert outcome.options["prefetch"].startswith("refused 40: ")


def test_a_pick_not_significant_is_kept_in_the_report_folder_not_written_as_tuned(
    indexed_edge: RagpipeConfig,
    pairs: list[tuple[str, ChunkTarget, ChunkTarget]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The review: "recommend, not significant" wrote tuned.yaml and --out (at any p), and
    a config picked on noise read like a tuned one."""
    from flows.cli_eval import _print_tune

    weak_file = "tuned-not-significant.yaml"
    ids = [f"q{i:02d}" for i in range(16)]
    split = split_queries(GoldenSet("g", [GoldenItem(i, i, {"x": 1}) for i in ids]), seed=0)
    # BM25 alone is right on every query but 3 held-out ones: it gains on 5 of the 8.
    losing = set(split.confirmation[:3])
    items = _items(pairs, lambda id_, default, sparse: default if id_ in losing else sparse)
    cfg = _write(indexed_edge, tmp_path, items)
    written = tmp_path / "ragpipe.tuned.yaml"
    outcome, report = tune_and_report(cfg, metric="mrr", space=SPACE, write_config=written)
    out = Path(report.report_dir)
    assert outcome.overrides == {"mode": "sparse"} and outcome.delta.interval.mean > 0
    assert outcome.delta.p_value >= 0.05 and outcome.decision == "recommend, not significant"
    assert not written.exists() and not (out / "tuned.yaml").exists()
    kept = (out / weak_file).read_text()
    assert "# NOT SIGNIFICANT: the held-out queries cannot tell this gain from noise" in kept
    assert load_config(out / weak_file).retrieve.mode == "sparse"
    summary = json.loads((out / "tune.json").read_text())
    assert summary["weak_config"] == report.weak_config == str(out / weak_file)
    assert "tuned_config" not in summary and report.tuned_config is None
    assert f"The pick is kept here as `{weak_file}`" in (out / "report.md").read_text()
    _print_tune(report, written)
    said = " ".join(capsys.readouterr().err.split())
    assert (
        f"not significant: the pick is not written as tuned.yaml nor to {written}; it is kept "
        f"as {out / weak_file}. Confirm it on more golden queries before you use it." in said
    )


def test_a_tuned_config_names_the_settings_scored_that_it_does_not_give(
    indexed_edge: RagpipeConfig,
    pairs: list[tuple[str, ChunkTarget, ChunkTarget]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The review: tune scores the effective settings (RAGPIPE_RETRIEVE__* too), but
    tuned.yaml starts from the config file, and a variable overrides the file when it is
    loaded: with RAGPIPE_RETRIEVE__MODE=sparse set, a tuned `mode: hybrid` loaded as sparse."""
    from flows.cli_eval import _print_tune

    golden = tmp_path / "golden.yaml"
    save_golden(GoldenSet("tune-test", _items(pairs, lambda _id, d, sparse: sparse)), golden)
    base = tmp_path / "ragpipe.yaml"
    base.write_text(yaml.safe_dump({"embed": {"provider": "onnx"},
                                    "store": {"path": str(indexed_edge.store.path)}}))  # fmt: skip
    monkeypatch.setenv("RAGPIPE_RETRIEVE__MODE", "hybrid")  # set; BM25 alone will win
    monkeypatch.setenv("RAGPIPE_RETRIEVE__TOP_K", "7")  # scored; in no file
    evaluation = {"golden": str(golden), "reports_dir": str(tmp_path / "reports"),
                  "resamples": 200}  # fmt: skip
    cfg = load_config(base, {"eval": evaluation})
    written = tmp_path / "ragpipe.tuned.yaml"
    outcome, report = tune_and_report(
        cfg, metric="mrr", space=SPACE, base_config=base, write_config=written
    )
    assert outcome.decision == "recommend" and outcome.overrides == {"mode": "sparse"}
    said = [
        "retrieve.mode: RAGPIPE_RETRIEVE__MODE is set ('hybrid') and overrides this file's "
        "'sparse' when it is loaded; unset it to get the settings tune scored",
        "retrieve.top_k was 7 when tune scored (from RAGPIPE_RETRIEVE__TOP_K); this file gives 5",
    ]
    text = written.read_text()
    assert "# WARNING: loaded, this file does not give every setting tune scored" in text
    assert all(f"#   {line}\n" in text for line in said)
    assert report.config_warnings == said
    out = Path(report.report_dir)
    assert json.loads((out / "tune.json").read_text())["config_warnings"] == said
    md = (out / "report.md").read_text()
    assert all(f"> **warning (the tuned config):** {line}" in md for line in said)
    _print_tune(report)
    printed = " ".join(capsys.readouterr().err.split())
    assert all(f"warning (tuned config): {line}" in printed for line in said)
    # What each line says: with the variables, the file loads hybrid; without, top_k 5.
    assert load_config(written).retrieve.mode == "hybrid"
    monkeypatch.delenv("RAGPIPE_RETRIEVE__MODE")
    monkeypatch.delenv("RAGPIPE_RETRIEVE__TOP_K")
    alone = load_config(written).retrieve
    assert (alone.mode, alone.top_k) == ("sparse", 5)


def test_tune_tries_llm_rerank_when_asked_and_keeps_it_where_it_wins(
    indexed_edge: RagpipeConfig,
    pairs: list[tuple[str, ChunkTarget, ChunkTarget]],
    tmp_path: Path,
) -> None:
    from ragpipe.evaluation.retrieval import Variant, run_retrieval_eval
    from ragpipe.evaluation.tune import LLM_SPACE, search_space
    from ragpipe.models.llm import LlamaCppLLM

    # A model of its own, not the session's: llama.cpp's scores move a little with what its
    # prompt cache holds from earlier tests, and on 2 tuning queries that moved the pick (the
    # full suite failed it, the file alone passed).
    smollm = LlamaCppLLM("smollm2-135m", max_tokens=64)

    assert search_space(llm_options=True)["rerank"] == LLM_SPACE["rerank"]
    assert "rerank" not in search_space()
    paths = indexed_edge.paths.model_copy(update={"work_dir": tmp_path})
    retrieve = indexed_edge.retrieve.model_copy(update={"candidate_mul": 1})
    cfg = indexed_edge.model_copy(update={"paths": paths, "retrieve": retrieve})
    llm_overrides = {"rerank": True, "reranker": "llm"}
    with Retriever(cfg, llm=smollm) as r:
        # A golden set whose targets are what the real model ranks first, where that is
        # not the default's first: the LLM rerank must win on both halves.
        items = []
        for query, _, _ in pairs:
            plain = r.search(query, top_k=10).hits
            judged = r.search(query, top_k=10, rerank="llm").hits
            if judged[0].point_id != plain[0].point_id:
                target = _target(judged[0])
                items.append(GoldenItem(f"q{len(items)}", query, {target.file: 1}, [target]))
            if len(items) == 8:
                break
        assert len(items) == 8, "the model agrees with the default too often to test this"
        golden = GoldenSet("g", items)
        # 8 items split in half would hold out 4, on which no verdict can be significant:
        # refused before the tune searches anything.
        with pytest.raises(ConfigError, match="holds out 4 to confirm the pick"):
            run_tune(cfg, golden, seed=1, space=LLM_SPACE, retriever=r)
        # A quarter tunes: 2 to tune, 6 held out.
        outcome = run_tune(cfg, golden, seed=1, share=0.25, space=LLM_SPACE, retriever=r)
        tried = [t for t in outcome.trials if t.overrides == llm_overrides]
        assert len(tried) == 1
        # The trial's score is that of the same settings on the tuning queries (the cached
        # model scores make the replay exact).
        tuning = GoldenSet("t", [i for i in golden.items if i.id in outcome.split.tuning])
        replay = run_retrieval_eval(
            cfg, tuning, [Variant("llm", llm_overrides)], resamples=100, retriever=r
        )
    assert replay.summary["llm"]["ndcg@10"].mean == pytest.approx(tried[0].score)
    assert outcome.overrides == llm_overrides or outcome.overrides == {
        **llm_overrides,
        "hyde": "adaptive",
    }
    assert outcome.options["rerank"].startswith("kept 'llm': "), outcome.options["rerank"]
    # It gains on the 6 held-out queries, by what the sign-flip test cannot tell from noise.
    assert len(outcome.split.confirmation) == 6 and outcome.delta.interval.mean > 0
    assert outcome.decision == "recommend, not significant" and outcome.delta.p_value >= 0.05
    assert (tmp_path / "llm_rerank.sqlite").is_file()
    assert "hyde" in outcome.options and "not tried: asked" not in outcome.options["hyde"]


@pytest.mark.slow
def test_cli_eval_tune(
    prefect_harness: None,
    indexed_edge: RagpipeConfig,
    pairs: list[tuple[str, ChunkTarget, ChunkTarget]],
    tmp_path: Path,
) -> None:
    cfg = _write(indexed_edge, tmp_path, _items(pairs, lambda _id, default, sparse: default))
    args = ["eval", "tune", "--golden", str(cfg.eval.golden), "--store-path",
            str(cfg.store.path), "--embedder", "onnx", "--reports-dir",
            str(cfg.eval.reports_dir), "--granularity", "chunk"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "8 tuning queries, 8 held-out" in output
    assert "held-out queries: tuned - current" in output and "report: " in output
    bad = CliRunner().invoke(app, [*args, "--metric", "f1"])
    assert bad.exit_code == 2 and "tune metric 'f1'" in bad.output


def test_the_search_space_tries_feedback_only_where_a_dense_leg_exists() -> None:
    from ragpipe.evaluation.tune import SPACE, relevant

    assert SPACE["prf"] == [False, True]
    hybrid = {"mode": "hybrid", "fusion_method": "convex"}
    assert relevant("prf", hybrid) and relevant("prf", {**hybrid, "mode": "dense"})
    assert not relevant("prf", {**hybrid, "mode": "sparse"})


# -- chunk settings, each on its own index (--ingest-options) ----------------------------


@pytest.fixture(scope="module")
def sectioned(tmp_path_factory: pytest.TempPathFactory) -> RagpipeConfig:
    """Four files of the query corpus with chunks of 100 characters: most sections are cut
    in two, and whole sections (up to 200 characters) keep them whole."""
    base = tmp_path_factory.mktemp("sectioned")
    for name, text in QUERY_CORPUS.items():
        if "copy" not in name:  # no duplicate: its ties would rank by point id
            (base / "corpus" / name).parent.mkdir(parents=True, exist_ok=True)
            (base / "corpus" / name).write_text(text, encoding="utf-8")
    cfg = RagpipeConfig(
        discover={"roots": [base / "corpus"]},  # type: ignore[arg-type]
        chunk={"size": 100, "overlap": 10},  # type: ignore[arg-type]
        embed={"provider": "onnx"},  # type: ignore[arg-type]
        store={"path": base / "store"},  # type: ignore[arg-type]
        paths={"work_dir": base / "work"},  # type: ignore[arg-type]
    )
    assert run_ingest(cfg).failed == 0
    return cfg


@pytest.fixture(scope="module")
def first_files(
    sectioned: RagpipeConfig, tmp_path_factory: pytest.TempPathFactory
) -> list[tuple[str, str, str]]:
    """(query, first file on the index, first file with whole sections) where they differ.
    The whole-sections index here is a reference built apart, so that each test's tune
    builds its own."""
    from ragpipe.evaluation.sibling import sibling_config

    home = tmp_path_factory.mktemp("reference")
    whole = sibling_config(sectioned, {"whole_sections": True})
    whole = whole.model_copy(
        update={
            "store": whole.store.model_copy(update={"path": home / "store"}),
            "paths": whole.paths.model_copy(update={"work_dir": home / "work"}),
        }
    )
    assert run_ingest(whole).failed == 0
    found = []
    with Retriever(sectioned) as cut, Retriever(whole) as kept:
        for a, b in itertools.combinations(WORDS, 2):
            query = f"{a} and {b}"
            mine, theirs = cut.search(query, top_k=1).hits[0], kept.search(query, top_k=1).hits[0]
            if mine.file_path != theirs.file_path:
                rel = [h.file_path.split("/corpus/", 1)[-1] for h in (mine, theirs)]
                found.append((query, rel[0], rel[1]))
    assert len(found) >= 12, f"only {len(found)} queries rank another file first"
    return found


def _first_file_golden(found: list[tuple[str, str, str]], whole: bool) -> list[GoldenItem]:
    """Each query's target: the file whole sections rank first (``whole``), else the one
    the index ranks first: one index wins by construction."""
    return [
        GoldenItem(f"q{i:02d}", query, {theirs if whole else mine: 1})
        for i, (query, mine, theirs) in enumerate(found)
    ]


def test_sibling_config_has_its_own_store_beside_the_work_dir_and_no_gate(
    sectioned: RagpipeConfig,
) -> None:
    from ragpipe.evaluation.sibling import build_siblings, plan_siblings, sibling_config

    gated = sectioned.model_copy(
        update={"index": sectioned.index.model_validate({"gate": {"golden": ["g.yaml"]}})}
    )
    sibling = sibling_config(gated, {"whole_sections": True})
    work = sectioned.paths.work_dir.resolve()
    home = sibling.paths.work_dir.parent
    assert home.parent == work.parent / f"{work.name}.tune"  # beside the work dir, not in it
    assert home.name.startswith("whole_sections=true-") and len(home.name) == 28
    assert sibling.store.path == home / "store" and sibling.paths.work_dir == home / "work"
    assert sibling.store.collection == "ragpipe-tune-" + home.name.replace("=", "-")
    assert sibling.chunk.whole_sections and sibling.chunk.size == 100
    assert sibling.index.gate is None and gated.index.gate is not None
    assert sibling.embed == sectioned.embed and sibling.retrieve == sectioned.retrieve
    # Another embedder cannot write that index: it gets its own.
    embed = sectioned.embed.model_copy(update={"provider": EmbedProvider.LOCAL})
    other = sectioned.model_copy(update={"embed": embed})
    assert sibling_config(other, {"whole_sections": True}).store.path != sibling.store.path
    assert [(s.setting, s.value) for s in plan_siblings(sectioned, INGEST_SPACE)] == [
        ("whole_sections", True)
    ]
    # Refused before anything is built.
    chunk = sectioned.chunk.model_copy(update={"chunker": ChunkerKind.SENTENCE_WINDOW})
    window = sectioned.model_copy(update={"chunk": chunk})
    with pytest.raises(ConfigError, match=r"cannot be tried: .*chunk\.chunker: recursive"):
        build_siblings(window, INGEST_SPACE)
    with pytest.raises(ConfigError, match=r"cannot tune chunk setting\(s\) size"):
        build_siblings(sectioned, {"size": [50]})


def test_tune_tries_whole_sections_on_a_second_index_and_keeps_it_where_it_wins(
    sectioned: RagpipeConfig, first_files: list[tuple[str, str, str]], tmp_path: Path
) -> None:
    from ragpipe.evaluation.retrieval import Variant, run_retrieval_eval
    from ragpipe.evaluation.sibling import sibling_config
    from ragpipe.ingest.runner import WorkDir

    items = _first_file_golden(first_files, whole=True)
    cfg = _write(sectioned, tmp_path, items)
    cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"granularity": "file"})})
    base = tmp_path / "ragpipe.yaml"
    base.write_text(yaml.safe_dump({"chunk": {"size": 100, "overlap": 10}}))
    outcome, report = tune_and_report(
        cfg, metric="mrr", space={"mode": ["hybrid", "dense"]}, base_config=base,
        ingest_space=INGEST_SPACE,
    )  # fmt: skip
    sibling = sibling_config(cfg, {"whole_sections": True})
    # Its conversions are the index's own files, linked, not converted again.
    mine = {p.name: p.stat().st_ino for p in WorkDir.of(cfg).convert_cache.glob("*.parquet")}
    theirs = {p.name: p.stat().st_ino for p in WorkDir.of(sibling).convert_cache.glob("*.parquet")}
    assert len(mine) == 4 and theirs == mine
    with Retriever(sibling) as whole, Retriever(cfg) as cut:
        assert whole.store.count() < cut.store.count()  # sections kept whole: fewer points
        # The trial of the current settings on the sibling is that index's own score.
        tuning = GoldenSet("t", [i for i in items if i.id in outcome.split.tuning])
        replay = run_retrieval_eval(
            cfg, tuning, [Variant("x")], granularity=Granularity.FILE, resamples=100,
            retriever=whole,
        )  # fmt: skip
    tried = [t.score for t in outcome.trials if t.overrides == {"chunk.whole_sections": True}]
    assert tried == [pytest.approx(replay.summary["x"]["mrr"].mean)]
    assert outcome.ingest == {"whole_sections": True}, outcome.options
    assert outcome.index == str(sibling.store.path.resolve())
    verdict = outcome.options["chunk.whole_sections"]
    assert verdict.startswith("kept True: ") and "on its own index against" in verdict
    # The retrieve verdicts shown are the search on the picked index, and say so.
    assert outcome.options["mode"].endswith("(on the chunk.whole_sections=True index)")
    # The held-out queries: the current settings on this index, the pick on the sibling,
    # whose first file is every target by construction.
    tuned = [r for r in outcome.confirmation.rows if r.variant == "tuned"]
    assert tuned and all(r.metrics["mrr"] == 1.0 for r in tuned)
    assert outcome.means()[0] < 1.0 and outcome.decision == "recommend"
    assert outcome.changes == {**outcome.overrides, "chunk.whole_sections": True}
    text = (Path(report.report_dir) / "tuned.yaml").read_text()
    assert f"# is at {outcome.index}." in text
    tuned_config = load_config(Path(report.report_dir) / "tuned.yaml")
    assert tuned_config.chunk.whole_sections and tuned_config.chunk.size == 100
    summary = json.loads((Path(report.report_dir) / "tune.json").read_text())
    assert summary["ingest"] == {"whole_sections": True} and summary["index"] == outcome.index
    assert "another index: tune built it at" in (Path(report.report_dir) / "report.md").read_text()


def test_a_second_index_that_loses_on_the_tuning_queries_is_refused(
    sectioned: RagpipeConfig, first_files: list[tuple[str, str, str]]
) -> None:
    from ragpipe.evaluation.sibling import build_siblings

    golden = GoldenSet("g", _first_file_golden(first_files, whole=False))
    siblings = build_siblings(sectioned, INGEST_SPACE)
    with Retriever(sectioned) as r:
        outcome = run_tune(
            sectioned, golden, granularity=Granularity.FILE, space={"mode": ["hybrid"]},
            siblings=siblings, retriever=r, metric="mrr",
        )  # fmt: skip
    verdict = outcome.options["chunk.whole_sections"]
    mine = outcome.tuning_current
    assert verdict.startswith("refused True: ") and verdict.endswith(
        f"on its own index against {mine:.4f} on this one (a change needs +0.005)"
    ), verdict
    assert outcome.ingest == {} and outcome.index == "" and outcome.overrides == {}
    assert outcome.decision == "no change"
    assert any(t.overrides == {"chunk.whole_sections": True} for t in outcome.trials)
    # The report's "picked" is the pick's score; a higher one not taken is said as such (it
    # was reported as the "best" beside "the current settings scored best").
    from ragpipe.evaluation.tune import markdown

    assert outcome.tuning_best == mine
    assert outcome.message.startswith("no change: nothing beat the current settings by +0.005")
    report = markdown(outcome)
    assert f"current {mine:.4f}, picked {mine:.4f}" in report
    highest = max(t.score for t in outcome.trials)
    assert (f"the highest tried, {highest:.4f}, gained less than +0.005" in report) is (
        highest > mine
    )


def test_a_second_index_of_other_sources_is_refused_not_compared(
    sectioned: RagpipeConfig, first_files: list[tuple[str, str, str]], tmp_path: Path
) -> None:
    from ragpipe.evaluation.sibling import build_siblings

    items = _first_file_golden(first_files, whole=True)
    # The sources change after the index was built: the sibling would index other text.
    root = tmp_path / "corpus"
    shutil.copytree(sectioned.discover.roots[0], root)
    cfg = sectioned.model_copy(
        update={
            "discover": sectioned.discover.model_copy(update={"roots": [root]}),
            "store": sectioned.store.model_copy(update={"path": tmp_path / "store"}),
            "paths": sectioned.paths.model_copy(update={"work_dir": tmp_path / "work"}),
        }
    )
    run_ingest(cfg)
    (root / "kitchen" / "bread.md").write_text("# Baking bread\n\nBuy it.\n", encoding="utf-8")
    with Retriever(cfg) as r:
        outcome = run_tune(
            cfg, GoldenSet("g", items), granularity=Granularity.FILE, space={"mode": ["hybrid"]},
            siblings=build_siblings(cfg, INGEST_SPACE), retriever=r,
        )  # fmt: skip
    verdict = outcome.options["chunk.whole_sections"]
    assert verdict.startswith(
        "refused True: the two indexes hold other files or versions (1 differ; first: "
        f"{root / 'kitchen' / 'bread.md'} has another version in the second index)"
    ), verdict
    assert "run `ragpipe ingest` and tune again" in verdict
    assert outcome.ingest == {} and outcome.index == ""
    assert not any("chunk.whole_sections" in t.overrides for t in outcome.trials)


@pytest.mark.slow
def test_cli_eval_tune_ingest_options(
    prefect_harness: None,
    sectioned: RagpipeConfig,
    first_files: list[tuple[str, str, str]],
    tmp_path: Path,
) -> None:
    cfg = _write(sectioned, tmp_path, _first_file_golden(first_files, whole=True))
    config = tmp_path / "ragpipe.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "discover": {"roots": [str(r) for r in cfg.discover.roots]},
                "chunk": {"size": 100, "overlap": 10},
                "embed": {"provider": "onnx"},
                "store": {"path": str(cfg.store.path)},
                "paths": {"work_dir": str(cfg.paths.work_dir)},
            }
        )
    )
    args = ["eval", "tune", "--config", str(config), "--golden", str(cfg.eval.golden),
            "--reports-dir", str(cfg.eval.reports_dir), "--granularity", "file",
            "--ingest-options", "--metric", "mrr"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "chunk.whole_sections: kept True: " in output
    assert '"chunk.whole_sections": true' in output
    assert "its chunk settings need the index tune built at " in output
    assert "tuned config: " in output


def test_a_stopped_tune_says_out_was_not_written_only_when_it_had_a_pick(tmp_path: Path) -> None:
    # The review: stopped after its report, tune said '--out was not written (the report's
    # directory has the same file)' of a refused verdict, which has no tuned.yaml at all.
    from flows.cli_eval import _stopped
    from ragpipe.evaluation import run

    out = tmp_path / "tuned.yaml"
    kept = _stopped(tmp_path, "tune", "no report or tuned config was written", out)
    assert kept() == "the tune stopped; no report or tuned config was written"
    report = tmp_path / "20261201T000000Z-faq-tune"
    report.mkdir()
    run.WRITTEN_RUN_DIRS.append(report)
    try:
        assert kept() == f"the tune stopped after writing its report ({report})"
        (report / "tuned.yaml").write_text("retrieve: {}\n")
        assert kept() == (
            f"the tune stopped after writing its report ({report}); {out} was not written "
            "(the report's directory has the same file)"
        )
        out.write_text("retrieve: {}\n")  # --out written: nothing more to say
        assert kept() == f"the tune stopped after writing its report ({report})"
    finally:
        run.WRITTEN_RUN_DIRS.remove(report)


def test_tune_refuses_too_few_answerable_items_before_building_anything(tmp_path: Path) -> None:
    """Four items, one unanswerable: --ingest-options built a second index (every chunk
    embedded again) before refusing a set with three items to split."""
    golden = tmp_path / "four.yaml"
    items = [
        {"id": f"q{i}", "query": f"question {i}?", "relevance": {"a.md": 1}} for i in range(3)
    ] + [{"id": "none", "query": "nothing?", "answerable": False}]
    golden.write_text(yaml.safe_dump({"name": "four", "items": items}), encoding="utf-8")
    config = tmp_path / "ragpipe.yaml"
    config.write_text(yaml.safe_dump({
        "discover": {"roots": [str(tmp_path / "corpus")]},
        "embed": {"provider": "onnx"},
        "store": {"path": str(tmp_path / "store")},
        "paths": {"work_dir": str(tmp_path / "work")},
    }), encoding="utf-8")  # fmt: skip
    args = ["eval", "tune", "--config", str(config), "--golden", str(golden), "--ingest-options"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "has 3 answerable item(s); tuning needs at least 8 (2 to tune, 6 held out" in " ".join(
        result.output.split()
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["four.yaml", "ragpipe.yaml"]
