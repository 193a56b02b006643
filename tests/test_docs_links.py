"""Every link in README.md, CHANGELOG.md, BENCHMARKS.md and docs/ resolves
inside the repository.

A reader has the repository and nothing else: a link (or a file named in
the text, such as `docs/sharding.md` or `../shared/PITFALLS.md`) that leaves
the repository root, or names a file that is not there, is broken for them
even where it happens to resolve on the machine that wrote it.

Checked, outside fenced code blocks:

- Markdown links and images `[text](target)`, reference definitions
  `[label]: target`, autolinks `<https://...>`, HTML `href=`/`src=`;
- Markdown files named in the text, in backticks or not (`BENCHMARKS.md`,
  `docs/clients.md`), resolved from the page or from the repository root.

A relative target must name an existing file or folder under the root; a
`#fragment` into a Markdown page must name one of its headings, slugged as
GitHub does (lower case, punctuation dropped, spaces to hyphens, `-1`,
`-2` for repeats). External http(s) links are not fetched (no network), only
checked to be well formed; no other scheme, and no absolute path, is
allowed.
"""

from __future__ import annotations

import glob
import os
import re
import urllib.parse

import pytest
from conftest import ROOT

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
# [text](target "title"); the text may hold one level of brackets and span
# lines; the target may be wrapped in <>
_INLINE = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"
    r"\(\s*(?:<(?P<angled>[^>]*)>|(?P<bare>[^\s()]*(?:\([^\s()]*\)[^\s()]*)*))"
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(?P<target>[^\s>]+)>?", re.M)
_AUTOLINK = re.compile(r"<(?P<target>[A-Za-z][A-Za-z0-9+.-]*:[^\s<>]*)>")
_HTML = re.compile(r"""\b(?:href|src)\s*=\s*["'](?P<target>[^"']*)["']""")
# a Markdown file named in the text: docs/x.md, ../x.md, BENCHMARKS.md
_MD_NAME = re.compile(
    r"(?<![\w/.\-:])(?P<target>(?:\.\.?/)*[\w.\-]+(?:/[\w.\-]+)*\.md"
    r"(?:#[\w\-]+)?)(?![\w/])"
)
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(?P<text>.*?)[ \t#]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_URL_HOST = re.compile(r"^[A-Za-z0-9.-]+\.[A-Za-z]{2,}(:\d+)?$|^localhost")


def pages() -> list[str]:
    names = ["README.md", "CHANGELOG.md", "BENCHMARKS.md"]
    found = [n for n in names if os.path.exists(os.path.join(ROOT, n))]
    docs = glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    return found + sorted(os.path.relpath(p, ROOT) for p in docs)


def prose(text: str) -> list[str]:
    """The page's lines with fenced code blocks blanked (numbers kept)."""
    out, fence = [], None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            out.append("")
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
            out.append("")
        else:
            out.append(line)
    return out


def _plain(heading: str) -> str:
    """A heading as GitHub renders it to text: no links, code or emphasis."""
    heading = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    heading = heading.replace("`", "")
    heading = re.sub(r"<[^>]+>", "", heading)
    return heading.replace("*", "")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading (before the -1, -2 of repeats)."""
    text = _plain(heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    lines = prose(raw)
    seen: dict[str, int] = {}
    out = set()
    for i, line in enumerate(lines):
        m = _HEADING.match(line)
        if m:
            text = m.group("text")
        elif (
            i > 0
            and _SETEXT.match(line)
            and lines[i - 1].strip()
            and not _HEADING.match(lines[i - 1])
        ):
            text = lines[i - 1]
        else:
            continue
        base = slug(text)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    # explicit anchors: <a name="x"> / id="x"
    out.update(re.findall(r"""<a\s+(?:name|id)\s*=\s*["']([^"']+)["']""", raw))
    return out


def links(page: str) -> list[tuple[int, str, str]]:
    """`(line, target, kind)` for every link and named file of a page."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return links_in(f.read())


def links_in(markdown: str) -> list[tuple[int, str, str]]:
    """`(line, target, kind)`; kind "link" or "name" (a file named)."""
    text = "\n".join(prose(markdown))
    spans = []

    def line_of(pos):
        return text.count("\n", 0, pos) + 1

    def code_free(t):
        # a code span is no link, but may name a file: keep its text for
        # _MD_NAME, blank it for the link patterns
        def blank(m):
            spans.append((m.start(), m.group(2)))
            return " " * len(m.group(0))

        return _CODE_SPAN.sub(blank, t)

    plain = code_free(text)
    found = []
    for m in _INLINE.finditer(plain):
        target = m.group("angled")
        if target is None:
            target = m.group("bare")
        found.append((line_of(m.start()), target, "link"))
    for pattern in (_REFERENCE, _AUTOLINK, _HTML):
        for m in pattern.finditer(plain):
            found.append((line_of(m.start()), m.group("target"), "link"))
    linked = {t for _, t, _ in found}
    for m in _MD_NAME.finditer(plain):
        if m.group("target") not in linked:
            found.append((line_of(m.start()), m.group("target"), "name"))
    for pos, body in spans:
        for m in _MD_NAME.finditer(body.strip()):
            if m.group(0) == body.strip():
                found.append((line_of(pos), m.group("target"), "name"))
    return found


def problem(page: str, target: str, kind: str) -> str | None:
    """What is wrong with one target of `page`, or None."""
    if not target:
        return "empty link target"
    parsed = urllib.parse.urlsplit(target)
    if parsed.scheme:
        if kind == "name":
            return None
        if parsed.scheme not in ("http", "https", "mailto"):
            return f"scheme {parsed.scheme!r} is not allowed (http, https)"
        if parsed.scheme == "mailto":
            return None if "@" in parsed.path else "malformed mailto"
        if not _URL_HOST.match(parsed.netloc) or " " in target:
            return "malformed URL"
        return None
    path, _, fragment = target.partition("#")
    path = urllib.parse.unquote(path)
    if path.startswith("/") or os.path.isabs(path):
        return "absolute path: link relative to the page instead"
    here = os.path.dirname(os.path.join(ROOT, page))
    candidates = [
        os.path.join(here, path) if path else os.path.join(ROOT, page)
    ]
    if kind == "name":
        candidates.append(os.path.join(ROOT, path))  # named from the root
    root = os.path.realpath(ROOT)
    outside = []
    for candidate in candidates:
        resolved = os.path.realpath(candidate)
        if os.path.commonpath([resolved, root]) != root:
            outside.append(resolved)
            continue
        if not os.path.exists(resolved):
            continue
        if fragment and resolved.endswith(".md"):
            if fragment not in anchors(resolved):
                rel = os.path.relpath(resolved, ROOT)
                return f"no heading with anchor #{fragment} in {rel}"
        return None
    if outside:
        return (
            f"leaves the repository (to {outside[0]}): link to a file inside it"
        )
    return "no such file in the repository"


@pytest.mark.parametrize("page", pages())
def test_every_link_resolves_inside_the_repository(page):
    bad = []
    for line, target, kind in links(page):
        why = problem(page, target, kind)
        if why:
            bad.append(f"{page}:{line}: {target}: {why}")
    assert not bad, "\n".join(bad)


def test_the_pages_are_found_and_have_links():
    assert {"README.md", "docs/checkpointing.md"} <= set(pages())
    assert len(links("README.md")) >= 10


@pytest.mark.parametrize(
    "heading, anchor",
    [
        ("8-bit Adam and AdamW", "8-bit-adam-and-adamw"),
        ("Stage 2 and TensorFlow's missing reduce-scatter",
         "stage-2-and-tensorflows-missing-reduce-scatter"),
        ("Activation checkpointing (`tf.recompute_grad`)",
         "activation-checkpointing-tfrecompute_grad"),
        ("Exactness against full-batch training (`benchmarks/exactness.py`)",
         "exactness-against-full-batch-training-benchmarksexactnesspy"),
        ("[Link](x.md) and **bold**", "link-and-bold"),
    ],
)  # fmt: skip
def test_slug_follows_github(heading, anchor):
    assert slug(heading) == anchor


def test_repeated_headings_get_numbered_anchors(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# A\n\n## Notes\n\n```\n# not a heading\n```\n## Notes\n")
    assert anchors(str(page)) == {"a", "notes", "notes-1"}


@pytest.mark.parametrize(
    "target, kind, expected",
    [
        ("../shared/PITFALLS.md", "name", "leaves the repository"),
        ("../../etc/passwd", "link", "leaves the repository"),
        ("/work/x.md", "link", "absolute path"),
        ("pitfalls.md", "link", None),
        ("docs/pitfalls.md", "name", None),
        ("missing.md", "link", "no such file"),
        ("sharding.md#8-bit-adam-and-adamw", "link", None),
        ("sharding.md#no-such-heading", "link", "no heading"),
        ("#the-quantisation-scheme", "link", None),
        ("https://keepachangelog.com/en/1.1.0/", "link", None),
        ("https//keepachangelog.com", "link", "no such file"),
        ("https://not a host/", "link", "malformed URL"),
        ("file:///etc/passwd", "link", "not allowed"),
    ],
)
def test_problem_catches_what_a_reader_would_hit(target, kind, expected):
    why = problem("docs/optimizers.md", target, kind)
    if expected is None:
        assert why is None
    else:
        assert why is not None and expected in why


def test_links_are_parsed_across_lines_and_outside_code():
    text = (
        'See [the\nguide](docs/a.md#x "t") and ![img](<b c.png>).\n'
        "`../shared/P.md` and docs/e.md, but `[no](link.md)` is code.\n"
        "```\n[fenced](f.md)\n```\n[ref]: https://example.org/a\n"
        '<https://example.com> <a href="h.md">h</a>\n'
    )
    lines = prose(text)
    assert lines[3] == "" and lines[4] == ""
    assert links_in(text) == [
        (1, "docs/a.md#x", "link"),
        (2, "b c.png", "link"),
        (7, "https://example.org/a", "link"),
        (8, "https://example.com", "link"),
        (8, "h.md", "link"),
        (3, "docs/e.md", "name"),
        (3, "../shared/P.md", "name"),
    ]
