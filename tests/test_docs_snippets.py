"""Every ```python block of README.md and docs/*.md runs as written.

The blocks of one page run in order in one namespace, as a reader who
follows the page would run them (a page's first block may build the model
that later blocks use), in a scratch directory (blocks write files such as
`model.keras`). A block opts out only with a visible marker on the line
before its fence, which must say why:

    <!-- snippet: skip (needs a GPU) -->

Pages added later (docs/*.md) are collected without listing them here.
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import re

import pytest
from conftest import ROOT

_FENCE = re.compile(r"^```python[ \t]*$")
_SKIP = re.compile(r"<!--\s*snippet:\s*skip\s*(?:\((?P<why>[^)]*)\))?\s*-->")


def _pages():
    pages = [os.path.join(ROOT, "README.md")]
    pages += sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return [os.path.relpath(p, ROOT) for p in pages]


def python_blocks(text: str):
    """`(first line number, source, skip reason or None)` per block."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if not _FENCE.match(lines[i].strip()):
            i += 1
            continue
        start = i + 1
        end = start
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        before = next(
            (lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), ""
        )
        marker = _SKIP.search(before)
        why = None
        if marker:
            why = (marker.group("why") or "").strip()
            if not why:
                raise ValueError(
                    f"line {i}: a snippet skip marker must say why, e.g. "
                    "<!-- snippet: skip (needs a GPU) -->"
                )
        blocks.append((start + 1, "\n".join(lines[start:end]), why))
        i = end + 1
    return blocks


def test_blocks_are_found_and_skips_need_a_reason():
    text = "a\n```python\nx = 1\n```\n<!-- snippet: skip (needs a TPU) -->\n"
    text += "\n```python\ntpu()\n```\n```bash\nls\n```\n"
    assert python_blocks(text) == [
        (3, "x = 1", None),
        (8, "tpu()", "needs a TPU"),
    ]
    with pytest.raises(ValueError, match="must say why"):
        python_blocks("<!-- snippet: skip -->\n```python\nx\n```\n")


@pytest.mark.parametrize("page", _pages())
def test_page_snippets_run(page, tmp_path, monkeypatch):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        blocks = python_blocks(f.read())
    runnable = [(line, src) for line, src, why in blocks if why is None]
    if not runnable:
        pytest.skip(f"{page}: no runnable python blocks")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__snippet__"}
    for line, source in runnable:
        code = compile(source, f"{page}:{line}", "exec")
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                exec(code, namespace)  # noqa: S102 - the docs' own code
            except Exception as e:
                raise AssertionError(
                    f"{page}, block at line {line} fails: "
                    f"{type(e).__name__}: {e}"
                ) from e
