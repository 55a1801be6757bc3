"""The distribution is ``redis-timers`` (``timers`` on PyPI is an unrelated project): every
install hint in the repository names it, and the package and the command keep their name.

Files are read, nothing is run."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import timers
from tests.conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = sorted(PYPROJECT["project"]["optional-dependencies"])
SKIP_DIRS = {".git", ".venv", "build", "dist", "node_modules", "__pycache__"}
TEXT_SUFFIXES = {".py", ".md", ".txt", ".toml", ".cfg", ".ini", ".sh", ".yaml", ".yml", ""}

# The old distribution name after `pip install`, with or without an extra, quoted or not,
# and an extra of it named alone in prose (`timers` + `[testing]`).
OLD_INSTALL = re.compile(r"pip3? install +(?:-\S+ +)*['\"]?timers(?![-\w.])")
OLD_EXTRA = re.compile(r"(?<![-\w./])timers\[(?:" + "|".join(EXTRAS) + r")(?:,[\w,]+)?\]")
OLD_REQUIREMENT = re.compile(r"requirements\.txt` lists `timers`")


def text_files() -> Iterator[Path]:
    """The repository's own text files (README, docs, code, tests, CI, Dockerfiles …)."""
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS
                   and not d.startswith(".venv") and not d.endswith(".egg-info")]
        for name in files:
            path = Path(folder, name)
            if path.suffix in TEXT_SUFFIXES or name.startswith(("Dockerfile", "requirements")):
                yield path


def old_hints(text: str) -> list[str]:
    """The old-name install hints in ``text``, each as the line it is on."""
    return [line.strip() for line in text.splitlines()
            if OLD_INSTALL.search(line) or OLD_EXTRA.search(line)
            or OLD_REQUIREMENT.search(line)]


def test_the_distribution_is_redis_timers_and_keeps_the_package_and_command() -> None:
    project = PYPROJECT["project"]
    assert project["name"] == "redis-timers"
    assert project["scripts"] == {"timers": "timers.cli:main"}
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "timers.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", timers.__version__)


def test_the_patterns_catch_the_old_hints() -> None:
    old = "pip install 'tim" + "ers[web]'"  # split, so this file has no hint of its own
    assert old_hints(old) and old_hints(old.replace("'", '"'))
    assert old_hints("pip install tim" + "ers") and old_hints("and `tim" + "ers[metrics]`")
    assert not old_hints("pip install 'redis-timers[web]'")
    assert not old_hints("pip install redis-timers  # the package is `import timers`")
    assert not old_hints("self.timers[0]; pip install -e '.[dev]'")


def test_no_install_hint_names_the_old_distribution() -> None:
    found = {str(path.relative_to(ROOT)): hints for path in text_files()
             if (hints := old_hints(path.read_text(errors="replace")))}
    assert found == {}, "install hints must name redis-timers"
    assert (ROOT / "README.md") in set(text_files())
