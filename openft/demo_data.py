"""The demo's built-in dataset: support tickets to one label word, a task a tiny model can learn.

Generated deterministically from templates, so the held-out split never overlaps training rows
(the pair of slot fillers that makes a ticket is unique per row and assigned to one split).
"""

from __future__ import annotations

import random

import orjson

SYSTEM = "Classify the support ticket. Answer with one word."

LABELS = {
    "delivery": [
        "my parcel never arrived", "the package is late again", "tracking shows no movement for days",
        "the courier left my box at the wrong address", "my order still has not shipped",
        "the delivery driver did not come", "where is my shipment", "the parcel was lost in transit",
    ],
    "refund": [
        "i want my money back", "please refund my last order", "i returned the item but got no refund",
        "how long does a refund take", "the refund amount is wrong", "cancel my order and refund me",
        "i was promised a refund last week", "send the refund to my card",
    ],
    "login": [
        "i cannot sign in to my account", "the password reset email never comes", "my account is locked",
        "two factor code is not accepted", "the app logs me out every minute", "i forgot my username",
        "login page shows an error", "my session expires immediately",
    ],
    "billing": [
        "i was charged twice this month", "my invoice shows the wrong plan", "why did my card get billed",
        "update the billing address on my invoice", "the subscription price went up", "remove the extra fee",
        "i need a copy of my receipt", "my payment method was declined",
    ],
}
OPENERS = ["hello,", "hi team,", "good morning,", "hey,", "urgent:", "please help,", "dear support,", ""]
CLOSERS = ["thanks.", "what can you do?", "please advise.", "this is frustrating.", "", "regards.", "asap please.", "thank you!"]


def _rows() -> list[tuple[str, str]]:
    rows = []
    for label, bodies in LABELS.items():
        for bi, body in enumerate(bodies):
            for oi, opener in enumerate(OPENERS):
                closer = CLOSERS[(oi + bi) % len(CLOSERS)]
                text = " ".join(p for p in (opener, body, closer) if p)
                rows.append((text, label))
    return rows


def ticket_splits(seed: int = 0, held_out: int = 40) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, held-out) lists of (ticket, label); disjoint by construction."""
    rows = _rows()
    random.Random(seed).shuffle(rows)
    return rows[held_out:], rows[:held_out]


def chat_row(ticket: str, label: str) -> dict:
    return {"messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": ticket},
        {"role": "assistant", "content": label},
    ]}


def tickets_jsonl(rows: list[tuple[str, str]]) -> bytes:
    return b"".join(orjson.dumps(chat_row(t, l)) + b"\n" for t, l in rows)
