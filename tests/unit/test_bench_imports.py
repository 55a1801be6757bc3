"""Every bench module imports against today's package layout (a moved module or a renamed
name fails here, not in the middle of a long bench run)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
MODULES = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in ("__main__",))


@pytest.mark.parametrize("name", MODULES)
def test_the_bench_module_imports(name: str) -> None:
    importlib.import_module(f"bench.{name}")
