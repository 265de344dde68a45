"""docs/semantics.md is the spec the code cites ("semantics N"): every number cited in the
code is defined there, and the README points to it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("app", "replicas", "cluster", "planning", "batch", "loadtest", "tests")
CITED = re.compile(r"semantics ((?:\d+)(?:(?:, | and )\d+)*)", re.IGNORECASE)


def cited_numbers() -> dict[int, str]:
    """Each rule number the code cites, with one file that cites it."""
    cited: dict[int, str] = {}
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            for match in CITED.finditer(path.read_text()):
                for number in re.findall(r"\d+", match.group(1)):
                    cited.setdefault(int(number), str(path.relative_to(ROOT)))
    return cited


def defined_numbers() -> set[int]:
    text = (ROOT / "docs" / "semantics.md").read_text()
    return {int(n) for n in re.findall(r"^(\d+)\. \*\*", text, re.MULTILINE)}


def test_every_cited_rule_is_defined_in_docs_semantics() -> None:
    defined, cited = defined_numbers(), cited_numbers()
    assert defined == set(range(1, 29))  # numbered without gaps
    assert cited, "no citation found: the pattern no longer matches the code"
    missing = {number: where for number, where in cited.items() if number not in defined}
    assert not missing, missing


def test_the_readme_points_to_the_spec() -> None:
    assert "docs/semantics.md" in (ROOT / "README.md").read_text()
