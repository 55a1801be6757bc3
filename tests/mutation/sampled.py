"""Single-line bugs drawn at random, as someone who plants them by hand would: the check of
:mod:`tests.mutation.bugs` tries bugs chosen for the transitions they break; these are
chosen by nobody, so the ones that survive show where the tests do not look.

A bug is one change to one line of code in the files asked for: a comparison turned
(``==`` / ``!=`` / ``~=``, ``<`` / ``<=``, ``>`` / ``>=``), ``and`` and ``or`` swapped, a
``not`` dropped, ``True`` / ``False`` (``true`` / ``false``) swapped, ``+ 1`` / ``- 1``
swapped, or a call whose result is not used taken out (commented out in Lua, ``pass``
in Python). Lines of comments, docstrings and logging, and the text of string literals,
are left alone (a bug there changes what is said, not what is done). Each is a
:class:`~tests.mutation.bugs.Bug` whose snippet is the line with as many lines before it
as make it occur once.
"""

from __future__ import annotations

import ast
import io
import random
import re
import tokenize
from pathlib import Path

from tests.mutation.bugs import Bug

_BOOL = "(the other truth value)"
SWAPS: tuple[tuple[str, str, str], ...] = (
    # (name, pattern, replacement): the pattern is a regular expression on the code part
    ("eq", r"==", "!="),
    ("ne-py", r"!=", "=="),
    ("ne-lua", r"~=", "=="),
    ("le", r"<=", "<"),
    ("lt", r"<(?![=<])", "<="),
    ("ge", r">=", ">"),
    ("gt", r"(?<![-=>])>(?![=>])", ">="),
    ("and", r"\band\b", "or"),
    ("or", r"\bor\b", "and"),
    ("not", r"\bnot\s+", ""),
    ("true", r"\b(True|true)\b", _BOOL),
    ("false", r"\b(False|false)\b", _BOOL),
    ("plus-one", r"\+ 1\b", "- 1"),
    ("minus-one", r"- 1\b", "+ 1"),
)
_LOGGING = re.compile(r"^\s*(log\w*\.|logging\.|print\(|warnings\.warn)")
_LUA_CALL = re.compile(r"^(\s*)((redis\.call|[a-z_]+)\(.*\))\s*$")


def _lua_code(line: str) -> str:
    """``line`` up to its comment (``--`` outside a string), its strings' text blanked."""
    quote, out = "", []
    for at, char in enumerate(line):
        if quote:
            if char == quote and line[at - 1] != "\\":
                quote = ""
            else:
                char = " "
        elif char in "'\"":
            quote = char
        elif line.startswith("--", at):
            break
        out.append(char)
    return "".join(out)


def _lua_code_lines(text: str) -> dict[int, str]:
    """Line number (from 1) → the code part of each Lua line that has code."""
    found = {}
    for number, line in enumerate(text.splitlines(), 1):
        code = _lua_code(line)
        if code.strip():
            found[number] = code
    return found


def _python_code_lines(text: str) -> dict[int, str]:
    """Line number (from 1) → each line of Python that starts a statement inside a function
    (not a docstring, not logging), the text of its string literals blanked."""
    tree = ast.parse(text)
    lines = _blank_strings(text).splitlines()
    found = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for statement in ast.walk(node):
            if not isinstance(statement, ast.stmt) or statement is node:
                continue
            if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                continue  # a docstring
            line = lines[statement.lineno - 1]
            if _LOGGING.match(line) or line.lstrip().startswith(("def ", "async def ", "@")):
                continue
            found[statement.lineno] = line.split("  #", 1)[0]
    return found


def _blank_strings(text: str) -> str:
    """``text`` with the inside of each string literal (an f-string's too, its fields
    included) as spaces: same lengths, same places."""
    lines = text.splitlines(keepends=True)
    kinds = {tokenize.STRING} | {getattr(tokenize, name) for name in ("FSTRING_MIDDLE",)
                                 if hasattr(tokenize, name)}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in kinds:
            continue
        (row, col), (end_row, end_col) = token.start, token.end
        for number in range(row, end_row + 1):
            line = lines[number - 1]
            start = col if number == row else 0
            stop = end_col if number == end_row else len(line.rstrip("\n"))
            lines[number - 1] = line[:start] + " " * (stop - start) + line[stop:]
    return "".join(lines)


def candidates(root: Path, path: str) -> list[Bug]:
    """Every bug of the kinds above in the file ``path`` (from ``root``)."""
    text = (root / path).read_text()
    lines = text.splitlines(keepends=True)
    lua = path.endswith(".lua")
    code_lines = _lua_code_lines(text) if lua else _python_code_lines(text)
    bugs = []
    for number, code in sorted(code_lines.items()):
        line = lines[number - 1]
        changed: list[tuple[str, str]] = []
        for name, pattern, replacement in SWAPS:
            if name == ("ne-py" if lua else "ne-lua"):
                continue
            if name == "eq" and lua:
                replacement = "~="
            for match in re.finditer(pattern, code):
                new = replacement
                if new == _BOOL:
                    word = match.group(0)
                    new = {"True": "False", "False": "True", "true": "false",
                           "false": "true"}[word]
                changed.append((f"{name}@{match.start()}",
                                line[:match.start()] + new + line[match.end():]))
        call = _LUA_CALL.match(code) if lua else None
        if call and not code.lstrip().startswith(("return", "local", "if", "for", "while")):
            changed.append(("drop-call", f"{call.group(1)}-- (dropped)\n"))
        if not lua and re.match(r"^\s*(self\.)?[\w.]+\(.*\)\s*$", code) and code.strip() != "pass":
            indent = re.match(r"^\s*", line).group(0)  # type: ignore[union-attr]
            changed.append(("drop-call", f"{indent}pass\n"))
        for name, new_line in changed:
            if new_line == line:
                continue
            before = number - 1
            snippet = line
            while text.count(snippet) != 1 and before > 0:
                before -= 1
                snippet = lines[before] + snippet
            if text.count(snippet) != 1:
                continue
            replacement = snippet[:len(snippet) - len(line)] + new_line
            bugs.append(Bug(f"{path.rsplit('/', 1)[-1]}:{number}:{name}", path, snippet,
                            replacement, f"line {number}: {line.strip()[:70]}"))
    return bugs


def sample(root: Path, paths: list[str], count: int, seed: int) -> list[Bug]:
    """``count`` bugs drawn with ``seed`` from every candidate of ``paths``."""
    every = [bug for path in paths for bug in candidates(root, path)]
    return random.Random(seed).sample(every, min(count, len(every)))
