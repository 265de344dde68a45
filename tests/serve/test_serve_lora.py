"""LoRA adapters loaded and unloaded at run time over HTTP (semantics 21), served for real:
two ingress replicas, two scoring replicas and the app's adapter registry on Ray Serve.
Read-your-writes: right after ``/v1/load_lora_adapter`` answers 200, every request naming the
adapter, whichever ingress and scoring replica it reaches, scores as transformers + peft;
right after ``/v1/unload_lora_adapter`` answers 200, every one is a 404; bad loads are 400s
that change nothing. Requests for the base and for the adapter, sent all the while from
other threads, are answered the same throughout: the base's never move, the adapter's are
its own scores or a 404, never the base's under its name."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.builder import scoring_app
from replicas.settings import ReplicaSettings
from tests.support.fp32 import assert_fp32_close
from tests.support.lora_helpers import lora_settings, peft_model, reference_scores, save_adapter
from tests.support.serve_support import RAY_SERVE, ServeCluster, serve_cluster  # noqa: F401

pytestmark = [pytest.mark.slow, RAY_SERVE]

LABELS = [7042, 4528, 11452]
QUERY = [1, 504, 3060, 282, 4649, 314, 260, 1046]
ITEMS = [[9884, 30], [], [41, 2371, 16, 998]]
ROUNDS = 8  # answers in a row, so that both ingress replicas have answered


@pytest.fixture(scope="module")
def adapter(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("serve-lora")
    return save_adapter(
        tiny_llama_dir, root / "ranker", seed=5, r=4, lora_alpha=8,
        target_modules=["q_proj", "v_proj", "up_proj"],
    )  # fmt: skip


@pytest.fixture(scope="module")
def client(serve_cluster: ServeCluster, tiny_llama_dir: Path) -> Iterator[httpx.Client]:  # noqa: F811
    settings = ReplicaSettings.from_keys(
        **lora_settings(max_loras=1, max_lora_rank=4), model=str(tiny_llama_dir)
    )
    small = {"ray_actor_options": {"num_cpus": 0.1}}
    two = {**small, "num_replicas": 2}
    app = scoring_app(settings, replica_options=two, ingress_options=two)
    serve_cluster.deploy(app, "lora", "/lora")
    with serve_cluster.client() as http:
        http.base_url = http.base_url.join("/lora")
        yield http


def score(client: httpx.Client, model: str) -> httpx.Response:
    body = {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "model": model}
    return client.post("/v1/score", json=body)


def every_answer(client: httpx.Client, status: int) -> list[httpx.Response] | None:
    """``ROUNDS`` answers for the adapter, all with ``status``; None if any differs."""
    answers = [score(client, "ranker") for _ in range(ROUNDS)]
    return answers if all(a.status_code == status for a in answers) else None


class Traffic:
    """Requests for ``model`` (None: the base) sent one after another from a thread while
    the test loads and unloads."""

    def __init__(self, client: httpx.Client, model: str | None = None) -> None:
        self._url, self._model, self.answers = str(client.base_url), model, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send, daemon=True)

    def _send(self) -> None:
        with httpx.Client(base_url=self._url, timeout=60) as client:
            while not self._stop.is_set():
                body = {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS}
                body |= {"model": self._model} if self._model else {}
                self.answers.append(client.post("/v1/score", json=body))

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def model_ids(client: httpx.Client) -> list[str]:
    return [card["id"] for card in client.get("/v1/models").json()["data"]]


def test_an_adapter_loaded_over_http_serves_everywhere_as_peft_then_unloads(
    client, adapter, tiny_llama_dir
):
    with Traffic(client) as base, Traffic(client, "ranker") as named:
        reference = loaded_and_unloaded(client, adapter, tiny_llama_dir)
    statuses = [answer.status_code for answer in base.answers]
    assert statuses and set(statuses) == {200}, statuses  # under traffic: nothing refused
    first = np.log(base.answers[0].json()["scores"])
    for answer in base.answers[1:]:  # the base's answers never moved (steps of any mix)
        assert_fp32_close(np.log(answer.json()["scores"]), first, what="base under loads")
    served = [answer for answer in named.answers if answer.status_code == 200]
    assert {answer.status_code for answer in named.answers} <= {200, 404}
    assert served, "no request for the adapter was served while it was loaded"
    for answer in served:  # its own weights, never the base's under its name
        assert np.abs(np.log(answer.json()["scores"]) - reference).max() <= 1e-4


def loaded_and_unloaded(client: httpx.Client, adapter: Path, tiny_llama_dir: Path) -> np.ndarray:
    """Load, use, refuse bad loads, unload; the adapter's reference log-probs."""
    assert score(client, "ranker").status_code == 404  # nothing loaded yet
    load = {"lora_name": "ranker", "lora_path": str(adapter)}
    response = client.post("/v1/load_lora_adapter", json=load)
    assert response.status_code == 200, response.text
    answers = every_answer(client, 200)  # at once, through either ingress and replica
    assert answers is not None, "a request right after the load was not served"
    rows = [QUERY + item for item in ITEMS]
    reference = reference_scores(peft_model(tiny_llama_dir, adapter), rows, LABELS)
    assert {answer.json()["model"] for answer in answers} == {"ranker"}  # echoed
    for answer in answers:  # probabilities (SGLang's default): compared as log-probs
        assert np.abs(np.log(answer.json()["scores"]) - reference).max() <= 1e-4
    base = np.log(score(client, model_ids(client)[0]).json()["scores"])
    assert np.abs(base - reference).max() > 1e-3  # the adapter changes the answer
    cards = client.get("/v1/models").json()["data"]
    assert [(c["id"], c.get("parent")) for c in cards][1] == ("ranker", cards[0]["id"])

    # Refused loads: 400s naming the problem, nothing changed.
    again = client.post("/v1/load_lora_adapter", json=load)
    assert again.status_code == 400 and "already loaded" in again.json()["message"]
    missing = {"lora_name": "other", "lora_path": str(adapter.parent / "missing")}
    refused = client.post("/v1/load_lora_adapter", json=missing)
    assert refused.status_code == 400 and "other" in refused.json()["message"], refused.text
    assert client.post("/v1/load_lora_adapter", json={"lora_name": "x"}).status_code == 400
    assert model_ids(client)[1:] == ["ranker"]

    response = client.post("/v1/unload_lora_adapter", json={"lora_name": "ranker"})
    assert response.status_code == 200, response.text
    assert every_answer(client, 404) is not None, "a request right after the unload was served"
    assert model_ids(client)[1:] == []
    gone = client.post("/v1/unload_lora_adapter", json={"lora_name": "ranker"})
    assert gone.status_code == 404 and gone.json()["reason"] == "model_not_found"
    return reference
