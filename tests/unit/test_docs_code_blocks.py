"""Every fenced code block of the README and of every page of the docs site (``docs/``) is
run or checked here, so an example pastes as written:

- ``python``: run, in a namespace of its own, against an in-memory server
  (:class:`timers.testing.TimersTest`; ``$TIMERS_REDIS_URL`` points nowhere, so an example
  that reached for a real server would fail). A block with a top-level ``await`` runs in
  ``asyncio.run``. A ``test_*`` function the block defines is called with a fresh
  ``timers_test``, as pytest would.
- ``sh``: every ``timers …`` command in it (also after ``&&``, and as ``.venv/bin/timers``)
  parses as the command line reads it (nothing is run).
- ``json``, ``yaml``: parse. ``ini``, ``dockerfile``: the page's copy is the file in
  ``docs/deploy/`` that the deployment tests run.

A block that cannot be checked that way is marked on the last non-blank line before it,
with the reason, which this test reports:

- ``<!-- test: compile: WHY -->``: compiled, not run (placeholders such as ``redis.Redis(...)``);
- ``<!-- test: by tests/PATH.py: WHY -->``: PATH runs it as written (it must exist and name
  the page);
- ``<!-- test: skip: WHY -->``: an output or a synopsis, nothing to run.

The command-line reference (``docs/reference/cli.md``) is typer's own output; its usage
lines are checked by ``test_docs_cli_reference.py``, which says when the page is out of date.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import shlex
from typing import Any

import pytest
import typer.main
import yaml

from tests.docs_blocks import Block, blocks_of, pages, run_python
from tests.unit.conftest import ROOT
from timers.cli import app

NOWHERE = "redis://nowhere.invalid:1/0"
GENERATED = {"docs/reference/cli.md": "test_docs_cli_reference.py"}
BLOCKS = [block for path in pages() for block in blocks_of(path)
          if block.page not in GENERATED]
RUN = [b for b in BLOCKS if b.mark == ""]


def of(lang: str) -> list[Any]:
    return [pytest.param(b, id=b.id) for b in RUN if b.lang == lang]


# -- the inventory -------------------------------------------------------------------------


def test_every_page_s_blocks_are_found() -> None:
    assert len(BLOCKS) >= 60
    assert {b.page for b in BLOCKS} >= {"README.md", "docs/guides/scheduling.md",
                                        "docs/guides/testing.md", "docs/guides/deploying.md"}
    unknown = [b.id for b in RUN if b.lang not in CHECKS]
    assert unknown == [], "a block no check knows: give it a language below, or a mark"


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in BLOCKS if b.mark],)
def test_a_marked_block_says_why(block: Block) -> None:
    assert len(block.why) >= 10, "say why the block is not run"
    if block.mark == "by":
        test = ROOT / block.by
        assert test.is_file(), f"{block.by} does not exist"
        assert block.page in test.read_text(), f"{block.by} does not name {block.page}"
        return
    if block.mark == "compile":
        assert block.lang == "python"
        compile(block.code, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    pytest.skip(f"{block.id}: {block.mark}: {block.why}")


# -- python ---------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_real_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMERS_REDIS_URL", NOWHERE)
    monkeypatch.delenv("TIMERS_PREFIX", raising=False)
    monkeypatch.delenv("TIMERS_GROUP", raising=False)


def in_memory() -> Any:
    from timers.testing import TimersTest

    return TimersTest("tasks", search_path=str(ROOT))


@pytest.mark.parametrize("block", of("python"))
def test_python_block_runs(block: Block) -> None:
    with in_memory():
        namespace = run_python(block.code, block.id)
    tests = {name: fn for name, fn in namespace.items()
             if name.startswith("test_") and callable(fn)}
    for name, fn in tests.items():
        assert set(inspect.signature(fn).parameters) <= {"timers_test"}, name
        with in_memory() as t:
            fn(**({"timers_test": t} if inspect.signature(fn).parameters else {}))


# -- sh -------------------------------------------------------------------------------------


def parse(argv: list[str]) -> Any:
    """What Click makes of ``argv``, down to the leaf command (nothing is run)."""
    command: Any = typer.main.get_command(app)
    ctx = command.make_context("timers", argv)
    while hasattr(command, "resolve_command"):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        name, command, rest = command.resolve_command(ctx, rest)
        ctx = command.make_context(name, rest, parent=ctx)
    return ctx


def timers_commands(code: str) -> list[str]:
    """Each ``timers …`` command of a shell block, comments dropped, as the CLI reads it."""
    commands = []
    for line in code.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        for part in line.split(" && "):
            part = re.sub(r"^(\.venv/bin/)?timers\b", "timers", part.strip())
            if part.startswith("timers "):
                commands.append(part)
    return commands


def test_the_shell_blocks_show_commands() -> None:
    assert sum(len(timers_commands(b.code)) for b in RUN if b.lang == "sh") >= 30
    readme = [b for b in RUN if b.lang == "sh" and b.page == "README.md"]
    assert "timers demo" in timers_commands(readme[0].code)  # the README opens with it


@pytest.mark.parametrize("block", of("sh"))
def test_shell_block_commands_parse(block: Block) -> None:
    for command in timers_commands(block.code):
        parse(shlex.split(command)[1:])


# -- data and deployment files --------------------------------------------------------------


@pytest.mark.parametrize("block", of("json"))
def test_json_block_parses(block: Block) -> None:
    json.loads(block.code)


@pytest.mark.parametrize("block", of("yaml"))
def test_yaml_block_parses(block: Block) -> None:
    assert yaml.safe_load(block.code)


DEPLOY_FILES = {"ini": "timers.service", "dockerfile": "Dockerfile"}


def deploy_file_body(name: str) -> str:
    """``docs/deploy/NAME`` without its first line, the comment naming the page."""
    first, _, body = (ROOT / "docs" / "deploy" / name).read_text().partition("\n")
    assert first.startswith("# ") and "docs/guides/deploying.md" in first, first
    return body


@pytest.mark.parametrize("block", of("ini") + of("dockerfile"))
def test_a_deployment_file_shown_is_the_one_tested(block: Block) -> None:
    name = DEPLOY_FILES[block.lang]
    assert block.code == deploy_file_body(name), f"the page's copy of docs/deploy/{name} differs"


def test_the_deploying_guide_shows_both_deployment_files() -> None:
    shown = {DEPLOY_FILES[b.lang] for b in RUN
             if b.page == "docs/guides/deploying.md" and b.lang in DEPLOY_FILES}
    assert shown == set(DEPLOY_FILES.values())


CHECKS = {"python", "sh", "json", "yaml", *DEPLOY_FILES}


# -- blocks checked one by one -----------------------------------------------------------


def test_the_flow_control_guide_s_errors_are_the_ones_raised() -> None:
    """docs/guides/flow-control.md: the three lines of bad values and what they raise."""
    import timers

    (shown,) = [b for b in BLOCKS if b.page == "docs/guides/flow-control.md"
                and b.code.startswith("timers.InvalidTimer:")]
    bad = [{"group": "video nodes"}, {"priority": 5000}, {"key": "a\tb"}]
    raised = []
    with in_memory():
        for options in bad:
            with pytest.raises(timers.InvalidTimer) as error:
                timers.schedule("video.render", [], in_=60, **options)
            raised.append(f"timers.InvalidTimer: {error.value}")
    assert shown.code.splitlines() == raised


# -- the README's links ---------------------------------------------------------------------


def test_the_readme_s_links_reach_files() -> None:
    """(The site's own links are checked by ``mkdocs build --strict``.)"""
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert len(targets) >= 20
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert missing == []
