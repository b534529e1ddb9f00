"""The README and docs/ stay true: every relative link (and its #anchor) leads somewhere, every
repository path they name in code spans exists (modules move), the README's keys table is the app's
bindings, its commands table the CLI's subcommands, and it stays a five-minute read. Each check is
shown to bite on a damaged copy."""

from __future__ import annotations

import argparse
import re
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 250

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
HEADING = re.compile(r"^#{1,6} (.+)$", re.M)
ROOMS = "agent api benchmarks cli docs examples metrics protocol scripts strategies tests tui".split()
REPO_PATH = re.compile(rf"`((?:{'|'.join(ROOMS)})/[^`\s]*)`")
"""A code span that names a file or folder of the repository (`agent/loop/runner.py`, `tests/x.py::test_y`)."""

SHOWN_AS = {
    "question_mark": "?",
    "slash": "/",
    "enter": "Enter",
    "escape": "Esc",
    "up": "↑",
    "down": "↓",
    "pageup": "PgUp",
    "pagedown": "PgDn",
    "home": "Home",
    "end": "End",
}
"""Textual's key names as the README (and the keys help) write them."""


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {anchor(h) for h in HEADING.findall(FENCE.sub("", text))}


def broken_links(page: Path, text: str) -> list[str]:
    """The relative links of a page (outside code blocks) whose file, or whose heading, is missing."""
    broken = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif fragment and file.suffix == ".md":
            body = text if file == page else file.read_text()
            if fragment not in anchors(body):
                broken.append(target)
    return broken


def missing_paths(text: str) -> list[str]:
    """The repository paths a page names in code spans that do not exist (patterns like `tests/*_bites` aside)."""
    named = (span.split("::")[0] for span in REPO_PATH.findall(text))
    return [p for p in named if not any(c in p for c in "*{<>") and not (REPO / p).exists()]


def section(text: str, title: str) -> str:
    body = text.split(f"\n## {title}\n", 1)[1]
    return body.split("\n## ", 1)[0]


def table_first_cells(text: str) -> list[str]:
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    return [row.split("|")[1] for row in rows[1:]]  # rows[0]: the header


def readme_keys(text: str) -> set[str]:
    """The keys the README's keys table names; `1`–`6` stands for each digit between."""
    keys = set()
    for cell in table_first_cells(section(text, "Keys")):
        for first, last in re.findall(r"`(\d)`–`(\d)`", cell):
            keys |= {str(d) for d in range(int(first), int(last) + 1)}
        keys |= set(re.findall(r"`([^`]+)`", re.sub(r"`\d`–`\d`", "", cell)))
    return keys


def app_keys() -> set[str]:
    """Every key the app binds itself (the footer's, the help's and the hidden ones), as shown."""
    from ringtop.tui.app import RingtopApp

    keys = {key for b in RingtopApp.BINDINGS for key in b.key.split(",")}
    keys.add(RingtopApp.COMMAND_PALETTE_BINDING)
    return {SHOWN_AS.get(k, k) for k in keys}


def readme_commands(text: str) -> set[str]:
    cells = table_first_cells(section(text, "Commands"))
    return {verb for cell in cells for verb in re.findall(r"`ringtop ([a-z-]+)`", cell)}


def cli_commands() -> set[str]:
    from ringtop.cli.main import build_parser

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_resolves(page):
    assert broken_links(page, page.read_text()) == []


def test_a_broken_link_or_anchor_is_found():
    text = README.read_text()
    assert broken_links(README, text + "\n[gone](docs/no-such-page.md)\n") == ["docs/no-such-page.md"]
    no_heading = "docs/screen.md#no-such-heading"
    assert broken_links(README, text + f"\n[gone]({no_heading})\n") == [no_heading]
    assert broken_links(README, text + "\n```\n[in code](nowhere.md)\n```\n") == []


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_path_a_page_names_exists(page):
    assert missing_paths(page.read_text()) == []


def test_a_moved_module_is_found():
    text = "the loop: `agent/loop/runner.py`, `agent/loop/no_such_module.py`, its tests `tests/unit/`"
    assert missing_paths(text) == ["agent/loop/no_such_module.py"]
    assert missing_paths("`tests/unit/test_docs.py::test_a_moved_module_is_found` `tests/*_bites`") == []


def test_the_anchor_rule_is_githubs():
    assert anchor("One timeline of every rank (`ringtop trace`)") == "one-timeline-of-every-rank-ringtop-trace"
    assert anchor("Many ranks: digests") == "many-ranks-digests"
    assert anchor("Install: choose your torch first") == "install-choose-your-torch-first"


def test_the_keys_table_is_the_apps_bindings_both_ways():
    said, bound = readme_keys(README.read_text()), app_keys()
    assert bound - said == set(), "keys the app binds that the README's table leaves out"
    assert said - bound == set(), "keys the README's table names that the app does not bind"


def test_the_keys_help_offers_no_key_the_table_leaves_out():
    from ringtop.tui.app import TABS
    from ringtop.tui.keys_help import keys_help_rows

    said = readme_keys(README.read_text())
    offered = {k for _, rows in keys_help_rows(TABS) for keys, _ in rows for k in keys.split()}
    offered = {k for k in offered if not re.fullmatch(r"\d-\d", k)} | {str(d) for d in range(1, len(TABS) + 1)}
    assert offered - said == set()


def test_a_missing_or_extra_key_is_found():
    text = README.read_text()
    without_stop = "\n".join(line for line in text.splitlines() if not line.startswith("| `X` |"))
    assert app_keys() - readme_keys(without_stop) == {"X"}
    with_extra = text.replace("| `q` |", "| `q`, `Z` |", 1)
    assert readme_keys(with_extra) - app_keys() == {"Z"}


def test_the_commands_table_is_the_clis_subcommands_both_ways():
    said, parsed = readme_commands(README.read_text()), cli_commands()
    assert parsed - said == set(), "subcommands the README's table leaves out"
    assert said - parsed == set(), "commands the README's table names that the CLI has not"
    lines = README.read_text().splitlines()
    without_trace = "\n".join(line for line in lines if not line.startswith("| `ringtop trace`"))
    assert parsed - readme_commands(without_trace) == {"trace"}


def lines_over(text: str) -> int:
    """How many lines a page has beyond the README's budget (0: within it)."""
    return max(0, len(text.splitlines()) - README_MAX_LINES)


def test_the_readme_is_a_five_minute_read():
    assert lines_over(README.read_text()) == 0, "README.md is too long: move detail into docs/"


def test_a_long_readme_is_found():
    text = README.read_text()
    grown = text + "\n" * (README_MAX_LINES - len(text.splitlines()) + 1)
    assert lines_over(grown) == 1
