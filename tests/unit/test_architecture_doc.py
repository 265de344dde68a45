"""docs/architecture.md names the tree as it is: every path and module it names in backticks
exists, every ``Class.method`` is defined in the class's file, every ``function()`` is
defined in a module the same paragraph names (anywhere in the tree when it names none), and
every class-like name occurs in the source. Text only: nothing is imported."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
PACKAGES = ("cluster", "replicas", "app", "planning", "batch", "loadtest", "tests")
TICKED = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)*(?:\.(?:py|md|yaml|toml)|/)")
MODULE = re.compile("(?:" + "|".join(PACKAGES) + r")(?:\.\w+)*")
RUN_MODULE = re.compile(r"python -m ([\w.]+)")
METHOD = re.compile(r"(_?[A-Z]\w*)\.(\w+)")
FUNCTION = re.compile(r"(\w+)\(\)")
CLASS = re.compile(r"_?[A-Z][A-Za-z0-9_]*[a-z][A-Za-z0-9_]*|[A-Z][A-Z0-9_]+")
BLOCK_START = re.compile(r"\s*(?:\d+\.|-|\|)\s")


def blocks(text: str) -> list[str]:
    """Paragraphs, list items and table rows, outside fenced code."""
    found: list[list[str]] = [[]]
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            found.append([])
            continue
        if fenced:
            continue
        if not line.strip() or BLOCK_START.match(line):
            found.append([])
        found[-1].append(line)
    return [" ".join(lines) for lines in found if lines]


def ticked(block: str) -> list[str]:
    return [token.strip() for token in TICKED.findall(block)]


@cache
def sources() -> dict[Path, str]:
    return {path: path.read_text() for p in PACKAGES for path in sorted((ROOT / p).rglob("*.py"))}


def module_file(dotted: str) -> tuple[Path | None, list[str]]:
    """The deepest module file of the tree ``dotted`` names, and the names after it."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:end])
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path, parts[end:]
    return None, parts


def defines(source: str, name: str) -> bool:
    """``def name``, ``class name`` or ``name =`` / ``name:`` at the start of a line."""
    pattern = rf"^\s*(?:(?:async\s+)?def|class)\s+{re.escape(name)}\b|^\s*{re.escape(name)}\s*[:=]"
    return re.search(pattern, source, re.MULTILINE) is not None


def named_modules(block: str) -> list[Path]:
    """The source files a paragraph names, as paths or dotted modules."""
    found = []
    for token in ticked(block):
        if PATH.fullmatch(token) and token.endswith(".py"):
            found.append(ROOT / token)
        elif MODULE.fullmatch(token):
            path, _ = module_file(token)
            found.extend([path] if path else [])
    return [path for path in found if path.is_file()]


def page_blocks() -> list[str]:
    return blocks(PAGE.read_text())


def test_every_path_the_page_names_exists() -> None:
    paths = {t for b in page_blocks() for t in ticked(b) if PATH.fullmatch(t)}
    assert len(paths) > 40, "the path pattern no longer matches the page"
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, missing


def test_every_module_the_page_names_resolves() -> None:
    tokens = {t for b in page_blocks() for t in ticked(b)}
    dotted = {t for t in tokens if MODULE.fullmatch(t)}
    dotted |= {m.group(1) for t in tokens for m in RUN_MODULE.finditer(t)}
    assert {"app.builder.build_app", "planning.plan"} <= dotted
    unresolved = []
    for name in sorted(dotted):
        path, rest = module_file(name)
        if path is None or (rest and not re.search(rf"\b{rest[0]}\b", sources()[path])):
            unresolved.append(name)
    assert not unresolved, unresolved


def test_every_method_is_defined_in_its_class_file() -> None:
    methods = {m.groups() for b in page_blocks() for t in ticked(b) if (m := METHOD.fullmatch(t))}
    assert ("ScoringReplica", "score_timed") in methods
    missing = []
    for cls, method in sorted(methods):
        files = [text for text in sources().values() if defines(text, cls)]
        if not any(defines(text, method) for text in files):
            missing.append(f"{cls}.{method}")
    assert not missing, missing


def test_every_function_is_defined_in_a_module_its_paragraph_names() -> None:
    checked, missing = 0, []
    for block in page_blocks():
        files = named_modules(block) or list(sources())
        for token in ticked(block):
            match = FUNCTION.fullmatch(token)
            if match is None:
                continue
            checked += 1
            if not any(defines(sources()[path], match.group(1)) for path in files):
                missing.append(f"{token} (in: {[str(f.relative_to(ROOT)) for f in files][:4]})")
    assert checked > 30, "the function pattern no longer matches the page"
    assert not missing, missing


def test_every_class_name_occurs_in_the_source() -> None:
    names = {t for b in page_blocks() for t in ticked(b) if CLASS.fullmatch(t)}
    assert {"ScoringEngine", "ScoreIngress", "Engine"} <= names
    text = "\n".join(sources().values())
    missing = sorted(n for n in names if re.search(rf"\b{re.escape(n)}\b", text) is None)
    assert not missing, missing


def test_the_readme_points_to_the_page() -> None:
    assert "docs/architecture.md" in (ROOT / "README.md").read_text()
