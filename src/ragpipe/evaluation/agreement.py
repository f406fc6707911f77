"""Measuring an LLM judge before believing it: agreement with humans, and PPI means.

Two questions, two tools:

* **Does the judge agree with a human?** :func:`agreement` scores the judge's
  yes/no verdicts on probe pairs with known answers: accuracy, Cohen's kappa
  (agreement beyond what the two answer rates give by chance, so a judge that
  says "yes" to everything scores 0, not its accuracy), seeded percentile
  bootstrap CIs of both, and the chance that a judge blind to the truth would
  score as well (:func:`chance_p`: on 8 pairs a coin gets 6 right, kappa 0.50,
  one time in seven). A verdict the judge failed to give counts as wrong.
* **What is the metric's mean, corrected for the judge's bias?**
  :func:`ppi_mean` is prediction-powered inference for a mean (Angelopoulos et
  al., "Prediction-powered inference", Science 2023): the judge's mean over all
  items, minus the judge's average error measured on a few human-labelled ones.
  Its CI is honest even when the judge is biased; the judge's plain mean is not.

Human labels live in a small CSV/YAML/JSON file (:func:`load_labels`), one
value per (item, metric).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ragpipe import yamlio
from ragpipe.errors import ConfigError
from ragpipe.evaluation.metrics import SAME

LABEL_FIELDS = ("item_id", "metric", "value")
LABEL_SUFFIXES = (".csv", ".yaml", ".yml", ".json")
LABEL_RANGE = (-1.0, 1.0)  # answer relevancy is a cosine, the other metrics are in [0, 1]
_NAN = float("nan")
_RANGE_SLACK = 1e-9  # how far past a bound floating-point rounding may put an estimate


# --------------------------------------------------------------------------- agreement


@dataclass(frozen=True)
class Agreement:
    """How well a judge's yes/no verdicts agree with known answers.

    Attributes:
        n: Probe pairs.
        failed: Pairs where the judge gave no usable verdict (counted as wrong).
        accuracy: Share of pairs where the verdict equals the truth.
        accuracy_low: Lower bound of the percentile bootstrap 95% CI (nan when n < 2).
        accuracy_high: Upper bound of that CI (nan when n < 2).
        kappa: Cohen's kappa (nan when undefined: truth and verdicts constant and equal).
        kappa_low: Lower bound of the percentile bootstrap 95% CI of kappa (nan when
            n < 2, or when kappa is undefined in every resample).
        kappa_high: Upper bound of that CI.
        yes_share: Share of pairs the judge answered "yes" (1).
        p_chance: The chance that a judge whose verdicts ignore the truth gets at least as
            many pairs right (:func:`chance_p`).
    """

    n: int
    failed: int
    accuracy: float
    accuracy_low: float
    accuracy_high: float
    kappa: float
    kappa_low: float
    kappa_high: float
    yes_share: float
    p_chance: float

    def as_dict(self) -> dict[str, float | int | None]:
        """Return the fields as a plain dict (for JSON reports; NaN becomes null)."""
        return _nulls(asdict(self))


def _binary(values: Sequence[int], name: str) -> npt.NDArray[np.int8]:
    bad = [v for v in values if v not in (0, 1)]
    if bad:
        raise ValueError(f"{name} must hold 0/1 labels, got {bad[0]!r}; map yes to 1 and no to 0")
    return np.asarray(values, dtype=np.int8)


def _kappas(truth: npt.NDArray[np.int8], verdicts: npt.NDArray[np.int8]) -> npt.NDArray[np.float64]:
    """Cohen's kappa along the last axis (nan where undefined).

    Computed from whole counts, ``(n*agree - e) / (n*n - e)`` with ``e = t1*v1 + t0*v0``,
    and one division: the nearest float to the exact kappa. From shares it came out a hair
    off (7 of 10 balanced pairs right, exactly 2/5, was 0.3999999999999999), and a judge
    exactly at a bar of 0.4 was called unreliable."""
    n = truth.shape[-1]
    agree = (truth == verdicts).sum(axis=-1, dtype=np.int64)
    t1 = truth.sum(axis=-1, dtype=np.int64)
    v1 = verdicts.sum(axis=-1, dtype=np.int64)
    expected = t1 * v1 + (n - t1) * (n - v1)  # n*n times the chance agreement p_e
    gap = n * n - expected  # 0 only when both are constant and equal
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = (n * agree - expected) / gap
    return np.where(gap == 0, np.nan, kappa)


def cohen_kappa(truth: Sequence[int], verdicts: Sequence[int]) -> float:
    """Cohen's kappa of two binary labelings.

    ``p_o`` is the share of pairs that agree, ``p_e = p1_t*p1_v + p0_t*p0_v`` the
    agreement expected by chance from the two "1" rates, and
    ``kappa = (p_o - p_e) / (1 - p_e)``.

    Args:
        truth: Known labels, 0 or 1.
        verdicts: The judge's labels, 0 or 1, one per truth label.

    Returns:
        Kappa in [-1, 1]; nan when ``p_e == 1`` (both labelings constant and equal).

    Raises:
        ValueError: On empty input, a length mismatch, or a label other than 0/1.
    """
    _paired(truth, verdicts, "truth label")
    return float(_kappas(_binary(truth, "truth"), _binary(verdicts, "verdicts")))


def _paired(truth: Sequence[int], verdicts: Sequence[int | None], per: str) -> None:
    """One verdict per truth label, and at least one of each."""
    if len(truth) != len(verdicts):
        raise ValueError(
            f"truth has {len(truth)} labels but verdicts has {len(verdicts)}; pass one verdict "
            f"per {per}"
        )
    if not truth:
        raise ValueError("at least one pair is needed; pass non-empty truth and verdicts")


def _percentile_ci(values: npt.NDArray[np.float64]) -> tuple[float, float]:
    """The 95% percentile interval of the defined values; none (NaN) when no value is
    defined or every resample gave the same one (a zero-width interval claims certainty
    that a constant judge or a handful of pairs does not give)."""
    kept = values[~np.isnan(values)]
    if kept.size == 0:
        return _NAN, _NAN
    low, high = np.quantile(kept, [0.025, 0.975])
    if high - low <= SAME:
        return _NAN, _NAN
    return float(low), float(high)


def agreement(
    truth: Sequence[int],
    verdicts: Sequence[int | None],
    resamples: int = 1000,
    seed: int = 0,
) -> Agreement:
    """Score a judge's verdicts on probe pairs with known answers.

    A failed verdict (``None``) counts as the wrong answer (``1 - truth``) for both
    accuracy and kappa: a judge that cannot answer is not reliable.

    Args:
        truth: Known answers, 1 for yes and 0 for no.
        verdicts: The judge's answers: 1 yes, 0 no, ``None`` when it gave no verdict.
        resamples: Bootstrap resamples of the pair indices.
        seed: Seed of the ``numpy.random.Generator`` drawing the resamples.

    Returns:
        The :class:`Agreement`, with percentile bootstrap 95% CIs (resamples where
        kappa is undefined are left out of the kappa CI).

    Raises:
        ValueError: On empty input, a length mismatch, a label other than 0/1 (or
            ``None`` for a verdict), or ``resamples < 1``.
    """
    _paired(truth, verdicts, "probe pair (None where the judge gave none)")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    t = _binary(truth, "truth")
    failed = sum(v is None for v in verdicts)
    answered = [1 - int(t[i]) if v is None else v for i, v in enumerate(verdicts)]
    v = _binary(answered, "verdicts")
    n = int(t.size)
    accuracy = float((t == v).mean())
    kappa = float(_kappas(t, v))
    yes_share = float(sum(x == 1 for x in verdicts if x is not None) / n)
    p_chance = chance_p(t, v)
    if n < 2:
        return Agreement(n, failed, accuracy, _NAN, _NAN, kappa, _NAN, _NAN, yes_share, p_chance)
    rng = np.random.default_rng(seed)
    index = rng.integers(0, n, size=(resamples, n))
    t_boot, v_boot = t[index], v[index]
    accuracies = (t_boot == v_boot).mean(axis=1)
    acc_low, acc_high = _percentile_ci(accuracies)
    kappa_low, kappa_high = _percentile_ci(_kappas(t_boot, v_boot))
    return Agreement(
        n=n,
        failed=failed,
        accuracy=accuracy,
        accuracy_low=float(acc_low),
        accuracy_high=float(acc_high),
        kappa=kappa,
        kappa_low=kappa_low,
        kappa_high=kappa_high,
        yes_share=yes_share,
        p_chance=p_chance,
    )


CHANCE_GRID = 1001  # yes-rates a blind judge is tried at: 0, 0.001, ..., 1


def chance_p(truth: Sequence[int] | npt.NDArray[np.int8],
             verdicts: Sequence[int] | npt.NDArray[np.int8]) -> float:  # fmt: skip
    """The chance that a judge blind to the truth gets at least as many pairs right as
    ``verdicts`` do: the largest, over the share ``q`` of "yes" such a judge says, of
    ``P(Bin(n1, q) + Bin(n0, 1 - q) >= right)``, with ``n1`` and ``n0`` the true and false
    pairs (``q`` on a grid of CHANCE_GRID values; with as many true pairs as false ones and
    more than half right, the largest is at ``q = 1/2``, a coin; half right or fewer, a
    judge saying always yes or always no reaches it: 1).

    Kappa alone does not say this: on 8 pairs a coin gets 6 or more right (kappa 0.50 and
    more) with chance 37/256 = 0.14; a judge is believed only when this chance is small.

    Args:
        truth: Known answers, 1 for yes and 0 for no.
        verdicts: The judge's answers, 0 or 1; a failed verdict must already count as wrong
            (as :func:`agreement` does).

    Returns:
        The chance, in (0, 1].

    Raises:
        ValueError: As :func:`cohen_kappa`.
    """
    from scipy.stats import binom  # scipy: only when a judge is measured

    _paired(list(truth), list(verdicts), "truth label")
    t, v = _binary(list(truth), "truth"), _binary(list(verdicts), "verdicts")
    right = int((t == v).sum())
    n1 = int(t.sum())
    n0 = int(t.size) - n1
    q = np.linspace(0.0, 1.0, CHANCE_GRID)[:, None]
    k = np.arange(n1 + 1)[None, :]  # right among the true pairs; the false ones need the rest
    tail = (binom.pmf(k, n1, q) * binom.sf(right - k - 1, n0, 1 - q)).sum(axis=1)
    return float(min(1.0, tail.max()))


# --------------------------------------------------------------------------- PPI


@dataclass(frozen=True)
class PPIEstimate:
    """A prediction-powered mean of one metric, beside the judge's and the humans' means.

    Attributes:
        metric: Metric name.
        mean: Prediction-powered estimate of the metric's mean.
        ci_low: Lower bound of the normal-approximation CI (nan when n_labeled < 2).
        ci_high: Upper bound of that CI.
        judge_mean: Plain mean of the judge's scores over all N judged items (a RAG run
            gives its verdicts' mean, none for a withheld metric).
        human_mean: Classical mean of the human labels alone (n_labeled items).
        human_ci_low: Lower bound of the classical normal CI of the human mean (nan
            when n_labeled < 2).
        human_ci_high: Upper bound of that CI.
        n_judged: N, items with a judge prediction (a RAG run: with a verdict; a failed one
            predicts the midpoint inside the estimate, uncounted here).
        n_labeled: n, items with a human label.
        flag: Why ``mean`` is not to be read as the metric's mean (None when it is): an
            estimate outside the metric's range, kept unclipped with its CI.
    """

    metric: str
    mean: float
    ci_low: float
    ci_high: float
    judge_mean: float
    human_mean: float
    human_ci_low: float
    human_ci_high: float
    n_judged: int
    n_labeled: int
    flag: str | None = None

    def as_dict(self) -> dict[str, float | int | str | None]:
        """Return the fields as a plain dict (for JSON reports; NaN becomes null)."""
        return _nulls(asdict(self))


def _nulls(data: dict[str, Any]) -> dict[str, Any]:
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in data.items()}


def _finite(value: float, what: str, item_id: str, fix: str) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ConfigError(f"{what} for item {item_id!r} is {number}; {fix}")
    return number


def _t(level: float, df: float) -> float:
    """Student's t quantile of a two-sided ``level`` interval at ``df`` degrees of freedom
    (a normal z at 2 labels covered 66 % of the time, not 95 %)."""
    from scipy.stats import t

    return float(t.ppf((1 + level) / 2, df))


def ppi_mean(
    metric: str,
    predictions: Mapping[str, float],
    labels: Mapping[str, float],
    level: float = 0.95,
    bounds: tuple[float, float] | None = None,
) -> PPIEstimate:
    """Prediction-powered mean of a metric from judge scores and a few human labels.

    ``theta = mean_U(f) - mean_n(f - y)``, with ``f`` the judge's score, U the judged
    items without a label and ``y`` the human value of the n labelled ones; the CI is
    ``theta ± t * sqrt(var_f / |U| + var_rect / n)`` (sample variances, ddof=1;
    ``var_f`` over every judged item when |U| = 1), ``t`` Student's quantile at the
    Welch-Satterthwaite degrees of freedom of that sum (few labels: about n - 1); the
    labels' own CI is ``mean ± t(n - 1) * sd / sqrt(n)``. With a normal z instead, the
    intervals from 2, 3 and 5 labels covered 66 %, 79 % and 88 % of the time (humans
    alone) and 85 %, 90 % and 92 % (PPI), not 95 %. The labelled items are kept out of
    the first term so that the two terms are independent, as the variance assumes
    (Angelopoulos et al., Science 2023). With every item labelled it is the labels' own
    mean and CI. A zero-width interval (no variance at all) is reported as no CI, never
    as certainty. An estimate outside ``bounds`` (too few labels, or labelled items
    unlike the rest: a judge that failed on most of them) is kept as computed, with its
    CI, and flagged: clipped, 1.45 [1.34, 1.56] read ``1.000 [1.000, 1.000]``.

    Args:
        metric: Metric name, carried into the result.
        predictions: Item id -> the judge's score, for every judged item of the run.
        labels: Item id -> the human's value; every id must be in ``predictions``.
        level: Confidence level of both CIs, in (0, 1).
        bounds: The metric's range; the CIs of an estimate inside it are clipped to it
            (the true mean lies inside, so the clipped CI covers as often); an estimate
            outside it is flagged instead.

    Returns:
        The :class:`PPIEstimate`.

    Raises:
        ConfigError: When ``labels`` is empty, names an item not in ``predictions``,
            a score or label is not finite, or ``level`` is outside (0, 1).
    """
    if not 0 < level < 1:
        raise ConfigError(f"level must be in (0, 1), got {level!r}; use e.g. 0.95")
    if not labels:
        raise ConfigError(
            f"no human labels for metric {metric!r}; label at least 2 items of this run "
            "(load_labels) to estimate its mean"
        )
    unknown = [item_id for item_id in labels if item_id not in predictions]
    if unknown:
        raise ConfigError(
            f"human label for item {unknown[0]!r} (metric {metric!r}) has no judge prediction "
            f"({len(unknown)} such labels); labels must be for items of this run: fix the "
            "item_id or drop the label"
        )
    fix_pred = "drop items the judge could not score from predictions"
    f_all = np.array([_finite(s, "judge score", k, fix_pred) for k, s in predictions.items()])
    fix_label = "give a number in [-1, 1]"
    y = np.array([_finite(v, "human label", k, fix_label) for k, v in labels.items()])
    f_lab = np.array([float(predictions[k]) for k in labels])
    f_unlabeled = np.array([float(s) for k, s in predictions.items() if k not in labels])
    big_n, n = int(f_all.size), int(y.size)
    rectifier = f_lab - y
    judge_mean = float(f_all.mean())
    human_mean = float(y.mean())
    low, high = bounds if bounds is not None else (-math.inf, math.inf)

    def clip(value: float) -> float:
        return value if math.isnan(value) else min(max(value, low), high)

    human_half = _NAN
    if n >= 2:
        human_half = _t(level, n - 1) * float(y.std(ddof=1)) / math.sqrt(n)
    if not human_half > 0:
        human_half = _NAN  # one label, or all alike: no interval, not a zero-width one
    if f_unlabeled.size == 0:  # every judged item labelled: the labels say it all
        theta, half = human_mean, human_half
    else:
        theta = float(f_unlabeled.mean()) - float(rectifier.mean())
        # One unlabelled score has no variance of its own to estimate: the judge's spread
        # over every judged item stands in (0 would narrow the CI to the rectifier's alone).
        spread = f_unlabeled if f_unlabeled.size >= 2 else f_all
        judge_term = float(spread.var(ddof=1)) / f_unlabeled.size
        rect_term = float(rectifier.var(ddof=1)) / n if n >= 2 else _NAN
        half = _NAN
        if judge_term + rect_term > 0:  # NaN (one label) fails this too
            # Welch-Satterthwaite: the degrees of freedom of the two terms' sum.
            df = (judge_term + rect_term) ** 2 / (
                judge_term**2 / (spread.size - 1) + rect_term**2 / (n - 1)
            )
            half = _t(level, df) * math.sqrt(judge_term + rect_term)
    flag = None
    # A sum's rounding (0.9 + 0.1) is not an estimate outside the range.
    if not low - _RANGE_SLACK <= theta <= high + _RANGE_SLACK:
        # Clipped, the estimate would sit on the bound with a CI of zero width (all of it
        # outside): certainty where the labels contradict the judge.
        flag = (
            f"outside the metric's range [{low:g}, {high:g}]: not a possible mean (too few "
            "labels, or the labelled items unlike the rest)"
        )
        ci_low, ci_high = theta - half, theta + half
    else:
        theta, ci_low, ci_high = clip(theta), clip(theta - half), clip(theta + half)
    return PPIEstimate(
        metric=metric,
        mean=theta,
        ci_low=ci_low,
        ci_high=ci_high,
        judge_mean=judge_mean,
        human_mean=human_mean,
        # The labels lie in the range (refused otherwise): so do their mean and its CI's
        # middle, and the clipped CI keeps a width.
        human_ci_low=clip(human_mean - human_half),
        human_ci_high=clip(human_mean + human_half),
        n_judged=big_n,
        n_labeled=n,
        flag=flag,
    )


# --------------------------------------------------------------------------- labels


@dataclass(frozen=True)
class Label:
    """One human value of one metric for one item.

    Attributes:
        item_id: The evaluated item (golden query id).
        metric: Metric name.
        value: The human's value, in [-1, 1].
    """

    item_id: str
    metric: str
    value: float


def _label(raw: Mapping[str, Any], where: str, fix_key: str) -> Label:
    fields: dict[str, str] = {}
    for key in ("item_id", "metric"):
        text = "" if raw.get(key) is None else str(raw[key]).strip()
        if not text:
            raise ConfigError(f"{where}: '{key}' is missing; {fix_key}")
        fields[key] = text
    value = raw.get("value")
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ConfigError(f"{where}: 'value' is missing; {fix_key}")
    try:
        if isinstance(value, bool):
            raise TypeError
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{where}: value {value!r} is not a number; write a number such as 0.5"
        ) from exc
    low, high = LABEL_RANGE
    if not low <= number <= high:
        raise ConfigError(
            f"{where}: value {value!r} is outside [{low:g}, {high:g}]; metric values are "
            "shares in [0, 1] (answer relevancy, a cosine, may go down to -1)"
        )
    return Label(fields["item_id"], fields["metric"], number)


def _csv_labels(path: Path) -> list[tuple[str, Label]]:
    fix = f"give every row {','.join(LABEL_FIELDS)}"
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.DictReader(fh)
        header = [name.strip() for name in reader.fieldnames or []]
        missing = [name for name in LABEL_FIELDS if name not in header]
        if missing:
            raise ConfigError(
                f"labels file {path}: row 1 (header) lacks column {missing[0]!r}; start the "
                f"file with the header line `{','.join(LABEL_FIELDS)}`"
            )
        reader.fieldnames = header
        out = []
        for row_no, row in enumerate(reader, start=1):
            where = f"row {row_no} (line {reader.line_num})"
            out.append((where, _label(row, f"labels file {path}: {where}", fix)))
    return out


def _structured_labels(path: Path) -> list[tuple[str, Label]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"labels file {path} cannot be parsed: {exc}") from exc
    else:
        data = yamlio.load(text, f"labels file {path}", yamlio.DATA_LIMIT)
    if isinstance(data, Mapping) and "labels" in data:
        data = data["labels"]
    if not isinstance(data, list):
        raise ConfigError(
            f"labels file {path}: expected a list of {{item_id, metric, value}} mappings (or a "
            "mapping with key 'labels' holding that list)"
        )
    fix = f"give every entry the keys {', '.join(LABEL_FIELDS)}"
    out = []
    for entry_no, raw in enumerate(data, start=1):
        where = f"entry {entry_no}"
        if not isinstance(raw, Mapping):
            raise ConfigError(
                f"labels file {path}: {where}: expected a mapping, got {raw!r}; {fix}"
            )
        out.append((where, _label(raw, f"labels file {path}: {where}", fix)))
    return out


def load_labels(path: Path) -> list[Label]:
    """Load human labels from a CSV, YAML or JSON file.

    CSV has the header ``item_id,metric,value`` (extra columns, e.g. a note, are
    ignored); YAML/JSON hold a list of ``{item_id, metric, value}`` mappings, or a
    mapping whose key ``labels`` holds that list.

    Args:
        path: The labels file (``.csv``, ``.yaml``, ``.yml`` or ``.json``).

    Returns:
        The labels in file order.

    Raises:
        ConfigError: Naming the file, the row or entry, and the fix, when the file is
            missing or unparsable, its extension unknown, a column or key missing, a
            value not a number or outside [-1, 1], an (item_id, metric) repeated, or
            the file holds no label.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in LABEL_SUFFIXES:
        raise ConfigError(
            f"labels file {path}: unknown extension {path.suffix!r}; use one of "
            f"{', '.join(LABEL_SUFFIXES)}"
        )
    if not path.is_file():
        raise ConfigError(f"labels file {path} not found; fix the path or write the file")
    located = _csv_labels(path) if suffix == ".csv" else _structured_labels(path)
    if not located:
        raise ConfigError(
            f"labels file {path} holds no labels; add {', '.join(LABEL_FIELDS)} rows or entries"
        )
    first: dict[tuple[str, str], str] = {}
    for where, label in located:
        key = (label.item_id, label.metric)
        if key in first:
            raise ConfigError(
                f"labels file {path}: {where} repeats item_id {label.item_id!r} with metric "
                f"{label.metric!r} from {first[key]}; keep one label per item and metric"
            )
        first[key] = where
    return [label for _, label in located]


def labels_by_metric(labels: Sequence[Label]) -> dict[str, dict[str, float]]:
    """Group labels as metric -> item_id -> value (the shape :func:`ppi_mean` takes).

    Args:
        labels: Labels, e.g. from :func:`load_labels`.

    Returns:
        metric -> item_id -> value.

    Raises:
        ConfigError: When an (item_id, metric) appears twice.
    """
    out: dict[str, dict[str, float]] = {}
    for label in labels:
        per_item = out.setdefault(label.metric, {})
        if label.item_id in per_item:
            raise ConfigError(
                f"two labels for item {label.item_id!r} and metric {label.metric!r}; keep one"
            )
        per_item[label.item_id] = label.value
    return out
