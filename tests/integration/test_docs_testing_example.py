"""The testing guide's complete example (docs/guides/testing.md), copied into a fresh
project outside this repository, passes under ``python -m pytest`` (the ``timers_test``
fixture comes from the installed package's pytest plugin).

A fresh pytest process: an integration test (no Redis involved, one server only).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

START, END = "<!-- testing-example:start -->", "<!-- testing-example:end -->"
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def example_files() -> dict[str, str]:
    """The example's files: each code block between the markers starts ``# <path>``."""
    text = (ROOT / "docs" / "guides" / "testing.md").read_text()
    section = text.split(START, 1)[1].split(END, 1)[0]
    files = {}
    for block in BLOCK.findall(section):
        first, _, _ = block.partition("\n")
        assert first.startswith("# ") and first.endswith(".py"), first
        files[first[2:]] = block
    return files


def test_the_testing_guide_s_example_passes_in_a_fresh_project(tmp_path: Path) -> None:
    files = example_files()
    assert {"tasks/emails.py", "signup.py", "test_signup.py"} <= set(files)
    project = tmp_path / "shop"
    for path, code in files.items():
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text(code)
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith(("TIMERS_", "PYTEST_"))}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "5 passed" in done.stdout
    assert not str(project).startswith(str(ROOT))
