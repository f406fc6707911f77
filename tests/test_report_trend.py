"""`ragpipe report`: runs of one golden set at a time, retrieval and RAG runs apart, an HTML
trend per golden set; history files from before the `kind` column still read."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.cli_eval import _print_history
from ragpipe.evaluation.report import trend_series
from ragpipe.evaluation.run import HISTORY_SCHEMA, GoldenInfo, read_history


def _row(run: str, golden: str, kind: str, metric: str, mean: float) -> dict[str, object]:
    return {
        "run_id": run, "finished_at": run, "name": run.split("-", 1)[1], "golden": golden,
        "granularity": "answer" if kind == "rag" else "chunk", "variant": kind, "kind": kind,
        "metric": metric, "mean": mean, "ci_low": mean - 0.1, "ci_high": mean + 0.1, "n": 20,
        "git_revision": "",
    }  # fmt: skip


def test_report_filters_by_golden_set_and_writes_trends(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    rows = [
        _row("20261101T000000Z-faq", "faq", "retrieval", "mrr", 0.61),
        _row("20261102T000000Z-faq", "faq", "retrieval", "mrr", 0.72),
        _row("20261103T000000Z-faq-rag", "faq", "rag", "answer_f1", 0.31),
        _row("20261104T000000Z-deb", "debfaq", "retrieval", "mrr", 0.11),
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=HISTORY_SCHEMA), reports / "history.parquet")
    runner = CliRunner()
    shown = runner.invoke(app, ["report", "--reports-dir", str(reports), "--golden", "faq"],
                          terminal_width=200)  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert "faq, retrieval runs, chunk level: latest 2 of 2 runs" in shown.output
    assert "faq, rag runs: latest 1 of 1 runs" in shown.output
    assert "0.110" not in shown.output and "debfaq" not in shown.output  # the other set
    page = (reports / "trend-faq.html").read_text()
    assert page.count("<svg") == 2 and "retrieval (chunk): faq / retrieval" in page
    assert "rag: faq-rag / rag" in page and not (reports / "trend-debfaq.html").exists()
    named = runner.invoke(app, ["report", "--reports-dir", str(reports), "--name", "deb",
                                "--html-dir", str(tmp_path / "html")])  # fmt: skip
    assert named.exit_code == 0 and (tmp_path / "html" / "trend-debfaq-deb.html").is_file()
    none = runner.invoke(app, ["report", "--reports-dir", str(reports), "--golden", "nope"])
    assert none.exit_code == 2 and "golden sets in the history: debfaq, faq" in none.output


def test_history_from_before_the_kind_column(tmp_path: Path) -> None:
    old_schema = pa.schema([f for f in HISTORY_SCHEMA if f.name != "kind"])
    rows = [_row("20261101T000000Z-a", "faq", "rag", "faithfulness", 0.5),
            _row("20261102T000000Z-b", "faq", "retrieval", "mrr", 0.5)]  # fmt: skip
    for r in rows:
        del r["kind"]
    pq.write_table(pa.Table.from_pylist(rows, schema=old_schema), tmp_path / "history.parquet")
    assert [r["kind"] for r in read_history(tmp_path)] == ["rag", "retrieval"]


def test_runs_of_other_sizes_are_not_one_trend(tmp_path: Path) -> None:
    # A --limit 3 run is named like the 20-question run: the terminal keeps them apart, as
    # the HTML trend does, rather than drawing 0.95 -> 0.40 as a regression.
    sized = [("20261101T000000Z-faq", 0.95, 20), ("20261102T000000Z-faq", 0.40, 3),
             ("20261103T000000Z-faq", 0.93, 20)]  # fmt: skip
    rows = [{**_row(run, "faq", "retrieval", "mrr", mean), "queries": n} for run, mean, n in sized]
    pq.write_table(pa.Table.from_pylist(rows, schema=HISTORY_SCHEMA), tmp_path / "history.parquet")
    shown = CliRunner().invoke(app, ["report", "--reports-dir", str(tmp_path)], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())  # the table titles wrap
    assert (
        "faq, retrieval runs, chunk level, 20 items, scope not recorded: latest 2 of 2 runs" in text
    )
    assert (
        "faq, retrieval runs, chunk level, 3 items, scope not recorded: latest 1 of 1 runs" in text
    )
    assert "bars span 0.930 to 0.950" in text


def test_a_sample_a_limit_and_another_depth_are_not_one_trend(tmp_path: Path) -> None:
    # The attack review: a --sample 10 run (0.371) and a --limit 10 run (0.800) of one set
    # were one "10 queries" trend; mrr at depth 20 counts hits that depth 10 does not.
    scoped = [
        (
            "20261101T000000Z-faq",
            0.37,
            "a sample of 10 of 40 items (seed 7; every item "
            "equally likely, strata in proportion), top_k 5",
        ),
        ("20261102T000000Z-faq", 0.80, "the first 10 of 40 items (--limit), top_k 5"),
        ("20261103T000000Z-faq", 0.79, "the first 10 of 40 items (--limit), top_k 5"),
    ]
    rows = [{**_row(run, "faq", "rag", "answer_f1", mean), "queries": 10, "scope": scope}
            for run, mean, scope in scoped]  # fmt: skip
    depths = [("20261104T000000Z-deb", 0.50, 10), ("20261105T000000Z-deb", 0.52, 20)]
    rows += [{**_row(run, "deb", "retrieval", "mrr", mean), "queries": 40,
              "scope": f"all 40 items, depth {depth}"} for run, mean, depth in depths]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows, schema=HISTORY_SCHEMA), tmp_path / "history.parquet")
    shown = CliRunner().invoke(app, ["report", "--reports-dir", str(tmp_path)], terminal_width=250)
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert (
        "faq, rag runs, a sample of 10 of 40 items (seed 7; every item equally likely, "
        "strata in proportion), top_k 5: latest 1 of 1 runs" in text
    )
    assert "faq, rag runs, the first 10 of 40 items (--limit), top_k 5: latest 2 of 2 runs" in text
    assert "retrieval runs, chunk level, all 40 items, depth 10: latest 1 of 1 runs" in text
    assert "retrieval runs, chunk level, all 40 items, depth 20: latest 1 of 1 runs" in text
    page = (tmp_path / "trend-faq.html").read_text()
    assert "rag: faq / rag, the first 10 of 40 items (" in page  # the SVG writes "- -limit"
    assert "rag: faq / rag, a sample of 10 of 40 items" in page


def test_history_from_before_the_scope_column(tmp_path: Path) -> None:
    old_schema = pa.schema([f for f in HISTORY_SCHEMA if f.name != "scope"])
    rows = [{**_row("20261101T000000Z-a", "faq", "rag", "faithfulness", 0.5), "queries": 7}]
    pq.write_table(pa.Table.from_pylist(rows, schema=old_schema), tmp_path / "history.parquet")
    (row,) = read_history(tmp_path)
    assert row["scope"] is None and row["queries"] == 7


def test_one_trend_per_series_as_the_html_trend(capsys: pytest.CaptureFixture[str]) -> None:
    # The review: two retrieval runs of other names and a compare run's two variants were
    # one bar series, hybrid 0.80 -> dense 0.62 -> bm25 0.55 -> hybrid 0.81 read as a history.
    scope = "all 60 items, depth 10"
    rows = [{**_row(run, "g", kind, "mrr", mean), "name": name, "variant": variant,
             "scope": scope} for run, name, variant, kind, mean in (
                 ("20261201T000000Z-hybrid", "hybrid", "default", "retrieval", 0.80),
                 ("20261202T000000Z-dense", "dense", "default", "retrieval", 0.62),
                 ("20261203T000000Z-compare", "compare", "bm25", "compare", 0.50),
                 ("20261203T000000Z-compare", "compare", "hybrid", "compare", 0.89),
                 ("20261204T000000Z-hybrid", "hybrid", "default", "retrieval", 0.81),
             )]  # fmt: skip
    assert trend_series(rows[2]) == "compare (chunk): compare / bm25, all 60 items, depth 10"
    _print_history(rows, 5, "mrr", "g, retrieval runs")
    trend = capsys.readouterr().out.split("\ng, retrieval runs: trend of mrr")[1].splitlines()
    # One span for every series, 0.50 to 0.89: 1 + round(39 x (mean - 0.50) / 0.39) blocks,
    # 0.80 -> 31, 0.81 -> 32, 0.62 -> 13.
    assert trend == [
        ", one per kind of run, name and variant (oldest first; bars span 0.500 to 0.890 in "
        "every one, not 0 to 1):",
        "  compare (chunk): compare / bm25, all 60 items, depth 10:",
        "    20261203T000000Z-compare 0.500 " + "█" * 1,
        "  compare (chunk): compare / hybrid, all 60 items, depth 10:",
        "    20261203T000000Z-compare 0.890 " + "█" * 40,
        "  retrieval (chunk): dense / default, all 60 items, depth 10:",
        "    20261202T000000Z-dense   0.620 " + "█" * 13,
        "  retrieval (chunk): hybrid / default, all 60 items, depth 10:",
        "    20261201T000000Z-hybrid  0.800 " + "█" * 31,
        "    20261204T000000Z-hybrid  0.810 " + "█" * 32,
    ]


def _append_runs(root: Path, who: str, runs: int) -> None:
    import types

    from ragpipe.evaluation.run import append_history

    golden = GoldenInfo("faq", "faq.yaml", 4, "all 4 items")
    for n in range(runs):
        summary = types.SimpleNamespace(
            run_id=f"{who}-{n}", finished_at=f"{who}-{n}", name=who, golden=golden,
            granularity="chunk", kind="retrieval", depth=10, judge=None, git_revision="",
            metrics={"hybrid": {"mrr": {"mean": 0.5, "ci_low": 0.4, "ci_high": 0.6, "n": 4}}},
        )  # fmt: skip
        append_history(root, summary)  # type: ignore[arg-type]


def test_runs_finishing_together_both_reach_the_history(tmp_path: Path) -> None:
    """The interrupt review: append_history reads, adds and replaces history.parquet, and
    two runs finishing together (a nightly's evals on one reports_dir) each wrote it
    without the other's rows. Two processes appending 15 runs each: all 30 are there."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # no forked copy of pytest's threads
    workers = [context.Process(target=_append_runs, args=(tmp_path, who, 15))
               for who in ("nightly", "manual")]  # fmt: skip
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert w.exitcode == 0
    runs = {r["run_id"] for r in read_history(tmp_path)}
    assert runs == {f"{who}-{n}" for who in ("nightly", "manual") for n in range(15)}


def test_flagged_and_withheld_metrics_are_listed_with_their_flag_never_as_trend_points(
    tmp_path: Path,
) -> None:
    """The review: history dropped flagged and withheld metrics, so `ragpipe report` and
    serve's /reports page showed them as blank cells (read as "not measured"); every mean
    there was a bare number, one item's 0.950 too, and the trend drew it full scale."""
    import types

    from ragpipe.evaluation.metrics import bootstrap_ci
    from ragpipe.evaluation.report import history_cell
    from ragpipe.evaluation.run import append_history, stats
    from ragpipe.serve.reports import index_page

    blind = "judge not calibrated (kappa 0.50 on 8 pairs, a blind judge does as well with p=0.14)"
    failing = "judge failed on 5 of 10 (> 20%)"
    golden = GoldenInfo("faq", "faq.yaml", 10, "all 10 items")
    runs = {
        "20261201T000000Z-faq-rag": {
            "answer_f1": stats(bootstrap_ci([0.2, 0.3, 0.4], 200, 0)),
            "faithfulness": stats(bootstrap_ci([1.0] * 7 + [0.6], 200, 0), flag=blind),
        },
        "20261202T000000Z-faq-rag": {
            "answer_f1": stats(bootstrap_ci([0.95], 200, 0)),
            "faithfulness": stats(bootstrap_ci([1.0] * 5, 200, 0), 5, flag=failing, withheld=True),
        },
    }
    for run_id, metrics in runs.items():
        summary = types.SimpleNamespace(
            run_id=run_id, finished_at=run_id, name="faq-rag", golden=golden, granularity="answer",
            kind="rag", depth=5, judge=None, git_revision="", metrics={"rag": metrics},
        )  # fmt: skip
        append_history(tmp_path, summary)  # type: ignore[arg-type]

    assert {(r["run_id"][:9], r["metric"]) for r in read_history(tmp_path)} == {
        ("20261201T", "answer_f1"), ("20261202T", "answer_f1")}  # fmt: skip
    # history.parquet itself holds values only: a reader of it (an older ragpipe sharing
    # the folder) takes every row for one. The others are in history-flagged.parquet.
    assert set(pq.read_table(tmp_path / "history.parquet")["metric"].to_pylist()) == {"answer_f1"}
    assert pq.read_table(tmp_path / "history-flagged.parquet")["metric"].to_pylist() == [
        "faithfulness", "faithfulness"]  # fmt: skip
    rows = {(r["run_id"][:9], r["metric"]): r for r in read_history(tmp_path, flagged=True)}
    withheld = rows[("20261202T", "faithfulness")]
    assert withheld["mean"] is None and withheld["flag"] == f"withheld: {failing}"
    # 7 of 8 ones and a 0.6: mean 0.95, too few items for a CI.
    flagged = history_cell(rows[("20261201T", "faithfulness")])
    assert flagged == f"0.950 (n=8, no CI: under 10); {blind}"
    assert history_cell(withheld) == f"{failing} (n=5, 5 failed)"
    assert history_cell(rows[("20261202T", "answer_f1")]) == "0.950 (n=1, no CI)"

    shown = CliRunner().invoke(app, ["report", "--reports-dir", str(tmp_path), "--metric",
                                     "faithfulness"], env={"COLUMNS": "400"})  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert blind in shown.output and f"{failing} (n=5, 5 failed)" in shown.output
    assert "no run has faithfulness as a value (flagged or withheld in 2 run(s)" in shown.output
    trend = (tmp_path / "trend-faq.html").read_text(encoding="utf-8")
    assert "answer_f1" in trend and "faithfulness" not in trend
    shown = CliRunner().invoke(app, ["report", "--reports-dir", str(tmp_path), "--metric",
                                     "answer_f1"], env={"COLUMNS": "400"})  # fmt: skip
    bars = [line for line in shown.output.splitlines() if line.startswith("    2026")]
    # 0.300 to 0.950: 1 and 40 blocks; the one-item mean says it has no CI.
    assert bars == ["    20261201T000000Z-faq-rag 0.300 █ (n=3, no CI: under 10)",
                    "    20261202T000000Z-faq-rag 0.950 " + "█" * 40 + " (n=1, no CI)"]  # fmt: skip

    page = index_page(tmp_path)
    assert "<a href='trend/faq'>trend of every metric</a>" in page
    assert "<span>0.950 (n=1, no CI)</span>" in page
    assert "<span class='flag'>judge failed on 5 of 10 (&gt; 20%) (n=5, 5 failed)</span>" in page
    assert "a blind judge does as well with p=0.14)</span>" in page


def test_a_golden_set_with_flagged_runs_only_has_no_trend_link(tmp_path: Path) -> None:
    # The review: the index linked every golden set to its trend page, which has values
    # only: a set whose runs are all flagged linked to a 404.
    import types

    from ragpipe.evaluation.metrics import bootstrap_ci
    from ragpipe.evaluation.run import append_history, in_history, stats
    from ragpipe.serve.reports import index_page, trend_page

    golden = GoldenInfo("faq", "faq.yaml", 3, "all 3 items")
    summary = types.SimpleNamespace(
        run_id="20261201T000000Z-faq-rag", finished_at="2026-12-01", name="faq-rag",
        golden=golden, granularity="answer", kind="rag", depth=5, judge=None, git_revision="",
        metrics={"rag": {"faithfulness": stats(bootstrap_ci([1.0, 0.5, 1.0], 200, 0),
                                                flag="judge not calibrated")}},
    )  # fmt: skip
    append_history(tmp_path, summary)  # type: ignore[arg-type]
    assert read_history(tmp_path) == [] and trend_page(tmp_path, "faq") is None
    page = index_page(tmp_path)
    assert "trend/faq" not in page
    assert "(no trend: every metric of its runs is flagged or withheld)" in page
    # The flagged file alone marks the run recorded (an interrupt then keeps its report);
    # an unreadable history marks nothing and raises nothing (it runs on an interrupt).
    assert in_history(tmp_path, summary.run_id) and not in_history(tmp_path, "other")
    (tmp_path / "history-flagged.parquet").write_bytes(b"not parquet")
    assert not in_history(tmp_path, summary.run_id)


def test_a_damaged_history_is_one_error_for_report_and_kept_aside_by_the_next_run(
    tmp_path: Path,
) -> None:
    """garbage, an empty file, another table: a 72-line traceback (exit 1) from report, and
    an eval run that did all its work failed at its end."""
    runner = CliRunner()
    history = tmp_path / "history.parquet"
    other = pa.Table.from_pylist([{"x": 1}])
    for damage in (lambda: history.write_bytes(b"garbage"), lambda: history.write_bytes(b""),
                   lambda: pq.write_table(other, history)):  # fmt: skip
        damage()
        shown = runner.invoke(app, ["report", "--reports-dir", str(tmp_path)])
        assert shown.exit_code == 2, shown.output
        assert "is not a ragpipe history file" in shown.output
        assert "Traceback" not in shown.output
    _append_runs(tmp_path, "nightly", 1)  # the run is recorded; the damaged file kept aside
    assert [r["run_id"] for r in read_history(tmp_path)] == ["nightly-0"]
    (aside,) = tmp_path.glob("history.parquet.damaged-*")
    assert pq.read_table(aside).equals(other)
    blocked = tmp_path / "afile"
    blocked.write_text("")
    shown = runner.invoke(app, ["report", "--reports-dir", str(tmp_path), "--html-dir",
                                str(blocked)])  # fmt: skip
    assert shown.exit_code == 2 and "cannot write the trend pages to" in shown.output


def test_the_settings_list_every_setting_the_variants_differ_in() -> None:
    """`eval compare base:fusion_method=rrf rrf-w:fusion_method=rrf,dense_weight=2` (the
    help's own example) listed two identical Settings lines."""
    from ragpipe.evaluation.report import settings_lines

    common = {"mode": "hybrid", "fusion_method": "rrf", "alpha": 0.5, "doc_weight": 0.3,
              "rrf_k": 60, "prefetch": 40, "top_k": 5, "rerank": False, "mmr": False,
              "hyde": "off", "dense_weight": 1.0, "sparse_weight": 1.0}  # fmt: skip
    lines = settings_lines({"base": common, "rrf-w": {**common, "dense_weight": 2.0}})
    assert lines["base"].endswith("top_k=5, rerank=False, mmr=False, hyde=off, dense_weight=1.0")
    assert lines["rrf-w"].endswith("dense_weight=2.0")
    assert "sparse_weight" not in lines["base"]  # the same in both: not listed
    (alone,) = settings_lines({"only": common}).values()
    assert alone.startswith("mode=hybrid, fusion_method=rrf") and "dense_weight" not in alone


def test_the_lists_of_runs_show_failed_and_not_applicable_as_the_headline(
    tmp_path: Path,
) -> None:
    """The history kept n alone: report.md said 0.567 [0.500, 0.700] (n=6, 1 failed, 1 n/a)
    and `ragpipe report` (n=6)."""
    import types

    from ragpipe.evaluation.report import headline_cell, history_cell
    from ragpipe.evaluation.run import append_history

    ci = {"mean": 0.567, "ci_low": 0.5, "ci_high": 0.7, "n": 6, "n_failed": 1,
          "n_not_applicable": 1}  # fmt: skip
    golden = GoldenInfo("faq", "faq.yaml", 8, "all 8 items")
    summary = types.SimpleNamespace(
        run_id="r1", finished_at="r1", name="rag", golden=golden, granularity="answer",
        kind="rag", depth=5, judge=None, git_revision="",
        metrics={"rag": {"answer_f1": ci}},
    )  # fmt: skip
    append_history(tmp_path, summary)  # type: ignore[arg-type]
    (row,) = read_history(tmp_path)
    assert history_cell(row) == headline_cell(ci) == "0.567 [0.500, 0.700] (n=6, 1 failed, 1 n/a)"


def test_a_history_with_a_corrupt_page_is_damaged_and_one_it_may_not_read_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyarrow reports a corrupt page as a plain OSError ("ZSTD decompression failed"): it
    crashed report and every eval run; a file it may not read is not moved aside."""
    from ragpipe.errors import ConfigError

    for n in range(60):
        _append_runs(tmp_path, f"night{n}", 1)
    history = tmp_path / "history.parquet"
    data = bytearray(history.read_bytes())
    data[200:240] = bytes(40)  # zeros inside the first column chunk
    history.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="is not a ragpipe history file"):
        read_history(tmp_path)
    _append_runs(tmp_path, "after", 1)
    assert [r["run_id"] for r in read_history(tmp_path)] == ["after-0"]
    assert len(list(tmp_path.glob("history.parquet.damaged-*"))) == 1

    def denied(*_: object, **__: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(pq, "read_table", denied)
    with pytest.raises(PermissionError):
        read_history(tmp_path)


def test_a_name_with_dollars_is_drawn_as_written_in_the_trend(tmp_path: Path) -> None:
    """The review: a run named ``nightly $_{x$`` finished, then every `ragpipe report` (and
    serve's trend page) ended in matplotlib's math-text parse error; ``$x$`` was drawn as
    an italic x."""
    import re

    from ragpipe.evaluation.report import render_trend

    rows = [
        _row("20261101T000000Z-nightly $_{x$", "faq", "retrieval", "mrr", 0.61),
        _row("20261102T000000Z-$x$", "faq", "retrieval", "mrr", 0.72),
    ]
    page = render_trend("faq $y$", rows)
    texts = re.findall(r"<!-- (.*?) -->", page)
    assert "retrieval (chunk): nightly $_{x$ / retrieval" in texts
    assert "retrieval (chunk): $x$ / retrieval" in texts
    assert "20261101T000000Z-nightly $_{x$" in texts and "Oblique" not in page
    pq.write_table(pa.Table.from_pylist(rows, schema=HISTORY_SCHEMA),
                   tmp_path / "history.parquet")  # fmt: skip
    shown = CliRunner().invoke(app, ["report", "--reports-dir", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    assert "nightly $_{x$ / retrieval" in (tmp_path / "trend-faq.html").read_text()


def test_a_page_with_figures_keeps_its_title() -> None:
    """The review: html_page's loop over the figures rebound ``title``, so every page with
    plots was titled by its last figure: the trend of golden set dir/gold was
    "<title>ndcg@10</title>"."""
    from ragpipe.evaluation.report import html_page, render_trend

    rows = [_row("20261101T000000Z-a", "dir/gold", "retrieval", m, 0.5)
            for m in ("mrr", "ndcg@10")]  # fmt: skip
    page = render_trend("dir/gold", rows)
    assert page.count("<title>") == 1 and "<title>ragpipe trend: dir/gold</title>" in page
    # The rule for a point without a CI, as the cells say it (it read "n < 2").
    assert (
        "<p>• 1 runs, oldest first; whiskers: 95% CI; a hollow point has no CI (under 10 "
        "items, or all values equal)</p>"
    ) in page
    assert "<h2>mrr</h2>" in page and "<h2>ndcg@10</h2>" in page
    page = html_page("run <1>", "# head", [("fig & co", "<svg/>")])
    assert page.count("<title>") == 1 and "<title>run &lt;1&gt;</title>" in page
    assert "<h2>fig &amp; co</h2><div class='fig'><svg/></div>" in page


def test_golden_sets_whose_names_slug_alike_get_a_trend_page_each(tmp_path: Path) -> None:
    """The review: golden sets named "faq v2" and "faq-v2" both wrote trend-faq-v2.html,
    the second over the first. A name the file name changes (or with a capital: one file
    with its lower-case twin on a file system blind to case) ends in 8 hex digits of its
    SHA-256 there."""
    import hashlib

    from ragpipe.serve.reports import index_page, trend_page

    rows = [_row("20261101T000000Z-a", "faq v2", "retrieval", "mrr", 0.61),
            _row("20261102T000000Z-b", "faq-v2", "retrieval", "mrr", 0.72),
            _row("20261103T000000Z-c", "FAQ", "retrieval", "mrr", 0.5)]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows, schema=HISTORY_SCHEMA), tmp_path / "history.parquet")
    shown = CliRunner().invoke(app, ["report", "--reports-dir", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    assert hashlib.sha256(b"faq v2").hexdigest()[:8] == "4d41dd51"
    assert hashlib.sha256(b"FAQ").hexdigest()[:8] == "dbc468a1"
    pages = {p.name: p.read_text(encoding="utf-8") for p in tmp_path.glob("trend-*.html")}
    assert set(pages) == {"trend-faq-v2-4d41dd51.html", "trend-faq-v2.html",
                          "trend-FAQ-dbc468a1.html"}  # fmt: skip
    assert "<h1>Trend: faq v2</h1>" in pages["trend-faq-v2-4d41dd51.html"]
    assert "<h1>Trend: faq-v2</h1>" in pages["trend-faq-v2.html"]
    printed = [line for line in shown.output.splitlines() if line.startswith("trend: ")]
    assert sorted(printed) == sorted(f"trend: {tmp_path / name}" for name in pages)
    # serve's trend page is found by the set's name, never by file: one for each.
    assert "<h1>Trend: faq v2</h1>" in (trend_page(tmp_path, "faq v2") or "")
    assert "<h1>Trend: faq-v2</h1>" in (trend_page(tmp_path, "faq-v2") or "")
    page = index_page(tmp_path)
    assert "href='trend/faq%20v2'" in page and "href='trend/faq-v2'" in page


def test_a_compare_variant_name_with_other_settings_is_another_trend_line(
    tmp_path: Path,
) -> None:
    """`eval compare ... x:mode=dense`, then `... x:mode=sparse`: the two runs' "x" were one
    trend line, dense and sparse retrieval drawn as one series with no warning."""
    import types

    from ragpipe.evaluation.report import trend_series
    from ragpipe.evaluation.run import append_history

    ci = {"mean": 0.5, "ci_low": 0.4, "ci_high": 0.6, "n": 10}
    golden = GoldenInfo("faq", "faq.yaml", 10, "all 10 items")
    for run, mode in (("r1", "dense"), ("r2", "sparse"), ("r3", "dense")):
        append_history(tmp_path, types.SimpleNamespace(  # type: ignore[arg-type]
            run_id=run, finished_at=run, name="compare", golden=golden, granularity="chunk",
            kind="compare", depth=10, judge=None, git_revision="",
            variants={"base": {"mode": "hybrid"}, "x": {"mode": mode}},
            metrics={"base": {"mrr": ci}, "x": {"mrr": ci}},
        ))  # fmt: skip
    rows = read_history(tmp_path)
    lines = {r["run_id"]: trend_series(r) for r in rows if r["variant"] == "x"}
    assert lines["r1"] == lines["r3"] != lines["r2"]
    assert lines["r1"].startswith("compare (chunk): compare / x, all 10 items, depth 10, settings ")
    assert len({trend_series(r) for r in rows if r["variant"] == "base"}) == 1  # unchanged
    # Still one table a run, its variants side by side (the review: one table a variant).
    shown = CliRunner().invoke(app, ["report", "--reports-dir", str(tmp_path), "--metric", "mrr"])
    assert shown.exit_code == 0, shown.output
    assert shown.output.count("latest 3 of 3 runs") == 1 and "settings" not in shown.output.split(
        "latest")[0]  # fmt: skip
