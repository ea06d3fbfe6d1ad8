"""Every relative Markdown link in docs/ and README.md points to an existing file and heading."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

_FENCE = re.compile(r"^(`{3,}|~{3,})")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def _lines_outside_code(text: str) -> list[tuple[int, str]]:
    """Numbered lines that are not inside fenced code blocks."""
    out, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        match = _FENCE.match(line.lstrip())
        if match:
            marker = match.group(1)
            if fence is None:
                fence = marker[0]
            elif marker[0] == fence:
                fence = None
            continue
        if fence is None:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower-case, punctuation removed, spaces to -."""
    text = _INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = re.sub(r"(\*\*|__|\*)", "", text)  # emphasis markers (a single _ is a word character)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of ``path``: heading slugs (duplicates numbered as GitHub does), HTML ids."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in _lines_outside_code(path.read_text(encoding="utf-8")):
        found.update(_HTML_ANCHOR.findall(line))
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """``(line, target)`` of every relative link of ``path`` (code blocks and spans skipped)."""
    out = []
    for number, line in _lines_outside_code(path.read_text(encoding="utf-8")):
        line = _INLINE_CODE.sub("", line)
        targets = [m.group(1) for m in _LINK.finditer(line)]
        reference = _REFERENCE.match(line)
        if reference:
            targets.append(reference.group(1))
        for target in targets:
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
                continue  # http(s):, mailto:, ...
            out.append((number, target))
    return out


def broken_links(path: Path) -> list[str]:
    """``file:line: target (why)`` for each link of ``path`` that does not resolve."""
    problems = []
    for number, target in links(path):
        file_part, _, anchor = target.partition("#")
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if file_part.startswith("/"):
            dest = ROOT / unquote(file_part).lstrip("/")
        if not dest.exists():
            problems.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            problems.append(f"{where} (no heading with anchor '#{anchor}' in {dest.name})")
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    problems = broken_links(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Epoch metrics: `cp.log`", "epoch-metrics-cplog"),
        (
            "Numerics: float64 reductions and negative variances",
            "numerics-float64-reductions-and-negative-variances",
        ),
        (
            "`register_instruments(register: Callable[[Any], None]) -> None`",
            "register_instrumentsregister-callableany-none---none",
        ),
        ("What's new?", "whats-new"),
        ("A [link](x.md) and **bold**", "a-link-and-bold"),
    ],
)
def test_slug_follows_github(heading, anchor):
    assert slug(heading) == anchor


def test_broken_links_are_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "b.md").write_text("# Title\n\n## Sub section\n\n## Sub section\n")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#sub-section) [dup](b.md#sub-section-1) [self](#top)\n"
        "# Top\n[gone](missing.md) [anchor](b.md#nope) [web](https://x.org/y.md)\n"
        "```\n[in code](nothing.md)\n```\n`[span](nothing.md)`\n"
    )
    assert broken_links(page) == [
        "a.md:3: missing.md (no such file)",
        "a.md:3: b.md#nope (no heading with anchor '#nope' in b.md)",
    ]
