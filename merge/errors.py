"""`MergeError(code, message)`: every way a merge is refused or fails, by the reference's codes.

`REFUSAL_CODES` are the reference's first table (a `POST` answers 400 with them, before any work);
every other code is a failed merge's `error.code`. Messages name files, tensors and settings of
the base or the adapter, never anything from a user's training data.
"""

from __future__ import annotations

REFUSAL_CODES = frozenset(
    {"merge_base_unknown", "merge_base_revision", "merge_licence_unreviewed", "merge_tied_lm_head"}
)


class MergeError(Exception):
    def __init__(self, code: str, message: str):
        # Both in args: Ray pickles a task's exception by its args to re-raise it in the driver.
        super().__init__(code, message)
        self.code = code
        self.message = message

    @property
    def refusal(self) -> bool:
        """True for the first table's codes: answer the POST with 400 instead of failing a merge."""
        return self.code in REFUSAL_CODES

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


class MergeStopped(Exception):
    """The merge's worker stopped it (its lease was lost, or the worker is shutting down): nothing is
    recorded and what it wrote is left to whoever holds the merge now, who writes the same bytes."""
