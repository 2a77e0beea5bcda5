"""Token buckets and slot leases (uploads, generations) in the database, so that every API replica shares them.

A bucket is one row per (account, bucket name), refilled and debited by one atomic upsert
(`INSERT ... ON CONFLICT DO UPDATE ... RETURNING`, one round trip on PostgreSQL and on SQLite >= 3.35)
computed on the database's clock: concurrent requests on any replica queue on the row lock
(PostgreSQL) or the write lock (SQLite, BEGIN IMMEDIATE), and replicas' clocks never enter the sum.

A slot is a row with a lease and a kind ("upload": a body being received; "generation": an online chat
completion being generated): its holder renews it while the work runs and deletes it when the work
ends; a replica that crashed stops renewing, and its slots count no more once they lapse. Each kind
is counted against its own cap.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, Float, TextClause, cast, delete, func, select, text, update
from sqlalchemy.orm import Session

from storage.models import UploadSlot

_UNIX_EPOCH_JULIAN_DAY = 2440587.5
# One statement, written out as text: building it as an expression tree cost more per request than
# the database's work. `now` is the database's clock (clock_timestamp, not now(): an upsert that
# waited on the row lock counts from when it got it). A refused request stores the refill alone.
_TAKE = """
INSERT INTO rate_buckets (account_id, bucket, tokens, updated_at, allowed)
VALUES (:account_id, :bucket, :burst - 1.0, {now}, {true})
ON CONFLICT (account_id, bucket) DO UPDATE SET
    tokens = CASE WHEN {refilled} >= 1 THEN {refilled} - 1 ELSE {refilled} END,
    allowed = {refilled} >= 1,
    updated_at = {now}
RETURNING allowed, tokens{returning}
"""
_REFILLED = "{least}(:burst, rate_buckets.tokens + {greatest}(0.0, {now} - rate_buckets.updated_at) * :rate)"
_DIALECTS = {
    "postgresql": dict(now="CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)", least="LEAST",
                       greatest="GREATEST", true="TRUE",
                       # No WAL flush to wait for at commit: a crash loses at most the last moments of
                       # counts, which is harmless, and the request skips a disk sync.
                       returning=", set_config('synchronous_commit', 'off', true)"),
    "sqlite": dict(now=f"((julianday('now') - {_UNIX_EPOCH_JULIAN_DAY}) * 86400.0)", least="MIN", greatest="MAX",
                   true="1", returning=""),
}


def _take_statement(dialect: str) -> TextClause:
    parts = _DIALECTS[dialect]
    refilled = _REFILLED.format(**parts)
    return text(_TAKE.format(refilled=refilled, **parts))


_TAKE_STATEMENTS = {dialect: _take_statement(dialect) for dialect in _DIALECTS}


def db_now(session: Session) -> ColumnElement[float]:
    """Seconds since the epoch on the database's clock, evaluated where the statement runs."""
    if session.get_bind().dialect.name == "postgresql":
        return cast(func.extract("epoch", func.clock_timestamp()), Float)
    return (func.julianday("now") - _UNIX_EPOCH_JULIAN_DAY) * 86400.0


def take_token(session: Session, account_id: str, bucket: str, *, rate: float, burst: int) -> float:
    """Take one token from the account's bucket: 0.0 if taken, else the seconds until one is there.

    A refused request takes nothing, so a client that waits the answer's time gets through."""
    statement = _TAKE_STATEMENTS[session.get_bind().dialect.name]
    row = session.execute(statement, {"account_id": account_id, "bucket": bucket, "rate": float(rate),
                                      "burst": float(burst)}).one()
    allowed, tokens = row[0], row[1]
    return 0.0 if allowed else (1.0 - tokens) / rate


def acquire_slot(session: Session, account_id: str, holder: str, *, kind: str, cap: int, lease_s: float) -> int:
    """Take one of the account's `cap` slots of `kind` for `holder`; returns the slots of that kind in
    use before. The caller holds the account's lock, so that concurrent acquires count one after
    another; the count is at most `cap` - 1 if the slot was taken, else `cap` or more."""
    now = db_now(session)
    session.execute(delete(UploadSlot).where(UploadSlot.account_id == account_id, UploadSlot.expires_at < now))
    in_use = session.scalar(select(func.count()).select_from(UploadSlot).where(
        UploadSlot.account_id == account_id, UploadSlot.kind == kind))
    if in_use < cap:
        session.execute(UploadSlot.__table__.insert().values(holder=holder, account_id=account_id, kind=kind,
                                                             expires_at=now + lease_s))
    return in_use


def renew_slot(session: Session, holder: str, *, lease_s: float) -> bool:
    """Extend the holder's lease; False if it had lapsed and was taken over (the work then runs uncounted)."""
    result = session.execute(
        update(UploadSlot).where(UploadSlot.holder == holder).values(expires_at=db_now(session) + lease_s)
    )
    return result.rowcount == 1


def release_slot(session: Session, holder: str) -> None:
    session.execute(delete(UploadSlot).where(UploadSlot.holder == holder))
