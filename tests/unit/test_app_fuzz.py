"""Fuzzing the HTTP edge in-process (issue 9): generated bodies never get a 5xx, and the
published OpenAPI document states the rules validation enforces, in both directions.

The ingress runs with a one-token-per-character tokenizer ("\\x00" is the delimiter, so text
can hit delimiter_in_content) and small limits; the replicas are a CheckingBackend that
answers 500 to any work a replica should never see. ``make fuzz`` runs the same generators
with the real tokenizer and 10,000 bodies (docs/operations.md, "Fuzzing").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.completions import Completions
from app.openapi import longest_item, longest_query, score_request_schema
from app.service import ScoringService
from loadtest import fuzz, fuzz_strategies
from loadtest.fuzz import Agreement, Tally, in_process, run_all, run_strategy, split, table
from loadtest.fuzz_server import CheckingBackend, in_process_app
from loadtest.fuzz_strategies import Served, encode, to, valid_bodies
from loadtest.harness import run_workload
from loadtest.workloads import workload
from replicas.contract import ModelInfo, ScoringLimits
from replicas.errors import ScoringError

VOCAB = 49152
INFO = ModelInfo("fuzz-model", VOCAB, 0, ScoringLimits(16, 256, 256))
COUNT = 180  # bodies in the in-process run: 20 per generator (make fuzz: 10,000)


class CharTokenizer:
    """One token per character: id = code point % vocab; no BOS, so "" is no tokens."""

    def __call__(self, text: Any, *, add_special_tokens: bool = True) -> dict[str, Any]:
        def ids(value: str) -> list[int]:
            return [ord(char) % VOCAB for char in value]

        return {"input_ids": [ids(t) for t in text] if isinstance(text, list) else ids(text)}

    eos_token, bos_token, pad_token, unk_token, chat_template = "\x01", None, None, None, None

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(token) for token in ids)

    def batch_decode(self, rows: list[list[int]]) -> list[str]:
        return [self.decode(ids) for ids in rows]


def service_for(info: ModelInfo = INFO) -> ScoringService:
    tokenizer = CharTokenizer()
    return ScoringService(
        info=info,
        tokenizer=tokenizer,
        clock=lambda: 0.0,
        completions=Completions(tokenizer, info),
    )


@pytest.fixture(scope="module")
def fuzzed() -> tuple[dict[str, Tally], int]:
    with in_process(service_for()) as (target, backend):
        tallies = run_all(target, COUNT, at=0)
        return {tally.generator: tally for tally in tallies}, backend.calls


def test_no_generated_body_gets_a_5xx(fuzzed: tuple[dict[str, Tally], int]) -> None:
    tallies, _ = fuzzed
    print(table(list(tallies.values())).markdown())
    assert sum(tally.bodies for tally in tallies.values()) == COUNT
    assert {name: tally.server_errors for name, tally in tallies.items()} == dict.fromkeys(
        tallies, 0
    ), {name: tally.samples for name, tally in tallies.items()}


def test_answers_agree_with_the_published_schema(fuzzed: tuple[dict[str, Tally], int]) -> None:
    tallies, _ = fuzzed
    assert {name: tally.disagreements for name, tally in tallies.items()} == dict.fromkeys(
        tallies, 0
    ), {name: tally.samples for name, tally in tallies.items()}
    assert tallies["schemathesis: negative"].count(200, 300) == 0


def test_generated_bodies_reach_the_scoring_path(fuzzed: tuple[dict[str, Tally], int]) -> None:
    tallies, replica_calls = fuzzed
    per = COUNT // 9  # bodies per generator
    assert tallies["hypothesis: valid-shaped"].count(200, 300) >= 7 * per // 8
    assert tallies["schemathesis: positive"].count(200, 300) >= 3 * per // 4
    assert replica_calls >= per
    assert tallies["hypothesis: one field broken"].count(400, 500) >= 7 * per // 8
    assert tallies["completions: valid-shaped"].count(200, 300) >= 15 * per // 16
    assert tallies["completions: one field broken"].count(400, 500) >= 15 * per // 16


def test_a_validation_hole_shows_up_as_5xx() -> None:
    """A replica with a smaller vocabulary than the ingress believes: the checking backend
    refuses the works that slip through, and the runner counts them."""
    small = ModelInfo(INFO.name, 1000, 0, INFO.limits)
    with in_process(service_for(), CheckingBackend(small)) as (target, _):
        tally = Tally("hole")
        served = Served(INFO.name, VOCAB, 0, 16)
        run_strategy(target, tally, to("/v1/score", valid_bodies(served)), 50, at=0)
    assert tally.server_errors > 0
    assert tally.samples and tally.samples[0].startswith("500")


def test_openapi_states_the_served_rules() -> None:
    document = in_process_app(service_for(), CheckingBackend(INFO)).openapi()
    request = document["components"]["schemas"]["ScoreRequest"]
    props = request["properties"]
    assert set(request["required"]) == {"query", "items", "label_token_ids"}
    assert request["additionalProperties"] is False
    assert props["items"]["maxItems"] == 16
    text, token_query = props["query"]["anyOf"]
    assert text == {"type": "string", "minLength": 1}  # "" tokenizes to nothing
    assert token_query["minItems"] == 1 and token_query["maxItems"] == longest_query(INFO)
    assert token_query["items"] == {
        "type": "integer",
        "minimum": 0,
        "maximum": VOCAB - 1,
        "not": {"const": 0},
    }
    labels = props["label_token_ids"]
    assert labels["minItems"] == 1
    assert labels["items"] == {"type": "integer", "minimum": 0, "maximum": VOCAB - 1}
    assert props["model"]["anyOf"] == [{"const": "fuzz-model"}, {"type": "null"}]
    assert [branch["title"] for branch in request["oneOf"]] == ["text", "token ids"]


def test_the_document_without_a_model_has_the_model_free_rules() -> None:
    props = score_request_schema()["properties"]
    assert props["label_token_ids"]["items"] == {"type": "integer", "minimum": 0}
    assert "maxItems" not in props["items"]


def _accepted(service: ScoringService, **payload: Any) -> bool:
    try:
        service.prepare({"label_token_ids": [1], **payload})
    except ScoringError as error:
        assert error.reason.value == "sequence_too_long", error.message
        return False
    return True


@pytest.mark.parametrize("delimiter", [None, 0])
@pytest.mark.parametrize(("seq_len", "row"), [(64, 64), (64, 16), (16, 64), (10, 9)])
def test_longest_query_and_item_are_exact(delimiter: int | None, seq_len: int, row: int) -> None:
    """The maxItems the document states: some request of that length is served, and no
    request one token longer is, whichever path (item_first or not) serves it."""
    service = service_for(ModelInfo("m", VOCAB, delimiter, ScoringLimits(4, seq_len, row)))
    query, item = longest_query(service.info), longest_item(service.info)

    def served(query_len: int, item_len: int | None) -> bool:
        items = [] if item_len is None else [[2] * item_len]
        return any(
            _accepted(service, query=[2] * query_len, items=items, item_first=first)
            for first in (False, True)
        )

    assert served(query, None) and not served(query + 1, None)
    assert served(1, item) and not served(1, item + 1)


def test_agreement_rules() -> None:
    agreement = Agreement(in_process_app(service_for(), CheckingBackend(INFO)).openapi())
    good = {"query": [1, 2], "items": [[3]], "label_token_ids": [4]}
    assert not agreement.disagrees(encode(good), 200, None)
    assert agreement.disagrees(encode(good), 400, "invalid_request")
    assert not agreement.disagrees(encode(good), 400, "sequence_too_long")  # unstated rule
    assert agreement.disagrees(encode({**good, "label_token_ids": [4.0]}), 400, "x")  # it is 4
    assert not agreement.disagrees(encode({**good, "query": "\ud800"}), 400, "x")
    assert agreement.disagrees(encode({**good, "items": ["text"]}), 200, None)  # mixed
    assert agreement.disagrees(b"{", 200, None)
    assert not agreement.disagrees(b"{", 500, None)  # a server error, counted as such


def test_split_shares_out_every_body() -> None:
    assert split(10, 6) == [2, 2, 2, 2, 1, 1]
    assert sum(split(10_000, 6)) == 10_000


def test_the_runner_prints_the_table_and_exits_zero(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(fuzz, "_service", lambda config: service_for())
    argv = ["--count", "12", "--seed", "1", "--out", str(tmp_path)]
    assert run_workload(workload("fuzz"), argv) == 0
    out = capsys.readouterr().out
    assert "| total | 12 |" in out and "replica requests (GET /v1/stats) 0 -> " in out


def test_fixed_cases_stay_available() -> None:
    bodies = fuzz_strategies.fuzz_bodies(40)
    assert len(bodies) == 40 and bodies[: len(fuzz_strategies.FIXED_CASES)] == list(
        fuzz_strategies.FIXED_CASES
    )
