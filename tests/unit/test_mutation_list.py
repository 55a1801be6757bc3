"""The mutation check's list of bugs (``tests/mutation/bugs.py``) cannot go stale silently:
every snippet still occurs exactly once in the current tree, and the list covers every
transition of the state machine, in the scripts and in the listener."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.mutation.bugs import BUGS, Bug
from tests.mutation.sampled import candidates, sample

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("bug", BUGS, ids=[b.name for b in BUGS])
def test_each_bug_plants_in_exactly_one_place(bug: Bug) -> None:
    text = (ROOT / bug.path).read_text()
    assert text.count(bug.original) == 1, (
        f"{bug.name}: its snippet occurs {text.count(bug.original)} times in {bug.path}; "
        f"update tests/mutation/bugs.py to the code as it is")
    assert bug.replacement != bug.original
    assert text.replace(bug.original, bug.replacement) != text


def test_the_list_covers_every_transition_in_the_scripts_and_the_listener() -> None:
    names = [b.name for b in BUGS]
    assert len(BUGS) >= 25 and len(set(names)) == len(names)
    covered = {int(n) for b in BUGS for n in re.findall(r"\bT(\d+)\b", b.breaks)}
    documented = {int(n) for n in re.findall(
        r"^\| T(\d+) \|", (ROOT / "docs/state-machine.md").read_text(), re.M)}
    assert documented and documented <= covered, sorted(documented - covered)
    assert any(b.path.endswith(".lua") for b in BUGS)
    assert any(b.path.startswith("timers/listener/") for b in BUGS)


def test_bugs_drawn_at_random_each_change_one_line_of_code_and_draw_alike() -> None:
    """``--sample``'s bugs (``tests/mutation/sampled.py``): each snippet occurs once and ends
    in the line it changes, the change is to that line alone, and a draw is its seed's."""
    paths = ["timers/store/lua/finish.lua", "timers/listener/executor.py"]
    drawn = sample(ROOT, paths, 40, seed=3)
    assert len(drawn) == 40 and drawn == sample(ROOT, paths, 40, seed=3)
    assert drawn != sample(ROOT, paths, 40, seed=4)
    for bug in drawn:
        text = (ROOT / bug.path).read_text()
        assert text.count(bug.original) == 1, bug.name
        before, after = bug.original.splitlines(), bug.replacement.splitlines()
        assert before[:-1] == after[:-1] and before[-1] != after[-1], bug.name
        assert not before[-1].lstrip().startswith(("--", "#", '"""')), bug.name
    kinds = {bug.name.split(":")[2].split("@")[0] for bug in drawn}
    assert {"drop-call", "eq"} <= kinds, kinds


def test_bugs_drawn_at_random_leave_the_text_of_strings_alone(tmp_path: Path) -> None:
    (tmp_path / "said.py").write_text(
        'def said(missing: list[str], x: int) -> str:\n'
        '    if not missing and x == 1:\n'
        '        return f"may not run {x}" + "or == 1"\n'
        '    return "not " if x != 1 else "and"\n')
    (tmp_path / "said.lua").write_text(
        "if not x then return 'may not run' end  -- not here\n"
        "local y = 'a ~= b' and x == 1\n")
    names = {bug.name for path in ("said.py", "said.lua") for bug in candidates(tmp_path, path)}
    assert names == {"said.py:2:not@7", "said.py:2:and@19", "said.py:2:eq@25",
                     "said.py:4:ne-py@23", "said.lua:1:not@3", "said.lua:2:and@19",
                     "said.lua:2:eq@25"}, sorted(names)
