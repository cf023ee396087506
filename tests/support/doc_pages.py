"""The project's documentation pages as the tests read them: the README and every page under
docs/, their sections by heading, and their links.

A test that checks what a page says finds the section by its heading wherever it lives, so a
section can move between pages without the check going away; a heading that is missing, or
that two pages share, fails the test instead of checking the wrong text.
"""

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]


def pages() -> list[str]:
    """The README first, then the docs pages, as paths relative to the repository."""
    return ["README.md", *sorted(f"docs/{path.name}" for path in (REPOSITORY / "docs").glob("*.md"))]


@cache
def text(page: str) -> str:
    return (REPOSITORY / page).read_text()


@dataclass(frozen=True, slots=True)
class Heading:
    line: int  # 0-based index into the page's lines
    level: int
    title: str


def headings(page_text: str) -> list[Heading]:
    """The page's headings (a `#` line inside a fenced block is a comment, not a heading)."""
    found = []
    in_fence = False
    for number, line in enumerate(page_text.split("\n")):
        if line.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and (heading := re.fullmatch(r"(#+) (.*)", line)):
            found.append(Heading(number, len(heading[1]), heading[2]))
    return found


def section_of(page_text: str, heading: Heading) -> str:
    """The text from a heading to the next heading of the same or a higher level."""
    lines = page_text.split("\n")
    following = [
        other.line
        for other in headings(page_text)
        if other.line > heading.line and other.level <= heading.level
    ]
    return "\n".join(lines[heading.line + 1 : following[0] if following else len(lines)])


def find_section(title: str) -> tuple[str, str]:
    """The page that has the heading `title`, and the section under it; exactly one page may."""
    found = [
        (page, section_of(text(page), heading))
        for page in pages()
        for heading in headings(text(page))
        if heading.title == title
    ]
    assert len(found) == 1, f"heading {title!r}: in {[page for page, _ in found] or 'no page'}, expected one"
    return found[0]


def section(title: str) -> str:
    return find_section(title)[1]


def slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(page_text: str) -> set[str]:
    """Every anchor a page's headings give (a repeated heading gets `-1`, `-2`, ...)."""
    seen: dict[str, int] = {}
    result = set()
    for heading in headings(page_text):
        base = slug(heading.title)
        count = seen.get(base, -1) + 1
        seen[base] = count
        result.add(base if count == 0 else f"{base}-{count}")
    return result


LINK = re.compile(r"\]\(([^)\s]+)\)")


def links(page_text: str) -> list[str]:
    """The targets of the page's Markdown links and images, fenced blocks left out."""
    prose = re.sub(r"^```.*?^```", "", page_text, flags=re.S | re.M)
    return LINK.findall(prose)


def broken_links(page: str) -> list[str]:
    """The links of a page that name a file that does not exist, or a heading its page lacks."""
    broken = []
    for target in links(text(page)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:: not ours to check
        path, _, anchor = target.partition("#")
        if not path:
            if anchor not in anchors(text(page)):
                broken.append(target)
            continue
        file = (REPOSITORY / page).parent / path
        if not file.exists() or (
            anchor and (file.suffix != ".md" or anchor not in anchors(file.read_text()))
        ):
            broken.append(target)
    return broken
