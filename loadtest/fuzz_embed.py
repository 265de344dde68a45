"""Hypothesis strategies for the embedding routes (semantics 20): /v1/embeddings (and
/embeddings), /v2/embed, and /v1/score and /v1/rerank on an embedding model. Each draws
``(route, bytes)``: valid bodies (all 200s on an embedding model), one field broken (400s with
a reason; an unknown ``model``, a 404 ``model_not_found``) and arbitrary JSON over the routes'
field names (never a 5xx)."""

from __future__ import annotations

from hypothesis import strategies as st

from loadtest.fuzz_strategies import Body, Served, encode, json_values, token_ids

EMBED_FIELDS = (
    "input", "model", "dimensions", "encoding_format", "prompt_name", "instruction",
    "truncate_prompt_tokens", "user", "texts", "input_type", "embedding_types",
    "output_dimension", "truncate", "query", "items", "documents", "top_n",
)  # fmt: skip
ROUTES = ("/v1/embeddings", "/embeddings", "/v2/embed", "/v1/score", "/v1/rerank")
TYPES = ("float", "int8", "uint8", "binary", "ubinary", "base64")
EMBEDDING_TYPES = st.lists(st.sampled_from(TYPES), min_size=1, max_size=len(TYPES))
TEXT = st.text(min_size=1, max_size=30).filter(lambda t: t.strip() and t.isprintable())


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


def _broken(served: Served, dimension: int) -> dict[str, st.SearchStrategy[object]]:
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


def near_valid_embeddings(served: Served, dimension: int) -> st.SearchStrategy[Body]:
    """A valid /v1/embeddings body with one field broken, or an unknown field: 400s (an
    unknown ``model``: a 404)."""

    def break_one(body: Body) -> st.SearchStrategy[Body]:
        broken = _broken(served, dimension)
        changed = st.sampled_from(sorted(broken)).flatmap(
            lambda name: broken[name].map(lambda value: {**body, name: value})
        )
        unknown = st.tuples(
            st.text(max_size=12).filter(lambda k: k not in EMBED_FIELDS), json_values
        )
        return changed | unknown.map(lambda pair: {**body, pair[0]: pair[1]})

    return embedding_bodies(served, dimension).flatmap(break_one)


def cohere_bodies(served: Served, dimension: int) -> st.SearchStrategy[Body]:
    """/v2/embed bodies every rule accepts."""
    optional = {
        "model": st.sampled_from([served.model, None]),
        "input_type": st.sampled_from(["search_query", "search_document", "clustering"]),
        "embedding_types": EMBEDDING_TYPES,
        "output_dimension": st.integers(1, dimension),
        "truncate": st.sampled_from(["NONE", "START", "END"]),
    }
    return st.fixed_dictionaries(
        {"texts": st.lists(TEXT, min_size=1, max_size=4)}, optional=optional
    )


def cosine_bodies(served: Served) -> st.SearchStrategy[tuple[str, Body]]:
    """/v1/score (no labels) and /v1/rerank bodies on an embedding model."""
    items = st.lists(TEXT, max_size=4)
    score = st.fixed_dictionaries({"query": TEXT, "items": items}).map(lambda b: ("/v1/score", b))
    rerank = st.fixed_dictionaries({"query": TEXT, "documents": items}).map(
        lambda b: ("/v1/rerank", b)
    )
    return score | rerank


def valid_routes(served: Served, dimension: int) -> st.SearchStrategy[tuple[str, bytes]]:
    """(route, body) that every rule accepts: all 200s on an embedding model."""
    openai = st.tuples(st.sampled_from(ROUTES[:2]), embedding_bodies(served, dimension).map(encode))
    cohere = cohere_bodies(served, dimension).map(lambda body: ("/v2/embed", encode(body)))
    cosine = cosine_bodies(served).map(lambda pair: (pair[0], encode(pair[1])))
    return openai | cohere | cosine


def broken_routes(served: Served, dimension: int) -> st.SearchStrategy[tuple[str, bytes]]:
    """(route, body) with one field broken: all 400s."""
    return near_valid_embeddings(served, dimension).map(lambda b: ("/v1/embeddings", encode(b)))


def arbitrary_routes() -> st.SearchStrategy[tuple[str, bytes]]:
    """(route, body): arbitrary JSON over the routes' field names, or raw bytes."""
    names = st.sampled_from([*EMBED_FIELDS, "other"])
    objects = st.dictionaries(names, json_values, max_size=6)
    bodies = (json_values | objects).map(encode) | st.binary(max_size=64)
    return st.tuples(st.sampled_from(ROUTES), bodies)
