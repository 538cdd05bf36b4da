"""The marked shell blocks of docs/install.md, for the tests that run or check them.

Each block the doc wants tested follows an HTML comment `<!-- step: KIND -->` naming where
it runs (`build`, `node-package`, `node`, `cluster`); the tests take the blocks from the doc
itself, so a changed doc is what they run or check next time.
"""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "install.md"
KINDS = ("build", "node-package", "node", "cluster")
_BLOCK = re.compile(r"<!-- step: ([\w-]+) -->\n```sh\n(.*?)```", re.S)


def blocks(kind: str, text: str | None = None) -> list[str]:
    """The bodies of the blocks marked `kind`, in the doc's order."""
    assert kind in KINDS, kind
    found = _BLOCK.findall(DOC.read_text() if text is None else text)
    return [body for marked, body in found if marked == kind]


def marks(text: str | None = None) -> list[str]:
    """Every step mark in the doc, in order (each must precede a ```sh block)."""
    return re.findall(r"<!-- step: ([\w-]+) -->", DOC.read_text() if text is None else text)


def commands(block: str) -> list[str]:
    """The commands of a block without heredocs: continuation lines joined, comments and
    `sudo ` dropped (the VM test runs as root)."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for raw in joined.splitlines():
        line = re.sub(r"\s+#.*$", "", raw).strip()
        if line and not line.startswith("#"):
            out.append(line.removeprefix("sudo "))
    return out
