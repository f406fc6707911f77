"""The one headline cell every surface shows (terminal, report.md, report.html, Prefect):
a CI only from n >= 10, the counts, and no number for a withheld metric."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest
from rich.console import Console

from flows.cli_eval import _metrics_table
from ragpipe.evaluation.agreement import ppi_mean
from ragpipe.evaluation.metrics import bootstrap_ci, paired_delta
from ragpipe.evaluation.report import delta_cell, headline_cell, plots, ppi_cell
from ragpipe.evaluation.run import stats


def test_cells() -> None:
    many = stats(bootstrap_ci([1.0, 0.0, 1.0, 1.0] * 3, 200, 0), failed=1, not_applicable=2)
    low, high = many["ci_low"], many["ci_high"]
    assert headline_cell(many) == f"0.750 [{low:.3f}, {high:.3f}] (n=12, 1 failed, 2 n/a)"
    few = stats(bootstrap_ci([1.0, 0.0, 1.0, 1.0], 200, 0), failed=1, not_applicable=2)
    assert headline_cell(few) == "0.750 (n=4, no CI: under 10, 1 failed, 2 n/a)"
    one = stats(bootstrap_ci([0.883], 200, 0), failed=8, not_applicable=3)
    assert headline_cell(one) == "0.883 (n=1, no CI, 8 failed, 3 n/a)"
    assert headline_cell(stats(bootstrap_ci([], 200, 0), failed=4)) == "no value (n=0, 4 failed)"
    equal = stats(bootstrap_ci([1.0] * 10, 200, 0), not_applicable=1)
    assert headline_cell(equal) == "1.000 (n=10, no CI: all values equal, 1 n/a)"
    flagged = stats(bootstrap_ci([0.5, 1.0], 200, 0), flag="judge not calibrated")
    assert headline_cell(flagged).endswith("(n=2, no CI: under 10); judge not calibrated")
    withheld = stats(
        bootstrap_ci([0.883], 200, 0), failed=8, flag="judge unreliable (kappa 0.00)",
        withheld=True,
    )  # fmt: skip
    assert headline_cell(withheld) == "judge unreliable (kappa 0.00) (n=1, 8 failed)"
    assert "0.883" not in headline_cell(withheld)


def test_cells_of_summaries_written_before_the_counts() -> None:
    old = {"mean": 0.5, "ci_low": 0.25, "ci_high": 0.75, "n": 10}
    assert headline_cell(old) == "0.500 [0.250, 0.750] (n=10)"


def test_delta_cells() -> None:
    # Deltas +1, 0, +1, +1: mean +0.750; a sign flip reaches |mean| 0.75 only when the three
    # non-zero deltas keep one sign, 2 of 8 patterns: p about 0.25.
    few = paired_delta([0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], 200, 0, 10000).as_dict()
    assert abs(few["p_value"] - 0.25) < 0.02  # too few for a CI: the p alone
    assert delta_cell(few) == f"+0.750 (n=4, no CI: under 10) p={few['p_value']:.3g}"
    moved = paired_delta([0.0, 1.0, 0.0, 0.0] * 3, [1.0] * 12, 200, 0, 10000).as_dict()
    low, high, p = moved["ci_low"], moved["ci_high"], moved["p_value"]
    assert p < 0.01 and low < 0.75 < high
    assert delta_cell(moved) == f"+0.750 [{low:+.3f}, {high:+.3f}] p={p:.3g}"
    # Three significant digits: p = 0.0496 read "p=0.050", not under 0.05.
    near = {"mean": 0.1, "ci_low": 0.001, "ci_high": 0.2, "n": 30}
    assert delta_cell({**near, "p_value": 0.0496}).endswith(" p=0.0496")
    assert delta_cell({**near, "p_value": 0.5}).endswith(" p=0.5")
    same = paired_delta([0.5, 0.2, 0.9] * 4, [0.5, 0.2, 0.9] * 4, 200, 0).as_dict()  # all 0
    assert delta_cell(same) == "+0.000 (n=12, no CI: every delta equal)"
    one = paired_delta([0.25], [1.0], 200, 0).as_dict()
    assert delta_cell(one) == "+0.750 (n=1, no CI)"
    # 40 deltas all +0.25 or +0.5: no sign flip reaches the mean, p = 1/(N+1), never 0. It
    # read "p=0.000".
    tiny = paired_delta([0.0] * 40, [0.25, 0.5] * 20, 200, 0, 10000).as_dict()
    assert 0 < tiny["p_value"] < 0.001 and delta_cell(tiny).endswith(" p<0.001")


def test_ppi_cells() -> None:
    # tests/test_agreement.py's by-hand estimate, 0.3 +- 0.574, clipped at 0: a value.
    inside = ppi_mean("faithfulness", {"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.6, "e": 0.5,
                                       "f": 0.1}, {"a": 0.7, "b": 0.8, "c": 0.6},
                      bounds=(0.0, 1.0)).as_dict()  # fmt: skip
    assert ppi_cell(inside) == "0.300 [0.000, 0.874]"
    # The review: 1.45 +- 0.113 (judge 1.0 on the 20 unlabelled items, failed on 9 of the 10
    # labelled ones, the humans' 1.0 each) read "1.000 [1.000, 1.000]", certainty.
    outside = ppi_mean(
        "faithfulness",
        {**{f"u{i}": 1.0 for i in range(20)}, **{f"l{i}": 0.5 for i in range(9)}, "l9": 1.0},
        {f"l{i}": 1.0 for i in range(10)},
        bounds=(0.0, 1.0),
    ).as_dict()
    assert ppi_cell(outside) == (
        "1.450 [1.337, 1.563]; outside the metric's range [0, 1]: not a possible mean (too "
        "few labels, or the labelled items unlike the rest)"
    )
    one = ppi_mean("faithfulness", {"a": 0.9, "b": 0.5}, {"a": 1.0}, bounds=(0.0, 1.0))
    assert ppi_cell(one.as_dict()) == "0.600 (no CI)"  # 0.5 - (0.9 - 1.0)
    # A summary from before the flag: the cell as it was.
    assert ppi_cell({"mean": 0.5, "ci_low": 0.25, "ci_high": 0.75}) == "0.500 [0.250, 0.750]"


def test_the_terminal_shows_report_mds_delta_cells() -> None:
    # `eval compare` printed "Δ +0.050 p=0.05" for p = 0.047 (report.md: p=0.047), "p=0.00"
    # for p = 1/1001 (the smallest of 1000 sign flips), and never the CI a gate reads.
    base = stats(bootstrap_ci([0.5, 0.7] * 5, 200, 0))
    deltas = {
        "mrr": {"mean": 0.05, "ci_low": 0.002, "ci_high": 0.099, "n": 30, "p_value": 0.047},
        "recall@5": {"mean": 0.198, "ci_low": 0.192, "ci_high": 0.2, "n": 40, "p_value": 1 / 1001},
        "hit@3": {"mean": 0.0, "ci_low": None, "ci_high": None, "n": 13, "p_value": 1.0},
    }
    summary = SimpleNamespace(
        metrics={"base": dict.fromkeys(deltas, base), "cand": dict.fromkeys(deltas, base)},
        deltas={"cand": deltas},
    )
    console = Console(width=250, record=True)
    console.print(_metrics_table(summary, list(deltas), "t"))
    cells = {line.split("│")[1].strip(): line.split("│")[3].strip()
             for line in console.export_text().splitlines() if line.count("│") == 4}  # fmt: skip
    head = headline_cell(base)
    assert head.startswith("0.600 [") and head.endswith("] (n=10)")
    assert headline_cell(base) == head
    assert cells == {
        "mrr": f"{head}  Δ +0.050 [+0.002, +0.099] p=0.047",
        "recall@5": f"{head}  Δ +0.198 [+0.192, +0.200] p<0.001",
        "hit@3": f"{head}  Δ +0.000 (n=13, no CI: every delta equal)",
    }


def test_the_bar_chart_leaves_out_flagged_and_withheld_metrics() -> None:
    # `--probe-size 0`: the judged metrics are flagged "judge not calibrated"; they were drawn
    # as ordinary bars with whiskers under a title saying only withheld ones were left out.
    shown = stats(bootstrap_ci([0.2, 0.4, 0.9], 200, 0))
    flagged = stats(bootstrap_ci([0.5, 0.7], 200, 0), flag="judge not calibrated")
    withheld = stats(bootstrap_ci([0.5, 0.7], 200, 0), flag="judge unreliable", withheld=True)
    metrics = {"answer_f1": shown, "faithfulness": flagged, "context_recall": withheld}
    summary = SimpleNamespace(metrics={"rag": metrics}, metric_names=list(metrics), deltas={})
    judged = [0.5, 0.7, None]
    table = pa.table({"variant": ["rag"] * 3, "answer_f1": [0.2, 0.4, 0.9],
                      "faithfulness": judged, "context_recall": judged})  # fmt: skip
    (bars, title), (boxes, box_title) = [(svg, t) for t, svg in plots(summary, table)]
    assert title == (
        "Metrics with 95% confidence intervals (withheld and flagged ones not drawn: the "
        "tables above say why)"
    )
    # matplotlib's SVG names each text it draws in a comment: the axis's metric names.
    assert "<!-- answer_f1 -->" in bars
    assert "<!-- faithfulness -->" not in bars and "<!-- context_recall -->" not in bars
    assert box_title == "Per-query distributions" and "<!-- answer_f1 per query -->" in boxes
    assert "faithfulness per query" not in boxes


def test_the_bars_mark_a_value_without_ci_and_show_values_below_zero() -> None:
    # The review: one item's bar had no whisker under a title promising 95% CIs (read as a
    # CI of zero width), and answer_cosine's -0.17 [-0.40, 0.10] lay under an axis from 0.
    import re

    one = stats(bootstrap_ci([0.9], 200, 0))
    below = stats(bootstrap_ci([-0.7] * 5 + [0.1] * 5, 200, 0))
    assert below["ci_low"] == pytest.approx(-0.54)  # below the axis's old 0
    metrics = {"answer_f1": one, "answer_cosine": below}
    summary = SimpleNamespace(metrics={"rag": metrics}, metric_names=list(metrics), deltas={})
    cosines = [-0.7] * 5 + [0.1] * 5
    table = pa.table({"variant": ["rag"] * 10, "answer_f1": [0.9] + [None] * 9,
                      "answer_cosine": cosines})  # fmt: skip
    (bars, _), (boxes, _) = [(svg, t) for t, svg in plots(summary, table)]
    texts = re.findall(r"<!-- (.*?) -->", bars)
    assert texts.count("no CI") == 1  # the one-item bar, labelled and hatched
    assert "−0.4" in texts  # the axis reaches the CI's low end (matplotlib's minus sign)
    assert "−0.6" in re.findall(r"<!-- (.*?) -->", boxes)


def test_names_are_drawn_as_written_and_every_variant_has_a_legend_entry() -> None:
    """The review: matplotlib read a name's ``$...$`` as math text: ``cost$_{$`` ended a
    compare run in a parse error after its scoring, ``$x$`` was drawn as an italic x; and
    a variant named ``_current`` had no legend entry (a label starting with "_" is left
    out unless the legend is given its handles)."""
    import re

    value = stats(bootstrap_ci([0.2, 0.4, 0.9], 200, 0))
    variants = ["_current", "cost$_{$", "$x$"]
    summary = SimpleNamespace(
        metrics={v: {"mrr": value} for v in variants}, metric_names=["mrr"], baseline="_current",
        deltas={v: {"mrr": {"mean": 0.1, "ci_low": 0.0, "ci_high": 0.2}} for v in variants[1:]},
    )  # fmt: skip
    table = pa.table({"variant": [v for v in variants for _ in range(3)],
                      "mrr": [0.2, 0.4, 0.9] * 3})  # fmt: skip
    figures = plots(summary, table)  # type: ignore[arg-type]
    titles = [t for t, _ in figures][1:]
    assert titles == ["Per-query distributions", "Deltas vs baseline (_current)"]
    (bars, boxes, deltas) = [re.findall(r"<!-- (.*?) -->", svg) for _, svg in figures]
    assert [t for t in bars if t in variants] == variants  # the legend, in order
    assert [t for t in boxes if t in variants] == variants  # the box plot's axis
    assert [t for t in deltas if " - " in t] == ["cost$_{$ - _current", "$x$ - _current"]
    # Drawn as text: no italic (math) glyph anywhere.
    assert all("Oblique" not in svg for _, svg in figures)


def test_the_prefect_metrics_table_has_no_bare_number_for_a_flagged_metric() -> None:
    # The review: the metrics artifact blanked the number columns of a withheld metric only;
    # a flagged one (a judge a coin matches) sorted and exported as mean 0.6.
    from ragpipe.evaluation.report import metric_rows

    value = stats(bootstrap_ci([0.5, 0.7] * 5, 200, 0))
    flagged = stats(bootstrap_ci([0.5, 0.7] * 5, 200, 0), flag="judge not calibrated")
    withheld = stats(bootstrap_ci([0.5, 0.7] * 5, 200, 0), flag="judge unreliable", withheld=True)
    summary = SimpleNamespace(metrics={"rag": {"answer_f1": value, "faithfulness": flagged,
                                               "context_recall": withheld}})  # fmt: skip
    rows = {r["metric"]: r for r in metric_rows(summary)}  # type: ignore[arg-type]
    numbers = ("mean", "ci_low", "ci_high")
    ci = (round(value["ci_low"], 4), round(value["ci_high"], 4))
    assert 0.5 < ci[0] < 0.6 < ci[1] < 0.7
    assert [rows["answer_f1"][k] for k in numbers] == [0.6, *ci]
    for m in ("faithfulness", "context_recall"):
        assert [rows[m][k] for k in numbers] == [None, None, None]
    assert rows["faithfulness"]["headline"] == (
        f"0.600 [{ci[0]:.3f}, {ci[1]:.3f}] (n=10); judge not calibrated"
    )
    assert rows["context_recall"]["headline"] == "judge unreliable (n=10)"
