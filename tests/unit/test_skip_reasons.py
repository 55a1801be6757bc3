"""Every skip says why: tests/conftest.py fails a skip whose reason is pytest's own default
(``-rs`` shows each reason)."""

from __future__ import annotations

from tests.conftest import vague_skip


def test_a_skip_must_say_why() -> None:
    """tests/conftest.py fails a skip whose reason is pytest's own default."""
    for vague in ("", "Skipped: unconditional skip", "condition: sys.platform == 'x'",
                  "could not import 'django': No module named 'django'"):
        assert vague_skip(vague), vague
    assert not vague_skip("Skipped: tmux is not installed (.ci/run installs it)")
