"""The docs site as a reader sees it: built here (``mkdocs build --strict``, in this process,
into a temporary directory), its API reference pages (docs/reference/) show no literal
Sphinx role (``:class:`Timers` ``), no cross-reference left unresolved, and every example
of the docstrings they render as a code block (a ``>>>`` outside one renders as nested
quotes). The build formats long signatures with ruff (the ``docs`` extra's), a process:
hence an integration test."""

from __future__ import annotations

import html
import logging
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.unit.test_docs_api_reference import directives, docstring_examples

pytestmark = [pytest.mark.integration, pytest.mark.one_server]
PAGES = ("reference/api", "reference/testing", "reference/exceptions")
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|data|mod|attr|exc|obj|const|ref):`?[~\w.]")
LEFT_REFERENCE = re.compile(r"\[[^\[\]\n]+\]\[[\w.\-]*\]")
PRE = re.compile(r"<pre\b.*?</pre>", re.S)


def text(markup: str) -> str:
    """What a reader sees of an HTML fragment."""
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


def raw_roles(page: str) -> list[str]:
    return ROLE.findall(text(page))


def broken_references(page: str) -> list[str]:
    """References left as Markdown (``[`X`][path]``) or as autorefs' unresolved marks."""
    prose = text(PRE.sub("", page))
    return LEFT_REFERENCE.findall(prose) + re.findall(r"<autoref\b[^>]*>", page)


def quoted_examples(page: str) -> list[str]:
    """``>>>`` prompts outside code blocks, and blockquotes (what they render as)."""
    prose = PRE.sub("", page)
    return re.findall(r"&gt;&gt;&gt;.*", prose) + re.findall(r"<blockquote>", prose)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort

    out = tmp_path_factory.mktemp("site")
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("mkdocs").addHandler(handler)
    try:
        build(load_config(str(ROOT / "mkdocs.yml"), site_dir=str(out)))
    except Abort as exc:
        pytest.fail(f"mkdocs build --strict: {exc}: {warnings}")
    finally:
        logging.getLogger("mkdocs").removeHandler(handler)
    assert not [w for w in warnings if "signature" in w.lower()], warnings
    return {name: (out / name / "index.html").read_text() for name in PAGES}


@pytest.mark.parametrize("name", PAGES)
def test_a_reference_page_shows_no_raw_role_and_no_broken_reference(
        site: dict[str, str], name: str) -> None:
    assert raw_roles(site[name]) == []
    assert broken_references(site[name]) == []
    assert quoted_examples(site[name]) == []


def test_every_docstring_example_is_a_code_block(site: dict[str, str]) -> None:
    code = "\n".join(text(block) for page in site.values() for block in PRE.findall(page))
    code_lines = {line.strip() for line in code.splitlines()}
    shown = directives()
    examples = [ex.source for test in docstring_examples()
                if test.name in shown or test.name.rpartition(".")[0] in shown
                for ex in test.examples]  # (a module docstring shows where the module does)
    assert len(examples) >= 2
    missing = [source for source in examples
               if not all(line.strip() in code_lines for line in source.splitlines())]
    assert missing == []


def test_the_cross_references_link_where_they_say(site: dict[str, str]) -> None:
    """A docstring's ``[`Timers`][timers.producer.client.Timers]`` is a link to the class's
    heading (what autorefs makes of it; the strict build fails on one it cannot place)."""
    page = site["reference/testing"]
    assert re.search(r'<a class="autorefs autorefs-internal"[^>]*href="[^"]*'
                     r'#timers\.testing\.TimersTest\.run_due"', page)


def counts(site_dir: Path) -> dict[str, tuple[int, int, int]]:
    """(raw roles, broken references, quoted examples) per reference page of a built site:
    ``python -c 'from tests.integration.test_docs_site import counts; print(counts(...))'``."""
    pages = {name: (site_dir / name / "index.html").read_text() for name in PAGES}
    return {name: (len(raw_roles(p)), len(broken_references(p)), len(quoted_examples(p)))
            for name, p in pages.items()}
