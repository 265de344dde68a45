"""Generated request bodies: the fixed hostile cases and seeded mutations of a valid /v1/score
body (``fuzz_bodies``: ``make loadtest-closed``, the soak's invalid share, the fuzz runner),
and Hypothesis strategies of ``(route, bytes)``, the exact request the fuzz runner sends:
valid-shaped, one field broken, arbitrary JSON, for /v1/score, /v1/completions, the tokenizer
routes and the embedding routes (semantics 20). ``Served`` (from ``GET /v1/models``) is all
they know of the server, so they run in process and against a running server alike.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

Body = dict[str, Any]
Drawn = st.SearchStrategy[tuple[str, bytes]]
FIELDS = ("query", "items", "label_token_ids", "apply_softmax", "item_first", "model")
COMPLETION_FIELDS = (
    "prompt", "model", "echo", "logprobs", "max_tokens", "temperature", "top_p", "seed", "stop",
    "n", "best_of", "stream", "suffix", "user",
)  # fmt: skip
TOKENIZER_ROUTES = ("/v1/completions", "/tokenize", "/detokenize")
EMBED_FIELDS = (
    "input", "model", "dimensions", "encoding_format", "prompt_name", "instruction",
    "truncate_prompt_tokens", "user", "texts", "input_type", "embedding_types",
    "output_dimension", "truncate", "query", "items", "documents", "top_n",
)  # fmt: skip
EMBED_ROUTES = ("/v1/embeddings", "/embeddings", "/v2/embed", "/v1/score", "/v1/rerank")
TYPES = ("float", "int8", "uint8", "binary", "ubinary", "base64")
EMBEDDING_TYPES = st.lists(st.sampled_from(TYPES), min_size=1, max_size=len(TYPES))
TEXT = st.text(min_size=1, max_size=30).filter(lambda t: t.strip() and t.isprintable())


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
        return cls(card["id"], card["vocab_size"], card["multi_item_scoring_delimiter"],
                   card["max_items_per_request"])  # fmt: skip


def encode(payload: Any) -> bytes:
    """JSON as a client sends it (lone surrogates become ``\\udXXX`` escapes)."""
    return json.dumps(payload).encode()


def to(route: str | st.SearchStrategy[str], bodies: st.SearchStrategy[Any]) -> Drawn:
    """(route, body): JSON bodies encoded, bytes as drawn."""
    routes = st.just(route) if isinstance(route, str) else route
    return st.tuples(routes, bodies.map(lambda b: b if isinstance(b, bytes) else encode(b)))


def token_ids(served: Served, content: bool = True) -> st.SearchStrategy[int]:
    """Ids inside the vocabulary, edges included; never the delimiter in query or items."""
    last = served.vocab_size - 1
    ids = st.integers(0, last) | st.sampled_from(sorted({0, 1, last}))
    if content and served.delimiter is not None:
        ids = ids.filter(lambda token: token != served.delimiter)
    return ids


_FLOATS = st.floats(allow_nan=False, allow_infinity=False)
_SCALARS = (
    st.none() | st.booleans() | st.integers(-(10**40), 10**40) | _FLOATS | st.text(max_size=20)
)
json_values = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=20)  # fmt: skip


def arbitrary(names: tuple[str, ...], max_size: int = 6) -> st.SearchStrategy[bytes]:
    """Any JSON value, objects over ``names`` (and "other"), or raw bytes."""
    objects = st.dictionaries(st.sampled_from([*names, "other"]), json_values, max_size=max_size)
    return (json_values | objects).map(encode) | st.binary(max_size=64)


def one_broken(
    body: Body,
    broken: Mapping[str, st.SearchStrategy[Any]],
    known: tuple[str, ...],
    also: Mapping[str, Body] | None = None,
) -> st.SearchStrategy[Body]:
    """``body`` with one field's value drawn from ``broken`` (plus ``also[field]``), or an
    unknown field (not in ``known``) added."""
    changed = st.sampled_from(sorted(broken)).flatmap(
        lambda name: broken[name].map(lambda v: {**body, name: v, **(also or {}).get(name, {})})
    )
    unknown = st.tuples(st.text(max_size=12).filter(lambda k: k not in known), json_values)
    return changed | unknown.map(lambda pair: {**body, pair[0]: pair[1]})


def _bad_ids(served: Served) -> st.SearchStrategy[Any]:
    """A token id that is wrong: negative, outside the vocabulary, huge, a float, a string..."""
    return st.one_of(
        st.integers(max_value=-1),
        st.integers(served.vocab_size, 10**40),
        st.sampled_from([1.0, 0.5, 1e308, -0.0, "1", True, False, None, [1], {}]),
    )


def _inserted(values: list[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """``values`` with one drawn from ``bad`` inserted somewhere."""
    return st.tuples(st.integers(0, len(values)), bad).map(
        lambda pair: [*values[: pair[0]], pair[1], *values[pair[0] :]]
    )


# -- /v1/score ------------------------------------------------------------------------------


def valid_bodies(served: Served, max_items: int = 8) -> st.SearchStrategy[Body]:
    """Bodies every rule accepts (short, so no length limit is hit): all 200s."""
    many = min(served.max_items, max_items)
    ids = token_ids(served)
    words = st.lists(st.text(max_size=30), max_size=many)
    text = st.fixed_dictionaries({"query": st.text(min_size=1, max_size=60), "items": words})
    tokens = st.fixed_dictionaries(
        {"query": st.lists(ids, min_size=1, max_size=40),
         "items": st.lists(st.lists(ids, max_size=20), max_size=many)}
    )  # fmt: skip
    labels = st.lists(token_ids(served, content=False), min_size=1, max_size=5)
    optional = {"apply_softmax": st.booleans(), "item_first": st.booleans(),
                "model": st.sampled_from([served.model, None])}  # fmt: skip
    extra = st.fixed_dictionaries({"label_token_ids": labels}, optional=optional)
    return st.tuples(text | tokens, extra).map(lambda parts: {**parts[0], **parts[1]})


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
        _inserted([1, 2, 3], _bad_ids(served)),
        *([st.just([*delimiter, 5])] if delimiter else []),
    ]
    bad_item = st.one_of(
        st.none(),
        st.integers(),
        st.just([[1]]),
        st.just(["1"] if not text else [1]),  # the other kind: mixed_input_types
        _inserted([4, 5], _bad_ids(served)),
        st.just(delimiter if delimiter and not text else "\ud800"),
    )
    return {
        "query": st.one_of(bad_query),
        "items": st.one_of(not_a_list, st.just(too_many), _inserted(items, bad_item)),
        "label_token_ids": not_a_list | st.just([]) | _inserted([1], _bad_ids(served)),
        "apply_softmax": st.none() | st.integers() | st.sampled_from(["true", [], 0.0]),
        "item_first": st.none() | st.integers() | st.sampled_from(["false", {}, 1.0]),
        "model": st.text(max_size=10).filter(lambda name: name != served.model) | st.integers(),
    }


def near_valid_bodies(served: Served) -> st.SearchStrategy[Body]:
    """A valid body with one thing wrong: a field's value, a missing required field, or an
    unknown field. Nearly all are 400s (a few breaks leave a valid body, e.g. a token query
    with no items); the runner checks every answer against the published schema."""

    def break_one(body: Body) -> st.SearchStrategy[Body]:
        missing = st.sampled_from(["query", "items", "label_token_ids"]).map(
            lambda name: {key: value for key, value in body.items() if key != name}
        )
        return one_broken(body, _broken_values(served, body), FIELDS) | missing

    return valid_bodies(served).flatmap(break_one)


# -- /v1/completions and the tokenizer routes -----------------------------------------------


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


def near_valid_completions(served: Served) -> st.SearchStrategy[Body]:
    """A valid completions body with one field broken, or an unknown field: 400s."""
    not_a_flag = st.none() | st.integers() | st.sampled_from(["true", [], 0.5])
    too_many = served.max_items + 1
    bad_prompts = [
        *(st.just(value) for value in ([], [[]], "", "\ud800", [[1], "a"], None, 7, {})),
        _inserted([1, 2, 3], _bad_ids(served)),
        st.lists(st.just([1]), min_size=too_many, max_size=too_many),
    ]
    broken = {
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
    also = {"temperature": {"max_tokens": 1}}
    return completion_bodies(served).flatmap(
        lambda body: one_broken(body, broken, COMPLETION_FIELDS, also)
    )


def tokenizer_route_bodies() -> Drawn:
    """(route, body): arbitrary JSON over the routes' field names, or raw bytes."""
    names = (*COMPLETION_FIELDS, "tokens", "add_special_tokens")
    return to(st.sampled_from(TOKENIZER_ROUTES), arbitrary(names))


# -- the embedding routes (on an embedding model) -------------------------------------------


def embedding_bodies(
    served: Served, dimension: int, max_inputs: int = 4
) -> st.SearchStrategy[Body]:
    """/v1/embeddings bodies every rule accepts (short inputs)."""
    ids = token_ids(served, content=False)
    inputs = (
        TEXT
        | st.lists(TEXT, min_size=1, max_size=max_inputs)
        | st.lists(ids, min_size=1, max_size=20)
        | st.lists(st.lists(ids, min_size=1, max_size=20), min_size=1, max_size=max_inputs)
    )
    optional = {
        "model": st.sampled_from([served.model, None]),
        "dimensions": st.integers(1, dimension),
        "encoding_format": st.sampled_from(["float", "base64"]),
        "truncate_prompt_tokens": st.integers(1, 8),
        "user": st.text(max_size=5),
        "embedding_types": EMBEDDING_TYPES,
    }
    return st.fixed_dictionaries({"input": inputs}, optional=optional)


def _broken_embeddings(served: Served, dimension: int) -> dict[str, st.SearchStrategy[Any]]:
    too_many = served.max_items + 1
    bad_inputs = [
        *(st.just(v) for v in ("", [], [[]], [""], ["a", 1], [[1], "a"], None, 7, {}, [1.5])),
        st.just([-1]),
        st.just([[served.vocab_size]]),
        st.lists(st.just("a"), min_size=too_many, max_size=too_many),
    ]
    return {
        "input": st.one_of(bad_inputs),
        "dimensions": st.integers(max_value=0) | st.integers(dimension + 1) | st.just("8"),
        "encoding_format": st.text(max_size=6).filter(lambda f: f not in ("float", "base64")),
        "prompt_name": st.text(min_size=1, max_size=6).filter(
            lambda n: n not in ("query", "document")
        ),
        "truncate_prompt_tokens": st.integers(max_value=0) | st.just(True),
        "embedding_types": st.just([]) | st.just(["int4"]) | st.just("int8"),
        "model": st.text(max_size=10).filter(lambda name: name != served.model),
    }


def valid_routes(served: Served, dimension: int) -> Drawn:
    """(route, body) that every rule accepts: all 200s on an embedding model (/v1/embeddings
    and /embeddings, /v2/embed, and cosine /v1/score and /v1/rerank)."""
    cohere = st.fixed_dictionaries({"texts": st.lists(TEXT, min_size=1, max_size=4)}, optional={
        "model": st.sampled_from([served.model, None]),
        "input_type": st.sampled_from(["search_query", "search_document", "clustering"]),
        "embedding_types": EMBEDDING_TYPES,
        "output_dimension": st.integers(1, dimension),
        "truncate": st.sampled_from(["NONE", "START", "END"]),
    })  # fmt: skip
    items = st.lists(TEXT, max_size=4)
    return (
        to(st.sampled_from(EMBED_ROUTES[:2]), embedding_bodies(served, dimension))
        | to("/v2/embed", cohere)
        | to("/v1/score", st.fixed_dictionaries({"query": TEXT, "items": items}))
        | to("/v1/rerank", st.fixed_dictionaries({"query": TEXT, "documents": items}))
    )


def broken_routes(served: Served, dimension: int) -> Drawn:
    """/v1/embeddings bodies with one field broken or an unknown one: 400s (an unknown
    ``model``: a 404 ``model_not_found``)."""
    broken = _broken_embeddings(served, dimension)
    bodies = embedding_bodies(served, dimension).flatmap(
        lambda body: one_broken(body, broken, EMBED_FIELDS)
    )
    return to("/v1/embeddings", bodies)


def arbitrary_routes() -> Drawn:
    """(route, body): arbitrary JSON over the embedding routes' field names, or raw bytes."""
    return to(st.sampled_from(EMBED_ROUTES), arbitrary(EMBED_FIELDS))


# -- fixed cases and seeded mutations (no Hypothesis) ---------------------------------------

VALID = {"query": "The capital of France is", "items": [" Paris"], "label_token_ids": [7042]}
_BROKEN_VALID = (
    {"label_token_ids": []}, {"label_token_ids": [-1]}, {"label_token_ids": [10**30]},
    {"label_token_ids": ["1"]}, {"label_token_ids": [1.5]}, {"label_token_ids": [True]},
    {"query": [1, 2], "items": ["text"]}, {"query": ""}, {"query": []}, {"query": [10**30]},
    {"query": [-5]}, {"items": [[1, [2]]]}, {"items": {"a": 1}}, {"items": [" x"] * 100_000},
    {"query": "word " * 20_000}, {"apply_softmax": "yes"}, {"item_first": 2},
    {"unknown_field": 1}, {"query": "<|endoftext|> inside"},
)  # fmt: skip
FIXED_CASES: tuple[bytes, ...] = (
    b"", b"{", b"null", b"[]", b'"text"', b"123", b"\xff\xfe\x00garbage", b'{"query": "a"}',
    *(encode({**VALID, **change}) for change in _BROKEN_VALID),
    b'{"query": "a", "items": [' + b"[" * 5000 + b"]" * 5000 + b'], "label_token_ids": [1]}',
)  # fmt: skip
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
    mutated = _mutations(random.Random(seed))
    return list(FIXED_CASES) + [next(mutated) for _ in range(max(count - len(FIXED_CASES), 0))]
