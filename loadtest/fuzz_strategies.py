"""Generated /v1/score bodies: the fixed hostile cases and seeded mutations of a valid one
(``fuzz_bodies``: ``make loadtest-closed``, the soak's invalid share, the fuzz runner), and
Hypothesis strategies: valid-shaped, one field broken, arbitrary JSON.

``Served`` holds what the strategies need to know about the server (from ``GET /v1/models``),
so the same strategies run in-process and against a running server. Each strategy draws
``bytes``: the exact body the fuzz runner sends.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

Body = dict[str, Any]
FIELDS = ("query", "items", "label_token_ids", "apply_softmax", "item_first", "model")


@dataclass(frozen=True)
class Served:
    """The served model's name, vocabulary, delimiter and item limit."""

    model: str
    vocab_size: int
    delimiter: int | None
    max_items: int

    @classmethod
    def from_models_body(cls, body: Mapping[str, Any]) -> Served:
        (card,) = body["data"]
        return cls(
            model=card["id"],
            vocab_size=card["vocab_size"],
            delimiter=card["multi_item_scoring_delimiter"],
            max_items=card["max_items_per_request"],
        )


def encode(payload: Any) -> bytes:
    """JSON as a client sends it (lone surrogates become ``\\udXXX`` escapes)."""
    return json.dumps(payload).encode()


def token_ids(served: Served, content: bool = True) -> st.SearchStrategy[int]:
    """Ids inside the vocabulary, edges included; never the delimiter in query or items."""
    last = served.vocab_size - 1
    ids = st.integers(0, last) | st.sampled_from(sorted({0, 1, last}))
    if content and served.delimiter is not None:
        ids = ids.filter(lambda token: token != served.delimiter)
    return ids


def valid_bodies(served: Served, max_items: int = 8) -> st.SearchStrategy[Body]:
    """Bodies every rule accepts (short, so no length limit is hit): all 200s."""
    many = min(served.max_items, max_items)
    ids = token_ids(served)
    text = st.fixed_dictionaries(
        {
            "query": st.text(min_size=1, max_size=60),
            "items": st.lists(st.text(max_size=30), max_size=many),
        }
    )
    tokens = st.fixed_dictionaries(
        {
            "query": st.lists(ids, min_size=1, max_size=40),
            "items": st.lists(st.lists(ids, max_size=20), max_size=many),
        }
    )
    labels = st.lists(token_ids(served, content=False), min_size=1, max_size=5)
    optional = {
        "apply_softmax": st.booleans(),
        "item_first": st.booleans(),
        "model": st.sampled_from([served.model, None]),
    }
    extra = st.fixed_dictionaries({"label_token_ids": labels}, optional=optional)
    return st.tuples(text | tokens, extra).map(lambda parts: {**parts[0], **parts[1]})


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**40), 10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def _bad_ids(served: Served) -> st.SearchStrategy[Any]:
    """A token id that is wrong: negative, outside the vocabulary, huge, a float, a string..."""
    return st.one_of(
        st.integers(max_value=-1),
        st.integers(served.vocab_size, 10**40),
        st.sampled_from([1.0, 0.5, 1e308, -0.0, "1", True, False, None, [1], {}]),
    )


def _with_bad_id(served: Served, ids: list[int]) -> st.SearchStrategy[list[Any]]:
    return st.tuples(st.integers(0, len(ids)), _bad_ids(served)).map(
        lambda pair: [*ids[: pair[0]], pair[1], *ids[pair[0] :]]
    )


def _broken_values(served: Served, body: Body) -> dict[str, st.SearchStrategy[Any]]:
    """For each field, values that break only that field of ``body``."""
    not_a_list = st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.just({})
    text = isinstance(body["query"], str)
    items: list[Any] = body["items"]
    too_many = [items[0] if items else ("" if text else [])] * (served.max_items + 1)
    delimiter = [] if served.delimiter is None else [served.delimiter]
    bad_query = [
        not_a_list,
        st.just("" if text else []),  # empty_query ("" only when "" encodes to no tokens)
        st.just(list(range(1, 4)) if text else "text"),  # mixed_input_types
        st.just("\ud800 lone surrogate"),
        _with_bad_id(served, [1, 2, 3]),
        *([st.just([*delimiter, 5])] if delimiter else []),
    ]
    bad_item = st.one_of(
        st.none(),
        st.integers(),
        st.just([[1]]),
        st.just(["1"] if not text else [1]),  # the other kind: mixed_input_types
        _with_bad_id(served, [4, 5]),
        st.just(delimiter if delimiter and not text else "\ud800"),
    )
    bad_items = [
        not_a_list,
        st.just(too_many),
        st.tuples(st.integers(0, len(items)), bad_item).map(
            lambda pair: [*items[: pair[0]], pair[1], *items[pair[0] :]]
        ),
    ]
    return {
        "query": st.one_of(bad_query),
        "items": st.one_of(bad_items),
        "label_token_ids": not_a_list | st.just([]) | _with_bad_id(served, [1]),
        "apply_softmax": st.none() | st.integers() | st.sampled_from(["true", [], 0.0]),
        "item_first": st.none() | st.integers() | st.sampled_from(["false", {}, 1.0]),
        "model": st.text(max_size=10).filter(lambda name: name != served.model) | st.integers(),
    }


def near_valid_bodies(served: Served) -> st.SearchStrategy[Body]:
    """A valid body with one thing wrong: a field's value, a missing required field, or an
    unknown field. Nearly all are 400s (a few breaks leave a valid body, e.g. a token query
    with no items); the runner checks every answer against the published schema."""

    def break_one(body: Body) -> st.SearchStrategy[Body]:
        broken = _broken_values(served, body)
        changed = st.sampled_from(sorted(broken)).flatmap(
            lambda name: broken[name].map(lambda value: {**body, name: value})
        )
        missing = st.sampled_from(["query", "items", "label_token_ids"]).map(
            lambda name: {key: value for key, value in body.items() if key != name}
        )
        unknown = st.tuples(st.text(max_size=12).filter(lambda k: k not in FIELDS), json_values)
        extra = unknown.map(lambda pair: {**body, pair[0]: pair[1]})
        return changed | missing | extra

    return valid_bodies(served).flatmap(break_one)


def arbitrary_bodies() -> st.SearchStrategy[bytes]:
    """Any JSON value, objects over the request's field names, or raw bytes."""
    names = st.sampled_from([*FIELDS, "other"])
    objects = st.dictionaries(names, json_values, max_size=len(FIELDS) + 1)
    return (json_values | objects).map(encode) | st.binary(max_size=64)


# -- /v1/completions and the tokenizer routes ---------------------------------------------

COMPLETION_FIELDS = (
    "prompt", "model", "echo", "logprobs", "max_tokens", "temperature", "top_p", "seed", "stop",
    "n", "best_of", "stream", "suffix", "user",
)  # fmt: skip


def completion_bodies(served: Served, max_prompts: int = 4) -> st.SearchStrategy[Body]:
    """/v1/completions bodies every rule accepts (short prompts): all 200s."""
    ids = token_ids(served, content=False)
    prompt = (
        st.text(min_size=1, max_size=40).filter(str.strip)
        | st.lists(ids, min_size=1, max_size=30)
        | st.lists(st.lists(ids, min_size=1, max_size=30), min_size=1, max_size=max_prompts)
    )
    optional = {
        "echo": st.booleans(),
        "logprobs": st.none() | st.integers(0, 20),
        "max_tokens": st.sampled_from([0, 1, None]),
        "temperature": st.sampled_from([0, 0.0, None]),
        "seed": st.integers(0, 2**31),
        "stop": st.none() | st.text(max_size=5),
        "n": st.sampled_from([1, None]),
        "model": st.sampled_from([served.model, None]),
    }
    return st.fixed_dictionaries({"prompt": prompt}, optional=optional)


def _broken_completion_values(served: Served) -> dict[str, st.SearchStrategy[Any]]:
    not_a_flag = st.none() | st.integers() | st.sampled_from(["true", [], 0.5])
    too_many = served.max_items + 1
    bad_prompts = [
        *(st.just(value) for value in ([], [[]], "", "\ud800", [[1], "a"], None, 7, {})),
        _with_bad_id(served, [1, 2, 3]),
        st.lists(st.just([1]), min_size=too_many, max_size=too_many),
    ]
    return {
        "prompt": st.one_of(bad_prompts),
        "echo": not_a_flag,
        "logprobs": st.integers(21, 10**30) | st.integers(max_value=-1) | st.just(1.5),
        "max_tokens": st.integers(2, 10**6) | st.integers(max_value=-1) | st.just("1"),
        "temperature": st.floats(0.01, 2.0),  # with max_tokens 1: sampling is refused
        "n": st.integers(2, 100),
        "best_of": st.integers(2, 100),
        "stream": st.just(True),
        "suffix": st.text(max_size=5),
        "model": st.text(max_size=10).filter(lambda name: name != served.model),
    }


def near_valid_completions(served: Served) -> st.SearchStrategy[Body]:
    """A valid completions body with one field broken, or an unknown field: 400s."""

    def break_one(body: Body) -> st.SearchStrategy[Body]:
        broken = _broken_completion_values(served)
        changed = st.sampled_from(sorted(broken)).flatmap(
            lambda name: broken[name].map(
                lambda value: (
                    {**body, name: value, "max_tokens": 1}
                    if name == "temperature"
                    else {**body, name: value}
                )
            )
        )
        unknown = st.tuples(
            st.text(max_size=12).filter(lambda k: k not in COMPLETION_FIELDS), json_values
        )
        return changed | unknown.map(lambda pair: {**body, pair[0]: pair[1]})

    return completion_bodies(served).flatmap(break_one)


TOKENIZER_ROUTES = ("/v1/completions", "/tokenize", "/detokenize")


def tokenizer_route_bodies() -> st.SearchStrategy[tuple[str, bytes]]:
    """(route, body): arbitrary JSON over the routes' field names, or raw bytes."""
    names = st.sampled_from([*COMPLETION_FIELDS, "tokens", "add_special_tokens", "other"])
    objects = st.dictionaries(names, json_values, max_size=6)
    bodies = (json_values | objects).map(encode) | st.binary(max_size=64)
    return st.tuples(st.sampled_from(TOKENIZER_ROUTES), bodies)


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
