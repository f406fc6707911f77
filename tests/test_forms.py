"""The eval deployments' small typed forms and the configuration precedence they share
with the CLI: form (or CLI option) > RAGPIPE_* environment > config file > defaults."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
from prefect.utilities.callables import parameter_schema_from_entrypoint
from pydantic import ValidationError

from ragpipe.config import RetrievalMode, load_config
from ragpipe.errors import ConfigError
from ragpipe.evaluation.forms import MetricName, VariantForm, form_config
from ragpipe.evaluation.metrics import METRICS

FLOWS = ("eval.py:eval_retrieval_flow", "eval.py:eval_rag_flow", "eval.py:eval_compare_flow",
         "eval.py:eval_tune_flow", "ingest.py:reindex_flow")  # fmt: skip


def test_precedence_form_then_environment_then_file_then_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("retrieve:\n  mode: sparse\n  top_k: 4\neval:\n  depth: 12\n")
    monkeypatch.setenv("RAGPIPE_RETRIEVE__TOP_K", "6")
    monkeypatch.setenv("RAGPIPE_EVAL__DEPTH", "15")
    cfg = form_config(str(path), {"depth": 20, "mode": None})
    assert cfg.eval.depth == 20  # the form beats the environment
    assert cfg.retrieve.top_k == 6  # the environment beats the file
    assert cfg.retrieve.mode is RetrievalMode.SPARSE  # an empty field keeps the file's value
    assert cfg.retrieve.rrf_k == 60  # nothing set: the default
    # The CLI's options are the same kind of overrides.
    assert load_config(path, {"retrieve": {"top_k": 9}}).retrieve.top_k == 9
    # Overriding one field of a section keeps the section's other values from below.
    assert load_config(path, {"retrieve": {"rrf_k": 10}}).retrieve.top_k == 6


def test_a_bad_form_value_is_named_as_the_forms(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        form_config(None, {"depth": 0})
    message = str(err.value)
    assert message.startswith("invalid configuration (from the run's parameters):")
    assert "eval.depth: Input should be greater than or equal to 10 (got 0)" in message
    assert "RAGPIPE_" not in message  # the fix is in the form, not the environment
    with pytest.raises(ConfigError, match=r"config file .*nope\.yaml not found"):
        form_config(str(tmp_path / "nope.yaml"), {})


def test_a_flows_bad_parameter_is_named_as_the_runs_not_as_a_flag(tmp_path: Path) -> None:
    """A form's config_path that does not exist said "pass an existing --config file", a
    form's roots "(from the command line)": a form has no flags."""
    from flows.eval import eval_retrieval_flow
    from flows.index import promote_index_flow
    from flows.ingest import ingest_flow, reindex_flow

    missing = str(tmp_path / "nope.yaml")
    for run in (lambda: reindex_flow.fn(config_path=missing),
                lambda: promote_index_flow.fn("0123abcd", config_path=missing),
                lambda: eval_retrieval_flow.fn(config_path=missing)):  # fmt: skip
        with pytest.raises(ConfigError) as err:
            run()
        assert str(err.value) == (
            f"config file {missing} not found; set config_path (the run's parameters) to an "
            "existing file, or leave it empty for ragpipe.yaml in the worker's directory"
        )
    with pytest.raises(ConfigError) as err:
        ingest_flow.fn(config=load_config(None), roots=["ftp://example.org/docs"])
    assert str(err.value).startswith(
        "invalid configuration (from the run's parameters: roots):\n  discover.urls: "
        "'ftp://example.org/docs' is not an http(s) URL"
    )
    # The CLI's own words stay its own.
    with pytest.raises(ConfigError, match=r"not found; pass an existing --config file$"):
        load_config(Path(missing))


def test_metric_choices_are_the_metrics() -> None:
    assert typing.get_args(MetricName) == METRICS


def test_variant_form_is_typed() -> None:
    variant = VariantForm(name="rrf-2", mode=RetrievalMode.HYBRID, dense_weight=2.0)
    assert variant.overrides() == {"mode": RetrievalMode.HYBRID, "dense_weight": 2.0}
    for bad in ({"name": "a b"}, {"name": "x", "dense_weight": -1},
                {"name": "x", "alpha": 1.5}, {"name": "x", "top_k": 3}):  # fmt: skip
        with pytest.raises(ValidationError):
            VariantForm.model_validate(bad)
    # A form's true is no 1.0 (it was read as alpha 1.0, dense_weight 0.0 for false).
    for bad in ({"name": "x", "alpha": True}, {"name": "x", "dense_weight": False}):
        with pytest.raises(ValidationError, match="write a number, not"):
            VariantForm.model_validate(bad)


@pytest.mark.parametrize(
    ("entrypoint", "field", "value"),
    [("eval_retrieval_flow", "dense_weight", False), ("eval_retrieval_flow", "alpha", True),
     ("eval_retrieval_flow", "sparse_weight", True), ("eval_retrieval_flow", "depth", True),
     ("eval_rag_flow", "sample", True), ("eval_rag_flow", "top_k", True),
     ("eval_rag_flow", "dense_weight", False), ("eval_compare_flow", "gate_threshold", False),
     ("eval_tune_flow", "share", True), ("reindex_flow", "batch_size", True)],
)  # fmt: skip
def test_a_flows_true_or_false_where_a_number_goes_is_refused(
    entrypoint: str, field: str, value: bool
) -> None:
    """A Python call's (or an API run's) parameters: eval_retrieval_flow(dense_weight=False,
    mode='hybrid') ran with dense_weight 0.0 and alpha=True as 1.0 (only a compare
    variant's fields refused them)."""
    import flows.eval
    import flows.ingest

    flow = getattr(flows.eval, entrypoint, None) or getattr(flows.ingest, entrypoint)
    given: dict[str, object] = {field: value}
    if entrypoint in ("eval_retrieval_flow", "eval_rag_flow"):
        given["mode"] = "hybrid"
    if entrypoint == "eval_compare_flow":
        given["variants"] = [{"name": "dense", "mode": "dense"}]
    with pytest.raises(Exception, match=f"write a number, not {str(value).lower()}") as err:
        flow.validate_parameters(given)
    assert type(err.value).__name__ == "ParameterTypeError"
    assert field in str(err.value)
    # A number still passes, an int for a float too.
    number = {"sample": 3, "top_k": 3, "depth": 12, "share": 0.5, "batch_size": 2}.get(field, 1)
    assert flow.validate_parameters({**given, field: number})[field] == number


@pytest.mark.parametrize("flow", FLOWS)
def test_deployed_forms_are_small_and_described(flow: str) -> None:
    """What `prefect deploy` registers: at most 12 fields, each with a description that
    renders as plain text, no nested whole configuration."""
    schema = parameter_schema_from_entrypoint(f"flows/{flow}").model_dump()
    fields = schema["properties"]
    assert 0 < len(fields) <= 12, list(fields)
    for name, spec in fields.items():
        assert spec.get("description"), name
        assert "**" not in spec["description"] and "``" not in spec["description"], name
    assert "config" not in fields and "RagpipeConfig" not in schema.get("definitions", {})
    assert "config_path" in fields


def test_choices_in_the_forms() -> None:
    compare = parameter_schema_from_entrypoint("flows/eval.py:eval_compare_flow").model_dump()
    fields, definitions = compare["properties"], compare["definitions"]
    assert fields["gate_metric"]["anyOf"][0]["enum"] == list(METRICS)
    assert fields["granularity"]["anyOf"][0]["enum"] == ["chunk", "file"]
    assert fields["variants"]["type"] == "array"  # ordered, unlike a mapping
    assert fields["baseline"]["default"]["name"] == "current"
    assert definitions["RetrievalMode"]["enum"] == ["dense", "sparse", "hybrid"]


def test_form_defaults_and_golden_choices(tmp_path: Path) -> None:
    from flows.cli_deploy import _with_choices
    from ragpipe.evaluation.forms import form_defaults, golden_choices

    cfg = load_config(None, {"eval": {"golden": "eval/golden/b.yaml", "depth": 17},
                             "retrieve": {"mode": "dense"}})  # fmt: skip
    shown = form_defaults(cfg, ["golden", "depth", "mode", "sample", "config_path"])
    assert shown == {"golden": "eval/golden/b.yaml", "depth": 17, "mode": "dense"}  # sample None
    (tmp_path / "eval" / "golden" / "team").mkdir(parents=True)
    for name in ("b.yaml", "a.yml", "team/c.yaml", "notes.txt"):
        (tmp_path / "eval" / "golden" / name).write_text("x", encoding="utf-8")
    found = ["eval/golden/a.yml", "eval/golden/b.yaml", "eval/golden/team/c.yaml"]
    assert golden_choices(tmp_path, Path("eval/golden/b.yaml")) == found
    assert golden_choices(tmp_path, Path("/srv/g.yaml")) == ["/srv/g.yaml", *found]
    schema = {"properties": {"golden": {"title": "Golden", "anyOf": [{"type": "string"},
                                                                      {"type": "null"}]},
                             "depth": {"type": "integer"}}}  # fmt: skip
    offered = _with_choices(schema, found)["properties"]
    assert offered["golden"]["anyOf"] == [{"type": "string", "enum": found}, {"type": "null"}]
    assert offered["golden"]["title"] == "Golden" and offered["depth"] == {"type": "integer"}
