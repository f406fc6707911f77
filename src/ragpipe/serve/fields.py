"""Request fields shared by the HTTP API and the MCP tools, so that both take the same."""

import math
from typing import Any

from pydantic import BeforeValidator


def _json_integer(value: Any) -> Any:
    """A JSON integer, strictly: 3 and 3.0 (the same number in JSON), never true or "3"."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("Input should be a valid integer")
    if isinstance(value, float):
        if not math.isfinite(value):  # NaN, Infinity, or 1e400 (read as infinity)
            raise ValueError(f"Input should be a valid integer, got {value}: not a finite number")
        if not value.is_integer():
            raise ValueError("Input should be a valid integer, got a number with a fraction")
        return int(value)
    return value


JSON_INTEGER = BeforeValidator(_json_integer)  # after the bounds, or the schema loses them
