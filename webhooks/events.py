"""The events this service sends and their payloads, in OpenAI's shapes
(openai-python `types/webhooks/*_webhook_event.py`): `{id, object: "event", created_at, type,
data: {id}}`. A payload carries the object's id only, never its rows or fields: the receiver
retrieves the job or batch with its key."""

from __future__ import annotations

import orjson

from openft.ids import new_id

JOB_EVENTS = {"succeeded": "fine_tuning.job.succeeded", "failed": "fine_tuning.job.failed",
              "cancelled": "fine_tuning.job.cancelled"}
BATCH_EVENTS = {"completed": "batch.completed", "failed": "batch.failed", "cancelled": "batch.cancelled",
                "expired": "batch.expired"}
EVAL_RUN_EVENTS = {"completed": "eval.run.succeeded", "failed": "eval.run.failed", "canceled": "eval.run.canceled"}
EVENT_TYPES = (*BATCH_EVENTS.values(), *JOB_EVENTS.values(), *EVAL_RUN_EVENTS.values())
# What `test` sends as the sample's `data.id`: an id of the right kind that names no object.
SAMPLE_IDS = {**{t: "ftjob-" + "0" * 32 for t in JOB_EVENTS.values()}, **{t: "batch_" + "0" * 24 for t in BATCH_EVENTS.values()},
              **{t: "evalrun_" + "0" * 32 for t in EVAL_RUN_EVENTS.values()}}


def event_id() -> str:
    return new_id("evt_", 24)


def payload(event_id: str, event_type: str, created_at: int, object_id: str) -> str:
    """The exact body every attempt of this event sends (stored once, so retries send the same bytes)."""
    return orjson.dumps({"id": event_id, "object": "event", "created_at": created_at, "type": event_type,
                         "data": {"id": object_id}}).decode()


def object_id(body: str) -> str:
    """The id a stored payload is about."""
    return orjson.loads(body)["data"]["id"]
