"""Pointers into the documentation name a section that exists.

Code, charts and docs point at a section of a Markdown file as `<file>.md "Section"` (also
`[text](<file>.md) ("Section"`). A section is a heading, or a paragraph or list item that
opens with a bold lead (`**Network policy.**`); a heading with a parenthesis after its name
("Revocation latency under load (`bench/fanout/latency.py`)") answers to its name. The file
is found from the pointing file's folder up to the repository's root, or as a path from the
root, else it is every file of that name (a pointer to "each service's UPGRADING.md"); one
of the files so found must have the section. Migrations are not read: an applied
one is checksummed whole, its comments too.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
POINTER = re.compile(r'([\w./-]+\.md)\)?\s+\(?"([A-Z][^"\n]*)"')
HEADING = re.compile(r"^#+\s+(.+?)\s*$")
BOLD_LEAD = re.compile(r"^\s*(?:- )?\*\*([^*]+)\*\*")
READ = (".py", ".md", ".sql", ".yaml", ".yml", ".sh", ".toml", ".tpl")


def tracked() -> list[str]:
    done = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True)
    return done.stdout.split()


@cache
def sections(doc: Path) -> frozenset[str]:
    names: set[str] = set()
    for line in doc.read_text(encoding="utf-8").splitlines():
        if heading := HEADING.match(line):
            title = heading.group(1).strip("`")
            names |= {title, title.split(" (")[0]}
        elif lead := BOLD_LEAD.match(line):
            names.add(lead.group(1).rstrip(".:"))
    return frozenset(names)


def candidates(pointing: Path, target: str, files: list[str]) -> list[Path]:
    below = [folder / target for folder in (pointing.parent, *pointing.parents)]
    found = [doc for doc in (*below, ROOT / target.replace("../", "")) if doc.is_file()]
    return found or [ROOT / name for name in files if Path(name).name == Path(target).name]


def test_every_pointer_into_the_docs_names_a_section_that_exists() -> None:
    stale = []
    files = tracked()
    for name in files:
        if "/migrations/" in name or not name.endswith(READ):
            continue
        path = ROOT / name
        for pointer in POINTER.finditer(path.read_text(encoding="utf-8")):
            target, section = pointer.groups()
            docs = candidates(path, target, files)
            if not any(section in sections(doc) for doc in docs):
                stale.append(f'{name}: {target} "{section}"' + ("" if docs else " (no such file)"))
    assert stale == [], "pointers to sections that do not exist:\n" + "\n".join(stale)


def test_a_heading_answers_to_its_name_before_a_parenthesis(tmp_path: Path) -> None:
    doc = tmp_path / "notes.md"
    doc.write_text(
        "# Notes\n\n### Revocation latency (`bench/fanout/latency.py`)\n\n"
        "**Network policy.** Text.\n"
    )
    assert {"Revocation latency", "Network policy"} <= sections(doc)
    assert "Latency" not in sections(doc)
