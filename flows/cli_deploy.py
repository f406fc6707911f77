"""`ragpipe deploy`: register prefect.yaml's deployments with forms that show what runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from flows.cli_common import ConfigOption, fail
from ragpipe.config import load_config
from ragpipe.errors import ConfigError, RagpipeError


def deploy(
    config: ConfigOption = None,
    prefect_file: Annotated[
        Path, typer.Option(help="The deployments to register (prefect.yaml).")
    ] = Path("prefect.yaml"),
    register: Annotated[
        bool,
        typer.Option(
            help="Run `prefect deploy --all` first; --no-register only fills in the forms of "
            "deployments already registered."
        ),
    ] = True,
    notify: Annotated[
        str | None,
        typer.Option(
            metavar="BLOCK_TYPE/NAME",
            help="Also install the automations that send a message through this notification "
            "block (e.g. slack-webhook/ops) when the index gate holds a version "
            "(ragpipe.index.held) and when an eval-compare gate fails "
            "(ragpipe.eval.gate-failed). Deploying again replaces them.",
        ),
    ] = None,
) -> None:
    """Register the deployments, then fill their forms from this configuration.

    Each deployment's form then shows the values that will run: config_path is this file
    (absolute), and every form field (golden set, mode, fusion, depth, ...) its configured
    value; `golden` offers the sets found under eval/golden/. Values written in
    prefect.yaml's `parameters` stay as they are. Run it again after changing ragpipe.yaml:
    the forms hold the values of the last deploy. Needs PREFECT_API_URL (a Prefect server).
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.flows import load_flow_from_entrypoint

    from ragpipe.evaluation.forms import form_defaults, golden_choices
    from ragpipe.yamlio import CONFIG_LIMIT, load

    try:
        path = (config or Path("ragpipe.yaml")).resolve()
        if not path.is_file():
            raise ConfigError(f"--config {path}: no such file (the forms are filled from it)")
        cfg = load_config(path)
        spec = load(prefect_file.read_text(encoding="utf-8"), str(prefect_file), CONFIG_LIMIT) or {}
    except (RagpipeError, OSError) as exc:
        fail(exc, 2)
    if register:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "prefect"), "--no-prompt", "deploy", "--all",
             "--prefect-file", str(prefect_file)],
            env={**os.environ, "RAGPIPE_HOME": os.environ.get("RAGPIPE_HOME", os.getcwd())},
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise typer.Exit(done.returncode)
    choices = golden_choices(Path.cwd(), cfg.eval.golden)
    filled = []
    with get_client(sync_client=True) as client:
        for entry in spec.get("deployments") or []:
            flow: Any = load_flow_from_entrypoint(entry["entrypoint"])
            name = f"{flow.name}/{entry['name']}"
            try:
                deployment = client.read_deployment_by_name(name)
            except Exception as exc:  # ObjectNotFound: not registered
                fail(ConfigError(f"deployment {name} is not registered ({exc}): run without "
                                 "--no-register"), 2)  # fmt: skip
            fields = set(flow.parameters.properties)
            written = {k: v for k, v in (entry.get("parameters") or {}).items() if v is not None}
            parameters = {**form_defaults(cfg, fields), **written}
            if "config_path" in fields:
                parameters["config_path"] = str(path)
            schema = _with_choices(deployment.parameter_openapi_schema or {}, choices)
            client.update_deployment(
                deployment.id,
                DeploymentUpdate(parameters=parameters, parameter_openapi_schema=schema),
            )
            filled.append(f"{name}: " + json.dumps({k: parameters[k] for k in sorted(parameters)
                                                    if k != "variants"}))  # fmt: skip
    print(f"forms filled from {path}:")
    for line in filled:
        print(f"  {line}")
    if notify:
        from flows.automations import install_notifications

        try:
            installed = install_notifications(cfg, notify)
        except RagpipeError as exc:
            fail(exc, 2)
        print("automations installed: " + "; ".join(installed))


def _with_choices(schema: dict[str, Any], choices: list[str]) -> dict[str, Any]:
    """The form's schema with ``golden`` offering ``choices`` (or left empty: None)."""
    properties = dict(schema.get("properties") or {})
    if "golden" in properties:
        golden = dict(properties["golden"])
        golden.pop("type", None)
        golden["anyOf"] = [{"type": "string", "enum": choices}, {"type": "null"}]
        properties["golden"] = golden
    return {**schema, "properties": properties}
