"""docs/architecture.md stays a true map: every module of rlft/ has a line in its module table, and every
file it names (with the name it points at inside, `file.py: NAME`) exists."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()
NAMED = re.compile(r"`([A-Za-z_][\w/]*\.py)(?:: ([A-Z_]+))?`")


def table_modules() -> set[str]:
    """Modules the table's first column names: `dir/a.py`, `b.py` (b in a's directory), `dir/*` (all of dir)."""
    covered = set()
    for line in DOC.split("## Modules", 1)[1].split("\n## ", 1)[0].splitlines():
        if not line.startswith("| `"):
            continue
        directory = ""
        for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
            if name.endswith("/*"):
                covered |= {p.relative_to(ROOT / "rlft").as_posix() for p in (ROOT / "rlft" / name[:-2]).glob("*.py")}
                continue
            if "/" in name:
                directory = name.rsplit("/", 1)[0] + "/"
            covered.add(name if "/" in name else directory + name)
    return covered


def test_every_module_has_a_line_in_the_module_table():
    modules = {p.relative_to(ROOT / "rlft").as_posix() for p in (ROOT / "rlft").rglob("*.py")
               if p.name != "__init__.py" or p.parent.name == "trainer"}
    covered = table_modules()
    assert not modules - covered, f"modules missing from docs/architecture.md's table: {sorted(modules - covered)}"
    assert not covered - modules - {p for p in covered if p.endswith("__init__.py")}, sorted(covered - modules)


def test_every_file_and_name_the_map_points_at_exists():
    files = {p.relative_to(ROOT / "rlft").as_posix() for p in (ROOT / "rlft").rglob("*.py")}
    basenames = {f.rsplit("/", 1)[-1] for f in files}
    for path, name in NAMED.findall(DOC):
        if path.startswith("scripts/"):
            assert (ROOT / path).is_file(), path
            continue
        assert path in files or ("/" not in path and path in basenames), f"docs/architecture.md names {path}"
        if name:
            assert name in (ROOT / "rlft" / path).read_text(), f"{path} has no {name}"
