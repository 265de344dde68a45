"""Malformed and hostile /v1/score bodies: the fixed cases and seeded mutations of a valid one.

Every one must get a 4xx, never a 5xx. ``fuzz_bodies`` feeds ``make loadtest-closed``, the
soak's invalid share and the fuzz runner (``loadtest.fuzz``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

VALID = {"query": "The capital of France is", "items": [" Paris"], "label_token_ids": [7042]}

FIXED_CASES: tuple[bytes, ...] = (
    b"",
    b"{",
    b"null",
    b"[]",
    b'"text"',
    b"123",
    b"\xff\xfe\x00garbage",
    b'{"query": "a"}',
    json.dumps({**VALID, "label_token_ids": []}).encode(),
    json.dumps({**VALID, "label_token_ids": [-1]}).encode(),
    json.dumps({**VALID, "label_token_ids": [10**30]}).encode(),
    json.dumps({**VALID, "label_token_ids": ["1"]}).encode(),
    json.dumps({**VALID, "label_token_ids": [1.5]}).encode(),
    json.dumps({**VALID, "label_token_ids": [True]}).encode(),
    json.dumps({**VALID, "query": [1, 2], "items": ["text"]}).encode(),
    json.dumps({**VALID, "query": ""}).encode(),
    json.dumps({**VALID, "query": []}).encode(),
    json.dumps({**VALID, "query": [10**30]}).encode(),
    json.dumps({**VALID, "query": [-5]}).encode(),
    json.dumps({**VALID, "items": [[1, [2]]]}).encode(),
    json.dumps({**VALID, "items": {"a": 1}}).encode(),
    json.dumps({**VALID, "items": [" x"] * 100_000}).encode(),
    json.dumps({**VALID, "query": "word " * 20_000}).encode(),
    json.dumps({**VALID, "apply_softmax": "yes"}).encode(),
    json.dumps({**VALID, "item_first": 2}).encode(),
    json.dumps({**VALID, "unknown_field": 1}).encode(),
    json.dumps({**VALID, "query": "<|endoftext|> inside"}).encode(),
    b'{"query": "a", "items": [' + b"[" * 5000 + b"]" * 5000 + b'], "label_token_ids": [1]}',
)

_NASTY_VALUES = (None, True, -1, 0, 2**63, 10**30, 1e308, -0.0, "", "\u0000", [], {}, [[]], [None])


def _mutations(rng: random.Random) -> Iterator[bytes]:
    while True:
        body = json.loads(json.dumps(VALID))
        key = rng.choice([*body.keys(), "apply_softmax", "item_first", "model", "extra"])
        body[key] = rng.choice(_NASTY_VALUES)
        text = json.dumps(body)
        if rng.random() < 0.3:  # also break the JSON itself
            cut = rng.randrange(len(text))
            text = text[:cut] + rng.choice(["", "}", "]", "\\", '"', ","]) + text[cut + 1 :]
        yield text.encode()


def fuzz_bodies(count: int, seed: int = 0) -> list[bytes]:
    """The fixed cases followed by seeded random mutations of a valid body."""
    rng = random.Random(seed)
    mutated = _mutations(rng)
    return list(FIXED_CASES) + [next(mutated) for _ in range(max(count - len(FIXED_CASES), 0))]
