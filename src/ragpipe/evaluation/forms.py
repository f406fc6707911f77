"""The few settings a team changes per evaluation run, typed for forms.

The Prefect deployments of the eval flows take these fields instead of the
whole configuration (about 120 fields). The configuration file is the base
(``config_path``, else ``ragpipe.yaml`` in the working directory); an empty
field keeps the configured value. Precedence, later winning: built-in
defaults, the file, ``RAGPIPE_*`` environment variables, the form. The CLI
applies its options the same way (``load_config``'s overrides).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, NonNegativeFloat, PositiveInt

from ragpipe.config import FusionMethod, RagpipeConfig, RetrievalMode, load_config


def refuse_bool(value: Any) -> Any:
    """``true`` where a number goes is a slip, not 1 (pydantic reads a boolean as a
    number), as in the configuration (``config._Section``)."""
    if isinstance(value, bool):
        raise ValueError(f"write a number, not {str(value).lower()}")
    return value


_NUMBER = BeforeValidator(refuse_bool)
# The number types of the forms (a flow's parameters, a compare variant's fields).
Alpha = Annotated[float, Field(ge=0, le=1), _NUMBER]
Weight = Annotated[NonNegativeFloat, _NUMBER]
Count = Annotated[PositiveInt, _NUMBER]
Number = Annotated[float, _NUMBER]

Granularity = Literal["chunk", "file"]

# The retrieval metrics a gate or the tuner can use (kept equal to metrics.METRICS by a test).
MetricName = Literal[
    "recall@5", "recall@10", "precision@5", "mrr", "success@5", "hit@3", "map", "ndcg@10",
    "ndcg@10_exp",
]  # fmt: skip

# Form field -> the configuration field it overrides.
FORM_FIELDS: dict[str, tuple[str, str]] = {
    "golden": ("eval", "golden"),
    "granularity": ("eval", "granularity"),
    "depth": ("eval", "depth"),
    "limit": ("eval", "rag_limit"),
    "sample": ("eval", "rag_sample"),
    "skip_unmatched": ("eval", "skip_unmatched"),
    "labels": ("eval", "labels"),
    "mode": ("retrieve", "mode"),
    "fusion_method": ("retrieve", "fusion_method"),
    "alpha": ("retrieve", "alpha"),
    "dense_weight": ("retrieve", "dense_weight"),
    "sparse_weight": ("retrieve", "sparse_weight"),
    "top_k": ("retrieve", "top_k"),
    "rerank": ("retrieve", "rerank"),
    "mmr": ("retrieve", "mmr"),
}


def form_overrides(values: Mapping[str, Any]) -> dict[str, Any]:
    """The nested configuration overrides of a form's filled-in fields (None = keep)."""
    overrides: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        if value is None:
            continue
        section, field = FORM_FIELDS[name]
        overrides.setdefault(section, {})[field] = value
    return overrides


# Where a flow's values come from, in its errors (not the CLI's flags: a form has none).
RUN_PARAMETERS = "the run's parameters"
CONFIG_PATH_FIX = (
    "set config_path (the run's parameters) to an existing file, or leave it empty for "
    "ragpipe.yaml in the worker's directory"
)


def run_config(config_path: str | None) -> RagpipeConfig:
    """The configuration a flow's ``config_path`` names (empty: ragpipe.yaml in the working
    directory, else the defaults), with the ``RAGPIPE_*`` environment.

    Raises:
        ConfigError: The file is missing or invalid; the message names config_path.
    """
    path = Path(config_path) if config_path else None
    return load_config(path, overrides_from=RUN_PARAMETERS, missing_fix=CONFIG_PATH_FIX)


def form_config(config_path: str | None, values: Mapping[str, Any]) -> RagpipeConfig:
    """The configuration of a form: file (or ragpipe.yaml), environment, then the form.

    Raises:
        ConfigError: The file is missing or invalid, or a form value is out of range;
            the message names the field.
    """
    path = Path(config_path) if config_path else None
    return load_config(path, form_overrides(values), RUN_PARAMETERS, CONFIG_PATH_FIX)


class VariantForm(BaseModel):
    """One retrieval setting to compare; empty fields keep the configured value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$",
        description="Column name in the report, e.g. dense or hybrid-rrf.",
    )
    mode: RetrievalMode | None = Field(default=None, description="dense, sparse or hybrid.")
    fusion_method: FusionMethod | None = Field(
        default=None, description="How hybrid fuses its two lists."
    )
    alpha: Alpha | None = Field(default=None, description="Dense share of a convex fusion (0..1).")
    dense_weight: Weight | None = Field(
        default=None, description="Weight of the dense list in rrf/dbsf fusion."
    )
    sparse_weight: Weight | None = Field(
        default=None, description="Weight of the BM25 list in rrf/dbsf fusion."
    )
    rerank: bool | None = Field(
        default=None, description="Rerank with retrieve.reranker (a cross-encoder, or llm)."
    )
    mmr: bool | None = Field(default=None, description="Diversify the final list with MMR.")

    def overrides(self) -> dict[str, Any]:
        """``retrieve.*`` overrides of this variant."""
        return {
            k: v for k, v in self.model_dump(exclude={"name"}).items() if v is not None
        }  # fmt: skip


CURRENT = VariantForm(name="current")


def form_defaults(config: RagpipeConfig, names: Iterable[str]) -> dict[str, Any]:
    """The configured value of each form field in ``names`` (JSON-ready; fields the
    configuration leaves unset, None, are left out): what a deployment's form shows."""
    dumped = config.model_dump(mode="json")
    values = {}
    for name in names:
        if name not in FORM_FIELDS:
            continue
        section, field = FORM_FIELDS[name]
        value = dumped[section][field]
        if value is not None:
            values[name] = value
    return values


def golden_choices(base: Path, configured: Path) -> list[str]:
    """The golden sets a form offers: every ``eval/golden/**/*.yaml`` under ``base`` (paths
    relative to it, as a worker running there reads them) and the configured one."""
    found = sorted(
        p.relative_to(base).as_posix()
        for pattern in ("*.yaml", "*.yml")
        for p in (base / "eval" / "golden").rglob(pattern)
        if p.is_file()
    )
    own = configured.as_posix()
    return found if own in found else [own, *found]
