"""Token buckets and upload-slot leases in the database, so that every API replica shares them.

A bucket is one row per (account, bucket name), refilled and debited by one atomic upsert
(`INSERT ... ON CONFLICT DO UPDATE ... RETURNING`, one round trip on PostgreSQL and on SQLite >= 3.35)
computed on the database's clock: concurrent requests on any replica queue on the row lock
(PostgreSQL) or the write lock (SQLite, BEGIN IMMEDIATE), and replicas' clocks never enter the sum.

An upload slot is a row with a lease: its holder renews it while the upload runs and deletes it when
the upload ends; a replica that crashed stops renewing, and its slots count no more once they lapse.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, Float, case, cast, delete, func, literal, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from storage.models import RateBucket, UploadSlot

_UNIX_EPOCH_JULIAN_DAY = 2440587.5


def db_now(session: Session) -> ColumnElement[float]:
    """Seconds since the epoch on the database's clock, evaluated where the statement runs."""
    if session.get_bind().dialect.name == "postgresql":
        # clock_timestamp, not now(): a statement that waited on a row lock sees the time it got it.
        return cast(func.extract("epoch", func.clock_timestamp()), Float)
    return (func.julianday("now") - _UNIX_EPOCH_JULIAN_DAY) * 86400.0


def take_token(session: Session, account_id: str, bucket: str, *, rate: float, burst: int) -> float:
    """Take one token from the account's bucket: 0.0 if taken, else the seconds until one is there.

    A refused request takes nothing, so a client that waits the answer's time gets through."""
    now = db_now(session)
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    table = RateBucket.__table__
    elapsed = now - table.c.updated_at
    refilled = table.c.tokens + case((elapsed > 0, elapsed), else_=0.0) * rate
    refilled = case((refilled > burst, literal(float(burst))), else_=refilled)
    stmt = insert(table).values(account_id=account_id, bucket=bucket, tokens=burst - 1.0, updated_at=now, allowed=True)
    stmt = stmt.on_conflict_do_update(
        index_elements=[table.c.account_id, table.c.bucket],
        set_={
            "tokens": case((refilled >= 1, refilled - 1), else_=refilled),
            "allowed": refilled >= 1,
            "updated_at": now,
        },
    ).returning(table.c.allowed, table.c.tokens)
    allowed, tokens = session.execute(stmt).one()
    return 0.0 if allowed else (1.0 - tokens) / rate


def acquire_upload_slot(session: Session, account_id: str, holder: str, *, cap: int, lease_s: float) -> int:
    """Take one of the account's `cap` upload slots for `holder`; returns the slots in use before.
    The caller holds the account's lock, so that concurrent acquires count one after another;
    the count is at most `cap` - 1 if the slot was taken, else `cap` or more."""
    now = db_now(session)
    session.execute(delete(UploadSlot).where(UploadSlot.account_id == account_id, UploadSlot.expires_at < now))
    in_use = session.scalar(select(func.count()).select_from(UploadSlot).where(UploadSlot.account_id == account_id))
    if in_use < cap:
        session.execute(UploadSlot.__table__.insert().values(holder=holder, account_id=account_id,
                                                             expires_at=now + lease_s))
    return in_use


def renew_upload_slot(session: Session, holder: str, *, lease_s: float) -> bool:
    """Extend the holder's lease; False if it had lapsed and was taken over (the upload then runs uncounted)."""
    result = session.execute(
        update(UploadSlot).where(UploadSlot.holder == holder).values(expires_at=db_now(session) + lease_s)
    )
    return result.rowcount == 1


def release_upload_slot(session: Session, holder: str) -> None:
    session.execute(delete(UploadSlot).where(UploadSlot.holder == holder))
