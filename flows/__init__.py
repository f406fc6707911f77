"""Prefect flows composing ragpipe's tasks, and the ``ragpipe`` CLI."""

from typing import Any

from ragpipe.config import set_secret_reader


def _prefect_secret(name: str) -> str:
    """The value of the Prefect Secret block ``name`` (``*.api_key_block`` fields)."""
    from prefect.blocks.system import Secret

    block: Any = Secret.load(name)  # sync here: a block, not a coroutine
    value = block.get()
    if not isinstance(value, str):
        raise TypeError(f"the block holds a {type(value).__name__}, not a string")
    return value


set_secret_reader(_prefect_secret)
