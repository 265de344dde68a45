"""The layers point one way (README, "What is where"): every import of the source tree, lazy
ones inside functions included, is read from the files themselves.

Top-level order: ``cluster`` < ``replicas`` < ``app`` | ``planning`` < ``batch`` <
``loadtest``; inside ``replicas``: ``contract`` (and ``embed_contract``, ``engine_contract``,
``errors``) < ``settings`` < ``model`` < ``checkpoints`` < ``engine`` < ``serving``. A package
may import its own layer and the layers below it, never one above or beside it, and no two
modules import each other, directly or around a longer loop.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cluster", "replicas", "app", "planning", "batch", "loadtest")
RANK = {"cluster": 0, "replicas": 1, "app": 2, "planning": 2, "batch": 3, "loadtest": 4}
REPLICAS_RANK = {
    "_exports": 0,
    "contract": 0,
    "embed_contract": 0,  # the embedding half of the contract
    "errors": 0,  # the one error a request is refused with, and its reasons
    "engine_contract": 0,  # what a replica uses of its engine (a Protocol)
    "answers": 0,  # what a replica answers per work (contract imports it)
    "kinds": 0,  # the model kinds, one registry (contract reads a model's kind from it)
    "settings": 1,
    "model": 2,
    "checkpoints": 3,
    "engine": 4,
    "serving": 5,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


MODULES = source_modules()


def _resolve(name: str) -> str | None:
    """The deepest module of the tree that ``name`` (a module or module.attribute) names."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """Modules of the tree that ``module`` imports anywhere in its file."""
    path, found = MODULES[module], set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}".rstrip(".")
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(m for m in map(_resolve, names) if m and m != module)
    return found


def _layer(module: str) -> tuple[str, int]:
    top = module.split(".")[0]
    return top, RANK[top]


def _replicas_part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "_exports"


def test_the_tree_is_what_this_test_reads() -> None:
    assert {"replicas.engine.scoring_engine", "cluster.mesh", "app.ingress"} <= set(MODULES)
    assert "cluster.mesh" in imports_of("replicas.engine.scoring_engine")
    # lazy exports resolve to the module that defines the name
    assert "replicas.engine.memory" in imports_of("replicas.serving.deployment")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_top_level_imports_point_down(module: str) -> None:
    top, rank = _layer(module)
    for target in imports_of(module):
        other, other_rank = _layer(target)
        assert other == top or other_rank < rank, (
            f"{module} imports {target} ({other} is not below {top})"
        )


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("replicas.")))
def test_replicas_parts_import_down(module: str) -> None:
    rank = REPLICAS_RANK[_replicas_part(module)]
    for target in imports_of(module):
        if target.startswith("replicas."):
            part = _replicas_part(target)
            assert REPLICAS_RANK[part] <= rank, (
                f"{module} imports {target} (replicas.{part} is above)"
            )


def test_no_module_cycles() -> None:
    graph = {module: imports_of(module) for module in MODULES}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                loop = [*path[path.index(target) :], target] if target in path else [target]
                pytest.fail(f"import cycle: {' -> '.join(loop)}")
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
