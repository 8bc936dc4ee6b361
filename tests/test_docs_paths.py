"""Every file the README and docs/ point at is in the repository (tracked, or new and not ignored; so a file that
exists only in one checkout, like a git-ignored run's output, does not count): markdown links and images (relative
to the page), repository paths written as code (`benchmarks/results/...`, `scripts/up.sh`, in inline code or in
command blocks), and the modules of `python -m sessiongate.benchmarks...` commands. Output paths of a command are
included on
purpose: a doc that says "full report: X" must ship X."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
# The repository's own top-level folders (tracked ones): a run's output folder such as `test-artifacts/` is not one,
# so a doc may name what a test writes there.
TOP_LEVEL = sorted(
    {
        name.split("/", 1)[0]
        for name in subprocess.run(
            ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.split("\n")
        if "/" in name
    }
)
LINK = re.compile(r"\]\(([^)\s]+)\)")
# A repository path: a top-level folder, then path characters; not part of a longer word or path (`../x`, `a/x`).
REPO_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(map(re.escape, TOP_LEVEL)) + r")/[\w./-]*)")
MODULE = re.compile(r"python -m ((?:benchmarks|sessiongate|sglang_ext|gateway|sessions)(?:\.\w+)*)")
CODE = re.compile(r"```.*?```|`[^`\n]+`", re.DOTALL)
PLACEHOLDER = ("<", "*", "{", "[")  # `records/<system>-<load>.jsonl.gz`: the part before it must exist


@cache
def _in_repository() -> frozenset[Path]:
    """Tracked files, new files git does not ignore, and every folder above them."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    files = {REPO / name for name in listed if name and (REPO / name).exists()}
    return frozenset(files | {parent for f in files for parent in f.parents})


def _cited(page: Path) -> list[tuple[str, Path]]:
    text = page.read_text()
    cited: list[tuple[str, Path]] = []
    for target in LINK.findall(text):
        path = target.split("#", 1)[0]
        if path and not re.match(r"^[a-z]+:", path):
            cited.append((target, (page.parent / path).resolve()))
    for code in CODE.findall(text):
        for match in REPO_PATH.finditer(code):
            path = match.group(1).rstrip(".,:;")
            following = code[match.end() : match.end() + 1]
            if following in PLACEHOLDER:
                path = path.rsplit("/", 1)[0]  # only the folder the placeholder lives in
            cited.append((match.group(1), REPO / path))
    for module in MODULE.findall(text):
        base = REPO / module.replace(".", "/")
        cited.append((f"python -m {module}", base if base.is_dir() else base.with_suffix(".py")))
    return cited


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_cited_path_exists(page: Path) -> None:
    cited = _cited(page)
    assert cited, f"{page.name} cites nothing: the patterns are wrong"
    missing = sorted(
        {
            f"{text} -> {path.relative_to(REPO) if path.is_relative_to(REPO) else path}"
            for text, path in cited
            if path.resolve() not in _in_repository()
        }
    )
    assert missing == []


def test_the_patterns_see_what_the_docs_cite() -> None:
    cited = {text for text, _ in _cited(REPO / "docs" / "benchmarks.md")}
    assert "../benchmarks/results/replay-sharegpt-cpu/latency_vs_load.png" in cited
    assert "benchmarks/results/replay-sharegpt-cpu/" in cited
    assert "python -m sessiongate.benchmarks.router_overhead" in {text for text, _ in _cited(REPO / "README.md")}
