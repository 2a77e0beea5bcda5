"""The merged-weights quota, in one place: how many merges an account may start, and how many
exports (and bytes of them) it may keep, with the refusal each limit answers.

Where it sits: the API's merge POST (serve_app/services/merges.py) calls `check_admission` under
the account's lock; the merge worker (merge/worker.py) calls `over_quota` once a merge's size is
known, and fails it with the same code.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from merge.errors import MergeError
from openft.errors import RateLimited
from storage import merges as repo

MAX_EXPORTS = 4
MAX_EXPORT_BYTES = 64 * 10**9
DAILY_MERGES = 10
DAY_S = 86400


def _held(exports: int, held: int) -> str:
    return f"Your account already holds {exports} exports ({held / 1e9:.1f} GB)"


def _limit() -> str:
    return f"{MAX_EXPORTS} exports or {MAX_EXPORT_BYTES // 10**9} GB"


def check_admission(session: Session, account_id: str, now: int) -> None:
    """Refuse a merge POST over a limit: one merge queued or running at a time and 10 accepted a UTC
    day (429 limit_exceeded, they clear by waiting), 4 exports or 64 GB held (429
    merge_weights_quota, it clears by deleting one). The caller holds the account's lock."""
    running = repo.count_in_progress(session, account_id)
    if running >= 1:
        raise RateLimited("Your account runs one merge at a time and has one queued or running. Retry when it has "
                          "ended, or DELETE it.", limit=1, current=running)  # fmt: skip
    today = repo.count_created_since(session, account_id, now - now % DAY_S)
    if today >= DAILY_MERGES:
        raise RateLimited(f"Your account can start {DAILY_MERGES} merges a day and has started {today} today. "
                          "Retry after 00:00 UTC.", limit=DAILY_MERGES, current=today)  # fmt: skip
    exports, held = repo.held_exports(session, account_id, now)
    if exports >= MAX_EXPORTS or held >= MAX_EXPORT_BYTES:
        by_count = exports >= MAX_EXPORTS
        raise RateLimited(
            f"{_held(exports, held)}; the limit is {_limit()}. Delete one and POST again.",
            code="merge_weights_quota", limit=MAX_EXPORTS if by_count else MAX_EXPORT_BYTES,
            current=exports if by_count else held,
        )


def over_quota(session: Session, account_id: str, size: int, now: int) -> MergeError | None:
    """A finished merge of `size` bytes that the account cannot keep beside its other exports."""
    exports, held = repo.held_exports(session, account_id, now)
    if exports + 1 > MAX_EXPORTS or held + size > MAX_EXPORT_BYTES:
        return MergeError("merge_weights_quota", f"{_held(exports, held)}; this one ({size / 1e9:.1f} GB) would pass "
                          f"the limit of {_limit()}. Delete one and POST again.")
    return None
