"""What the repository says must be true for any reader on any machine: no history labels (which round of
work measured or changed what belongs in git, not in the code or the docs) and no absolute paths of the machine
it was written on. Scans README.md, docs/, hrag_cli/, bench/, tests/, the Makefile and CI files."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("README.md", "Makefile", "pyproject.toml", ".ci", "docs", "hrag_cli", "bench", "tests")
SUFFIXES = {".py", ".md", ".toml", ".txt", ".sh", ".json", ".jsonl", ".cfg", ".yml", ".yaml", ""}
SKIP_DIRS = {"__pycache__", ".pytest_cache", "fixtures"}
THIS = Path(__file__).resolve()

ORDINAL = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|last|this|previous|earlier|next)"
# (name, pattern): each names what it catches, so a failure says what to rewrite
FORBIDDEN = [
    ("a work session named as history", re.compile(rf"\b{ORDINAL} session\b", re.I)),
    ("a work part label such as 'part 12w2'", re.compile(r"\bpart \d+[a-z]+\d*\b", re.I)),
    ("an issue number", re.compile(r"\bissues? ?[-#]?\d+\b", re.I)),
    ("a numbered target", re.compile(r"\btargets? \d+\b", re.I)),
    ("a document outside the repository (ADR)", re.compile(r"\bADR-\d+")),
    ("the design document outside the repository (use docs/design.md)", re.compile(r"\bDESIGN\.md\b")),
    ("an absolute path of this machine", re.compile(r"(?<![\w.~])/(?:work|root|home/\w+|tmp)/")),
]


def scanned_files() -> list[Path]:
    out: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            out.append(path)
        elif path.is_dir():
            for f in sorted(path.rglob("*")):
                if (f.is_file() and f.suffix in SUFFIXES and not SKIP_DIRS.intersection(f.parts)
                        and f.resolve() != THIS):
                    out.append(f)
    return out


def offences(text: str) -> list[tuple[int, str, str]]:
    found = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        for what, rx in FORBIDDEN:
            m = rx.search(line)
            if m:
                found.append((lineno, what, m.group(0)))
    return found


def test_no_history_labels_or_machine_paths():
    problems = []
    for f in scanned_files():
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for lineno, what, hit in offences(text):
            problems.append(f"{f.relative_to(ROOT)}:{lineno}: {what}: {hit!r}")
    assert not problems, "\n".join(problems)


def test_the_patterns_catch_what_they_name():
    caught = {what for _, what, _ in offences(
        "measured in the fifth session\nsee part 12w2\nas issue 12 asks\nissue-7 report\n(target 5)\n"
        "ADR-0002 phase 3\nDESIGN.md §3\ndata in /work/shared/bench\nwork dir /tmp/hrag-scale\n")}
    assert caught == {what for what, _ in FORBIDDEN}


def test_the_patterns_leave_ordinary_words_alone():
    assert offences(
        "session = QuerySession(project, settings)\n@pytest.fixture(scope=\"session\")\n"
        "gleaning round 1 lost\nsummary_target_tokens = 600\nsee docs/design.md\nrel = Path('out/tmp/x')\n"
        "a partial chunk\nthe target type of a relation\n") == []
