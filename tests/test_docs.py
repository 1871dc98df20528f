"""The README and docs/ cannot drift from the code: every relative link resolves (file and
heading), every `accel ...` line in a code block is accepted by the CLI's own parser."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from accel import cli

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
COMMAND = re.compile(r"^(?:\$ )?(?:[A-Z_]+=\S+ )*(accel .*)$")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in prose(page) if re.match(r"^#+ ", line)}


def prose(page: Path) -> list[str]:
    """The page's lines outside code blocks."""
    out, fenced = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def code_lines(page: Path) -> list[str]:
    """The page's lines inside code blocks, with `\\` continuations joined."""
    out, fenced, pending = [], False, ""
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            continue
        line = f"{pending} {line.strip()}" if pending else line.strip()
        pending = line[:-1] if line.endswith("\\") else ""
        if not pending:
            out.append(line)
    return out


def relative_links(page: Path) -> list[str]:
    links = (m.group(1) for line in prose(page) for m in LINK.finditer(line))
    return [link for link in links if not re.match(r"^[a-z]+:", link)]


def command_lines(page: Path) -> list[str]:
    return [m.group(1) for line in code_lines(page) if (m := COMMAND.match(line))]


def link_problem(page: Path, link: str) -> str | None:
    """Why a relative link on page does not resolve, or None."""
    path, _, anchor = link.partition("#")
    target = (page.parent / path).resolve() if path else page
    if not target.exists():
        return f"{page.name}: {link}: no file {target}"
    if anchor and target.suffix == ".md" and anchor not in headings(target):
        return f"{page.name}: {link}: no heading #{anchor} in {target.name}"
    return None


def command_problem(line: str) -> str | None:
    """Why the CLI would refuse this documented command line, or None. A synopsis
    (`accel best --study NAME [--storage URL]`) is checked for its option names only."""
    argv = shlex.split(line, comments=True)[1:]
    _, commands = cli.build_parser()
    if not argv or argv[0] not in commands:
        return f"{line}: no command {argv[:1]}; the commands are {sorted(commands)}"
    if "[" in line:
        known = set(commands[argv[0]]._option_string_actions)
        flags = {f for f in re.findall(r"--[a-z][\w-]*", line)}
        return f"{line}: unknown options {sorted(flags - known)}" if flags - known else None
    try:
        cli.parse(argv)
    except SystemExit as e:
        return f"{line}: refused by the parser (exit {e.code})"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    problems = [p for link in relative_links(page) if (p := link_problem(page, link))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_documented_command_line_parses(page, capsys):
    problems = [p for line in command_lines(page) if (p := command_problem(line))]
    assert not problems, "\n".join(problems)


def test_the_checks_catch_a_broken_link_and_a_broken_command(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[ok](page.md#top) [gone](missing.md) [no anchor](page.md#nope)\n\n"
                    "```\naccel train --no-such-flag\naccel frobnicate\n"
                    "accel best --study x [--no-such-option URL]\naccel best --study x\n```\n")
    problems = [link_problem(page, link) for link in relative_links(page)]
    assert [p is None for p in problems] == [True, False, False]
    lines = command_lines(page)
    assert len(lines) == 4
    assert [command_problem(line) is None for line in lines] == [False, False, False, True]


TEST_REF = re.compile(r"`(test_\w+\.py)::(\w+)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_named_test_exists(page):
    """`test_x.py::test_name` in a page (the reliability table, say) names a real test."""
    missing = [f"{file}::{name}" for file, name in TEST_REF.findall(page.read_text())
               if not (ROOT / "tests" / file).exists()
               or not re.search(rf"^\s*def {name}\(", (ROOT / "tests" / file).read_text(), re.M)]
    assert not missing, f"{page.name} names tests that do not exist: {missing}"


def test_the_readme_fits_on_a_screen_or_so():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300
