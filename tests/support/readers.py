"""The private copies readers make of a published Edge index."""

from __future__ import annotations

from pathlib import Path

from ragpipe.store import published


def reader_copies(readers: Path) -> set[Path]:
    """The copies under a published index's ``readers/`` directory; each must have its
    owner's record beside it, and no record may outlive its copy."""
    if not readers.exists():
        return set()
    copies = {p for p in readers.iterdir() if p.is_dir()}
    owners = {p for p in readers.iterdir() if p.name.endswith(published.OWNER)}
    assert owners == {c.with_name(c.name + published.OWNER) for c in copies}
    return copies
