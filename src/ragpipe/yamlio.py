"""YAML read with a bound on what its anchors and aliases expand to.

PyYAML shares an aliased node instead of copying it, so ``safe_load`` of an
alias bomb (9 levels of 9 aliases: 387 million values in 1 KB) is quick; it is
whatever walks the result afterwards (validation, a golden set's items) that
runs for minutes and takes gigabytes. ``load`` counts the values the document
stands for, every alias reference again, and refuses it past ``limit`` before
anyone walks it.
"""

from __future__ import annotations

from typing import Any

import yaml

from ragpipe.errors import ConfigError

# A real configuration has a few hundred values.
CONFIG_LIMIT = 100_000
# A golden set of 50,000 items with graded targets and reference answers stays under it.
DATA_LIMIT = 5_000_000


def expanded_size(data: Any, limit: int) -> int:
    """Values in ``data`` counting every alias reference again, stopping past ``limit``."""
    count, stack = 0, [data]
    while stack and count <= limit:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


def load(text: str, what: str, limit: int) -> Any:
    """``yaml.safe_load(text)``, refused with a ``ConfigError`` naming ``what`` when it is not
    YAML or expands to more than ``limit`` values."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} is not valid YAML: {exc}") from exc
    if expanded_size(data, limit) > limit:
        raise ConfigError(
            f"{what} expands to more than {limit:,} values through YAML anchors and aliases "
            "(an alias bomb?); write the values out"
        )
    return data
