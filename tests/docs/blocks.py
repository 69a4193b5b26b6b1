"""Code blocks of the README and docs/*.md, as a reader sees them.

A block preceded (on the line before its opening fence, blank lines allowed) by
``<!-- not-run: reason -->`` is documented as not runnable here, with its reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
_NOT_RUN = re.compile(r"<!--\s*not-run:\s*(?P<reason>.+?)\s*-->")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None  # the reason, when marked not-run

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path`` (indentation of the fence removed from its lines)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, lang, start = len(match["indent"]), match["lang"], i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        code = "\n".join(line[indent:] for line in lines[start + 1 : j]) + "\n"
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = _NOT_RUN.search(lines[k]) if k >= 0 else None
        out.append(Block(path, start + 1, lang, code, marker["reason"] if marker else None))
        i = j + 1
    return out


def all_blocks(lang: str) -> list[Block]:
    return [b for path in DOC_FILES for b in blocks(path) if b.lang == lang]
