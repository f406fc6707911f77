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
    prefect.yaml's `parameters` stay as they are. A trigger on ragpipe's index events
    (eval-retrieval's, on ragpipe.index.promoted) is pointed at this configuration's index,
    whatever resource id prefect.yaml gave it. Run it again after changing ragpipe.yaml:
    the forms and the triggers hold the values of the last deploy. Needs PREFECT_API_URL (a
    Prefect server).
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.flows import load_flow_from_entrypoint

    from ragpipe.evaluation.forms import form_defaults, golden_choices
    from ragpipe.locking import index_resource_id
    from ragpipe.yamlio import CONFIG_LIMIT, load

    try:
        path = (config or Path("ragpipe.yaml")).resolve()
        if not path.is_file():
            raise ConfigError(f"--config {path}: no such file (the forms are filled from it)")
        cfg = load_config(path)
        spec = load(prefect_file.read_text(encoding="utf-8"), str(prefect_file), CONFIG_LIMIT) or {}
    except (RagpipeError, OSError) as exc:
        fail(exc, 2)
    resource = index_resource_id(cfg)
    if register:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "prefect"), "--no-prompt", "deploy", "--all",
             "--prefect-file", str(prefect_file)],
            # Without RAGPIPE_HOME: Prefect would write its value of now into the pull step
            # ({{ $RAGPIPE_HOME }}), which each worker fills from its own environment.
            env={**{k: v for k, v in os.environ.items() if k != "RAGPIPE_HOME"},
                 "RAGPIPE_INDEX_ID": resource},  # the checkout's trigger: this index
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise typer.Exit(done.returncode)
    choices = golden_choices(Path.cwd(), cfg.eval.golden)
    filled = []
    retargeted = []
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
            for old in _retarget_triggers(client, deployment.id, resource):
                retargeted.append(f"{name}: {old} -> {resource}")
    print(f"forms filled from {path}:")
    for line in filled:
        print(f"  {line}")
    if retargeted:
        print(f"triggers now on this configuration's index ({resource}):")
        for line in retargeted:
            print(f"  {line}")
    if notify:
        from flows.automations import install_notifications

        try:
            installed = install_notifications(cfg, notify)
        except RagpipeError as exc:
            fail(exc, 2)
        print("automations installed: " + "; ".join(installed))


# A trigger's resource id that is ragpipe's: an index's, or what the checkout's
# {{ $RAGPIPE_INDEX_ID }} became when `prefect deploy` ran without it (Prefect writes ""
# in a trigger, which matches no event).
_OURS = ("ragpipe.index.", "{{ $RAGPIPE_INDEX_ID }}")


def _retarget_triggers(client: Any, deployment_id: Any, resource: str) -> list[str]:
    """Point the triggers that run the deployment on ragpipe index events at ``resource``;
    returns the resource ids they matched before, one per trigger changed.

    A trigger whose ``prefect.resource.id`` names a ragpipe index (``ragpipe.index.*``
    and the checkout's ``{{ $RAGPIPE_INDEX_ID }}``, or "" where it was unset) is ragpipe's:
    prefect.yaml wrote the id once (``ragpipe init`` computed it from the store of that
    day), and after a change of store.path, backend or collection the index's events carry
    another id, so the trigger would never fire again.
    """
    from prefect.events.schemas.automations import AutomationCore, EventTrigger
    from prefect.events.schemas.events import ResourceSpecification

    changed = []
    for automation in client.read_resource_related_automations(
        f"prefect.deployment.{deployment_id}"
    ):
        trigger = automation.trigger
        if not isinstance(trigger, EventTrigger):
            continue
        spec = trigger.match
        match = dict(spec.root if isinstance(spec, ResourceSpecification) else spec)
        old = match.get("prefect.resource.id")
        ids = [old] if isinstance(old, str) else list(old or [])
        if not ids or not all(i == "" or i.startswith(_OURS) for i in ids) or ids == [resource]:
            continue
        match["prefect.resource.id"] = resource
        core = AutomationCore.model_validate(
            automation.model_dump(exclude={"id", "owner_resource"})
            | {"trigger": trigger.model_copy(update={"match": ResourceSpecification(match)})}
        )
        client.update_automation(automation.id, core)
        changed.append(", ".join(i or '""' for i in ids))
    return changed


def _with_choices(schema: dict[str, Any], choices: list[str]) -> dict[str, Any]:
    """The form's schema with ``golden`` offering ``choices`` (or left empty: None)."""
    properties = dict(schema.get("properties") or {})
    if "golden" in properties:
        golden = dict(properties["golden"])
        golden.pop("type", None)
        golden["anyOf"] = [{"type": "string", "enum": choices}, {"type": "null"}]
        properties["golden"] = golden
    return {**schema, "properties": properties}
