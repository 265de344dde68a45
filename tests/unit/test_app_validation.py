"""Parsing and schema rules of the HTTP edge: every malformed body is a 400 with a reason."""

from __future__ import annotations

import json

import pytest

from app.validation import parse_json, score_labels, validate_request
from replicas.contract import ModelInfo, ScoringLimits
from replicas.errors import Reason, ScoringError, error_body

GOOD = {"query": "q", "items": ["a"], "label_token_ids": [1]}


def reason_of(body: bytes) -> str:
    with pytest.raises(ScoringError) as caught:
        validate_request(parse_json(body))
    assert caught.value.status_code == 400
    assert caught.value.body["code"] == 400
    return caught.value.body["reason"]


def with_(**changes: object) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b"{'query': 'q'}",
        b'{"query": "q",}',
        b"\xff\xfe\x00",
        b'{"query": NaN, "items": [], "label_token_ids": [1]}',
        b'{"label_token_ids": [Infinity]}',
        b'{"label_token_ids": [1' + b"0" * 5000 + b"]}",  # beyond Python's int digit limit
        b"[" * 100_000 + b"]" * 100_000,  # nesting deeper than the recursion limit
    ],
)
def test_not_json_is_invalid_json(body: bytes) -> None:
    assert reason_of(body) == "invalid_json"


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'"text"',
        b"42",
        b"null",
        b"true",
        with_(label_token_ids=["1"]),
        with_(label_token_ids=[True]),
        with_(label_token_ids=[1.5]),
        with_(label_token_ids=1),
        with_(label_token_ids={"a": 1}),
        with_(apply_softmax=1),
        with_(apply_softmax="true"),
        with_(item_first=None),
        with_(query=5),
        with_(query=None),
        with_(query=["1", 2]),
        with_(query={"nested": [[[{"x": 1}]]]}),
        with_(items="a"),
        with_(items=[["a"]]),
        with_(items=[[1.5]]),
        with_(items=[[[1]]]),
        with_(items=None),
        with_(model=7),
        with_(unknown_field=1),
        json.dumps({"items": ["a"], "label_token_ids": [1]}).encode(),  # query missing
        json.dumps({"query": "q", "label_token_ids": [1]}).encode(),  # items missing
    ],
)
def test_wrong_types_are_invalid_request(body: bytes) -> None:
    assert reason_of(body) == "invalid_request"


@pytest.mark.parametrize(
    "body",
    [
        json.dumps({"query": "q", "items": ["a"]}).encode(),
        with_(label_token_ids=None),
    ],
)
def test_missing_labels_are_empty_label_token_ids(body: bytes) -> None:
    # the schema lets them be absent (a score-head model takes none); a causal LM refuses
    request = validate_request(parse_json(body))
    with pytest.raises(ScoringError) as caught:
        score_labels(request.label_token_ids, ModelInfo("m", 100, None, ScoringLimits()))
    assert caught.value.body["reason"] == "empty_label_token_ids"
    assert caught.value.body["param"] == "label_token_ids"


def test_huge_ints_parse_and_are_left_to_the_vocab_rule() -> None:
    request = validate_request(parse_json(with_(label_token_ids=[10**30])))
    assert request.label_token_ids == [10**30]


def test_a_whole_number_is_the_integer_it_equals_as_json_schema_reads_it() -> None:
    whole = validate_request(parse_json(b'{"query": [1.0, 2e0], "items": [[3.0]], '
                                        b'"label_token_ids": [5.0]}'))  # fmt: skip
    assert (whole.query, whole.items, whole.label_token_ids) == ([1, 2], [[3]], [5])
    assert all(type(t) is int for t in [*whole.query, *whole.items[0], *whole.label_token_ids])


def test_good_request_keeps_defaults() -> None:
    request = validate_request(parse_json(with_()))
    assert (request.apply_softmax, request.item_first, request.model) == (False, False, None)


def test_param_names_the_field_at_fault() -> None:
    with pytest.raises(ScoringError) as caught:
        validate_request(parse_json(with_(apply_softmax="yes")))
    assert caught.value.param == "apply_softmax"
    assert "apply_softmax" in caught.value.message


def test_envelope_has_the_sglang_fields() -> None:
    body = error_body(Reason.EMPTY_QUERY, "m", "query")
    assert body == {
        "object": "error",
        "message": "m",
        "type": "BadRequestError",
        "param": "query",
        "code": 400,
        "reason": "empty_query",
    }


def test_error_survives_pickling_with_its_body() -> None:
    import pickle

    error = ScoringError(Reason.OVERLOADED, "busy", None, 503)
    copy = pickle.loads(pickle.dumps(error))
    assert copy.body == error.body
    assert copy.body["type"] == "ServiceUnavailableError"
