"""YAML read with a bound on what its anchors and aliases expand to.

PyYAML shares an aliased node instead of copying it, so ``safe_load`` of an
alias bomb (9 levels of 9 aliases: 387 million values in 1 KB) is quick; it is
whatever walks the result afterwards (validation, a golden set's items) that
runs for minutes and takes gigabytes. ``load`` counts the values the document
stands for, every alias reference again, and refuses it past ``limit`` before
anyone walks it.

A key written twice in one mapping is refused too: PyYAML keeps the last one
without a word, so a second ``chunk:`` block silently replaces the first.
Keys brought in by a merge (``<<: *defaults``) may be overridden, as YAML means.
"""

from __future__ import annotations

from typing import Any

import yaml

from ragpipe.errors import ConfigError

# A real configuration has a few hundred values.
CONFIG_LIMIT = 100_000
# A golden set of 50,000 items with graded targets and reference answers stays under it.
DATA_LIMIT = 5_000_000


class DuplicateKey(yaml.YAMLError):
    """A mapping that names one key twice."""


class _Loader(yaml.SafeLoader):
    """``SafeLoader`` that refuses a key written twice in one mapping.

    Checked when a mapping is first flattened (merge keys resolved), on the keys written
    in it: PyYAML pastes merged keys into a node's key list, and a mapping used as a merge
    source is flattened before it is built, so checking later would see an inherited key
    beside the one that overrides it.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._checked: set[int] = set()

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        own: list[yaml.Node] = []
        if id(node) not in self._checked:
            self._checked.add(id(node))
            own = [
                key_node
                for key_node, _ in node.value
                if key_node.tag != "tag:yaml.org,2002:merge"
                and isinstance(key_node, yaml.ScalarNode)
            ]
        super().flatten_mapping(node)  # also makes a bare '=' key a string
        seen: dict[Any, int] = {}
        for key_node in own:
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKey(
                    f"key {key!r} is written twice in one mapping (lines {seen[key]} and "
                    f"{line}); YAML would keep only the second: merge them into one"
                )
            seen[key] = line


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
    YAML, names a key twice in one mapping or expands to more than ``limit`` values."""
    try:
        data = yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader
    except DuplicateKey as exc:
        raise ConfigError(f"{what}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} is not valid YAML: {exc}") from exc
    if expanded_size(data, limit) > limit:
        raise ConfigError(
            f"{what} expands to more than {limit:,} values through YAML anchors and aliases "
            "(an alias bomb?); write the values out"
        )
    return data
