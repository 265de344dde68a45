"""Layering: the CPU ingress never imports jax; replicas never import starlette or app."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# As in a Serve ingress, torch is kept out (replicas.checkpoints.sources.keep_torch_out_of_actors).
PROBE = """
import json, sys
sys.modules["torch"] = None
import app.builder, app.http, app.ingress, app.openapi, app.schema
import app.metrics, app.scores, app.service, app.tokenization, app.validation
from app.service import ScoringService
from replicas.settings import ReplicaSettings
service = ScoringService.from_settings(ReplicaSettings.from_keys(model=sys.argv[1]))
service.tokenizer("hello", add_special_tokens=True)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib", "flax"))))
"""


def test_app_modules_never_import_jax(tiny_llama_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(tiny_llama_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded == [], f"the ingress pulled in {loaded}"


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_app_sources_do_not_name_jax() -> None:
    for path in sorted((ROOT / "app").rglob("*.py")):
        assert not _imported_modules(path) & {"jax", "jaxlib", "flax"}, path


def test_replicas_never_import_the_http_layer() -> None:
    for path in sorted((ROOT / "replicas").rglob("*.py")):
        assert not _imported_modules(path) & {"starlette", "fastapi", "app"}, path


def test_replica_deployment_imports_the_engine_lazily() -> None:
    # The ingress imports replicas.serving.deployment for its types; jax comes only with the engine.
    assert "jax" not in _imported_modules(ROOT / "replicas" / "serving" / "deployment.py")
