"""The user guide's reference pages are generated from the code: every configuration
field and every command is in them; every YAML block of the guide parses."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_the_references_list_every_config_field_and_every_command() -> None:
    from flows.cli_reference import all_commands, cli_reference
    from ragpipe.reference import all_fields, config_reference

    config = config_reference()
    fields = all_fields()
    # One table row per field, under a heading of its section (nested models: their own).
    rows = re.findall(r"^\| `([a-z_0-9]+)` \|", config, re.M)
    assert len(rows) == len(fields) > 150
    assert sorted(rows) == sorted(f.rsplit(".", 1)[1] for f in fields)
    assert "| `top_k` | int | `5` |" in config  # retrieve.top_k, its type and default
    assert "### `index.gate`" in config and "### `eval.judge`" in config
    cli = cli_reference()
    for command in all_commands():
        assert f"`{command}`" in cli
    assert {"ragpipe init", "ragpipe inspect files", "ragpipe eval retrieval"} <= set(
        all_commands()
    )
    assert "| `--format` | `text` \\| `json` \\| `xml` |" in cli  # search's output choices


def test_every_yaml_block_in_the_docs_parses() -> None:
    """Nothing read the pages' YAML blocks but the tutorial's golden set (test_tutorial):
    golden-format.md showed `{file: ..., heading: How do I upgrade the client?}`, which YAML
    refuses (a `?` in a flow mapping), as a draft item to copy."""
    pages = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
    blocks = 0
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for found in re.finditer(r"^( *)```ya?ml\n(.*?)^\1```", text, re.M | re.S):
            where = f"{page.relative_to(ROOT)}:{text[: found.start()].count(chr(10)) + 1}"
            try:
                yaml.safe_load(textwrap.dedent(found.group(2)))
            except yaml.YAMLError as exc:
                raise AssertionError(f"{where}: the YAML block does not parse: {exc}") from None
            blocks += 1
    assert blocks >= 18  # the pattern still finds the guide's blocks


def test_every_deployment_the_docs_run_is_one_a_prefect_yaml_registers() -> None:
    """deployments.md ran 'ingest/reindex-now' from a `ragpipe init` folder, whose
    deployments are named after the folder (ingest/my-project-reindex-now)."""
    from prefect.flows import load_flow_from_entrypoint

    from ragpipe.scaffold import PREFECT_TEMPLATE

    checkout = yaml.safe_load((ROOT / "prefect.yaml").read_text(encoding="utf-8"))
    ours = {f"{load_flow_from_entrypoint(d['entrypoint']).name}/{d['name']}"
            for d in checkout["deployments"]}  # fmt: skip
    project = set()
    for suffix, entrypoint in re.findall(
        r"- name: \{project\}-(\S+)\n(?:.*\n)*?    entrypoint: (\S+)", PREFECT_TEMPLATE
    ):
        project.add(f"{load_flow_from_entrypoint(entrypoint).name}/my-project-{suffix}")
    assert "ingest/my-project-reindex-now" in project and "ingest/reindex-now" in ours
    pages = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
    for page in pages:
        for block in re.findall(r"^```bash\n(.*?)^```", page.read_text("utf-8"), re.M | re.S):
            # A block that registers with `ragpipe deploy` is in a project folder.
            known = project if "ragpipe deploy" in block else ours | project
            for run in re.findall(r"deployment run '([^']+)'", block):
                assert run in known, f"{page.relative_to(ROOT)}: {run}"
