"""The fenced code blocks of the README and of the docs pages, and the mark before each
(see ``tests/unit/test_docs_code_blocks.py`` for what each mark means)."""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                   re.M | re.S)
MARK = re.compile(r"<!--\s*test:\s*(?:(?P<kind>compile|skip)|by\s+(?P<by>\S+?))\s*:\s*"
                  r"(?P<why>\S.*?)\s*-->")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    mark: str  # "", "compile", "skip" or "by"
    by: str
    why: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}:{self.lang or 'text'}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks_of(path: Path) -> list[Block]:
    text = path.read_text()
    page = str(path.relative_to(ROOT))
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip().rsplit("\n", 1)[-1]
        mark = MARK.fullmatch(before.strip())
        indent = len(match["indent"])
        code = textwrap.dedent("\n".join(line[indent:] if line[:indent].isspace() else line
                                         for line in match["body"].split("\n")))
        found.append(Block(
            page=page, line=text.count("\n", 0, match.start()) + 1,
            lang=match["info"].strip().split(" ")[0], code=code,
            mark=(mark["kind"] or "by") if mark else "", by=(mark["by"] or "") if mark else "",
            why=mark["why"] if mark else ""))
    return found


def run_python(code: str, name: str, namespace: dict[str, Any] | None = None) -> Any:
    """Run ``code`` in ``namespace`` (default: a fresh one named after ``name``), a
    top-level ``await`` in ``asyncio.run``; the namespace after it."""
    compiled = compile(code, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if namespace is None:
        namespace = {"__name__": re.sub(r"\W", "_", name)}
    if compiled.co_flags & inspect.CO_COROUTINE:
        with warnings.catch_warnings():
            # a block that awaits and also shows a sync call: both run in the one loop
            warnings.filterwarnings("ignore", "a sync timers call inside a running event loop")
            asyncio.run(eval(compiled, namespace))
    else:
        exec(compiled, namespace)
    return namespace
