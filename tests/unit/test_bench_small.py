"""loadtest.bench_small's pure pieces: the llama.cpp peer is optional, the result says so."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from loadtest import peers
from loadtest.bench_small import layer_matrices
from loadtest.bench_small_report import report as tables_and_notes


def report(results: dict, args: SimpleNamespace) -> str:
    notes, tables = tables_and_notes(results, args)
    return "\n".join([*notes, *(t.title + "\n" + t.markdown() for t in tables)])


def test_without_llama_cpp_the_peer_is_none_and_a_note_is_printed(monkeypatch, capsys):
    monkeypatch.setattr(peers, "llama_available", lambda: False)
    assert peers.llama_cpp() is None
    assert "llama-cpp-python is not installed" in capsys.readouterr().out


def test_log_softmax_matches_the_definition():
    logits = np.array([1.0, 2.0, 3.0, 1000.0], np.float32)
    out = peers.log_softmax(logits)
    assert np.isclose(np.exp(out).sum(), 1.0)
    assert np.isclose(out[0] - out[1], -1.0)


def test_layer_matrices_split_where_the_input_is_the_hidden_size():
    layers = {
        "q": np.zeros((3, 8, 2, 4)),  # [L, D, heads, head_dim]
        "o": np.zeros((3, 2, 4, 8)),  # [L, heads, head_dim, D]
        "down": np.zeros((3, 16, 8)),
        "norm": np.zeros((3, 8)),
    }
    shapes = sorted(w.shape for w in layer_matrices({"layers": layers}, hidden=8))
    assert shapes == [(3, 8, 8), (3, 8, 8), (3, 16, 8)]


def fake_results(llama: bool) -> dict:
    times = {"engine": 0.05, "hf_rows": 0.1, "hf_batched": 0.08}
    logprobs = {"engine": np.zeros((2, 3)), "hf": np.full((2, 3), 1e-5)}
    multi = [{"items": 10, "engine_s": 1.0}]
    if llama:
        times |= {"llama_rows": 0.09, "llama_shared": 0.07}
        logprobs |= {"llama": np.full((2, 3), 0.01), "llama_rows": np.full((2, 3), 0.02)}
        multi = [{"items": 10, "engine_s": 1.0, "llama_s": 2.0, "max_diff": 0.01}]
    floor = dict.fromkeys(
        ("step_s", "run_s", "idle_step_s", "noop_s", "head_s", "layers_scan_s", "layers_split_s"),
        0.01,
    )
    floor |= {"tokens": 16, "bandwidth": 2e10, "floor_s": 0.025}
    floor |= {"weight_bytes": 5e8, "head_bytes": 1e8, "layer_bytes": 4e8}
    return {
        "served_s": None,
        "llama": llama,
        "small": {"query_tokens": 9, "times": times, "logprobs": logprobs},
        "multi": multi,
        "floor": floor,
        "costs": None,
    }


def test_the_report_without_llama_cpp_has_a_note_and_no_llama_rows():
    args = SimpleNamespace(repeats=10, multi_repeats=3)
    text = report(fake_results(llama=False), args)
    assert peers.NOT_INSTALLED in text
    assert "llama.cpp (Q4_1)" not in text
    assert "two rows: 0.50x (target <= 0.6x)" in text


def test_the_report_with_llama_cpp_compares_it():
    text = report(fake_results(llama=True), SimpleNamespace(repeats=10, multi_repeats=3))
    assert peers.NOT_INSTALLED not in text
    assert "engine / llama.cpp's best: 0.71x" in text
    assert "| 10 | 1.000 | 2.000 | 2.00x | 0.010 |" in text
    assert "within the stated tolerance" in text
