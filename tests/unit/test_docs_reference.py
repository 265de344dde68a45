"""docs/ and the README are a reference (how things are, how to run them), not a diary: no
session or stop narrative in their prose, and docs/testing.md's tier table counts the test
modules each tier folder holds. Pure file reads."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIERS = ("unit", "engine", "serve", "batch")
# What `python -m loadtest render` writes from docs/results/*.json: generated, not prose.
RESULT_BLOCK = re.compile(r"<!-- result: (\S+) -->.*?<!-- /result: \1 -->", re.DOTALL)
DIARY = re.compile(
    r"this stop|\bstop \d+\b|this session|this turn|last session|previous session"
    r"|not fixed in this",
    re.IGNORECASE,
)


def prose(path: Path) -> str:
    """The file's text with its generated result blocks blanked (line numbers kept)."""
    return RESULT_BLOCK.sub(lambda block: "\n" * block.group(0).count("\n"), path.read_text())


def reference_docs() -> list[Path]:
    return [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


def test_no_diary_text_in_the_docs() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}"
        for path in reference_docs()
        for number, line in enumerate(prose(path).splitlines(), 1)
        for match in DIARY.finditer(line)
    ]
    assert not found, "diary text in the docs (git keeps the history):\n" + "\n".join(found)


def test_the_diary_check_sees_prose_and_skips_result_blocks() -> None:
    text = "a\n<!-- result: x -->\nthis stop\n<!-- /result: x -->\nStop 19 and this session\n"
    found = DIARY.findall(RESULT_BLOCK.sub("", text))
    assert found == ["Stop 19", "this session"]
    assert not DIARY.search("stops 19 tests; a non-stop run; the assistant turn")


def tier_table() -> dict[str, int]:
    """docs/testing.md's tier table: folder -> its "Modules" figure."""
    rows: dict[str, int] = {}
    header: list[str] | None = None
    for line in (ROOT / "docs" / "testing.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[:1] == ["Folder"]:
            header = cells
        elif header and line.startswith("|") and cells[0].startswith("`tests/"):
            rows[cells[0].strip("`").rstrip("/")] = int(cells[header.index("Modules")])
        elif header and rows and not line.startswith("|"):
            break
    return rows


def test_the_tier_table_counts_each_folders_test_modules() -> None:
    on_disk = {
        f"tests/{tier}": len(list((ROOT / "tests" / tier).glob("test_*.py"))) for tier in TIERS
    }
    assert tier_table() == on_disk
