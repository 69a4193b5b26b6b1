"""Every repository file or folder the README names exists (docs, templates, benchmarks, tests)."""

from __future__ import annotations

import re

from tests.docs.blocks import ROOT

TOP = ("docs", "templates", "benchmarks", "tests", "beam_dp", "pipelines")
#: `path` in backticks or (path) in a link, starting at a top-level folder; {a,b} alternatives expanded
PATH = re.compile(r"[`(]((?:%s)/[A-Za-z0-9_./{},<>*-]*)[`)]" % "|".join(TOP))


def named_paths(text: str) -> list[str]:
    paths = []
    for raw in PATH.findall(text):
        if "<" in raw or "*" in raw:  # a pattern (templates/flex/<job>/, out/sum-*), not a file
            continue
        m = re.search(r"\{([^}]*)\}", raw)
        paths += [raw[:m.start()] + alt + raw[m.end():] for alt in m.group(1).split(",")] if m else [raw]
    return paths


def test_every_file_the_readme_names_exists():
    paths = named_paths((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(paths) >= 15
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, missing
