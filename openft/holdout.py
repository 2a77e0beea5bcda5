"""The holdout rule shared by the quote (eval_rows, the 10-row minimum) and the trainer."""

from __future__ import annotations

HOLDOUT_DIVISOR, HOLDOUT_MAX = 20, 1000


def holdout_size(rows: int) -> int:
    """Rows held out for eval when a job has no validation file: 5 %, at least 1, at most 1,000."""
    return min(max(rows // HOLDOUT_DIVISOR, 1), HOLDOUT_MAX)
