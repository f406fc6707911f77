"""The user guide's reference pages are generated from the code: every configuration
field and every command is in them."""

from __future__ import annotations

import re


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
