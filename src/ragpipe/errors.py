"""Exception hierarchy: every error names the bad value and the fix."""


class RagpipeError(Exception):
    """Base class for all ragpipe errors."""


class ConfigError(RagpipeError):
    """The configuration is invalid; the message names the field and the fix."""


class InputError(RagpipeError):
    """One input (a file, a document) cannot be processed.

    Attributes:
        category: Short machine-readable reason, e.g. ``"encrypted"``.
    """

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


class StageError(RagpipeError):
    """A pipeline stage cannot run at all (missing models, broken checkpoint)."""


class DiskFull(StageError):
    """A write failed for lack of space (ENOSPC/EDQUOT): the run stops at once."""


class MassDeletionHeld(RagpipeError):
    """More indexed files vanished than ``index.max_delete_share`` allows; none were deleted."""


class IndexHeld(RagpipeError):
    """The index gate kept a new version from readers (the live one keeps serving)."""


class GateFailed(RagpipeError):
    """An evaluation's regression gate failed (the report was written first)."""
