"""The stored vocabulary of timers/model/wire.py is the one the Lua scripts and keys.py speak."""

from __future__ import annotations

from pathlib import Path

import timers.model.keys
from timers.model.wire import ClaimSource, Counter, EndingKind, FailureRecord

LUA = Path(timers.model.keys.__file__).parents[1] / "store" / "lua"
ROOT = Path(timers.model.keys.__file__).parents[2]


def test_every_ending_kind_and_counter_is_a_scripts_word() -> None:
    scripts = "".join((LUA / f"{name}.lua").read_text()
                      for name in ("finish", "claim", "gate", "depart"))
    for kind in EndingKind:
        assert f"'{kind}'" in scripts, kind
    for counter in Counter:
        assert f"'{counter}'" in scripts or f"{counter} =" in scripts, counter


def test_every_claim_source_is_the_claim_scripts_tag() -> None:
    claim = "".join((LUA / name).read_text() for name in ("claim.lua", "flow.lua"))
    for source in ClaimSource:
        assert f"'{source}'" in claim or f"'{source}@'" in claim, source
    assert ClaimSource.read("r@host:1:ab") == (ClaimSource.RECOVERED, "host:1:ab")
    assert ClaimSource.read("?") == (ClaimSource.SWEEP, "")


def test_the_key_layout_page_lists_every_counter_and_failure_field() -> None:
    table = (ROOT / "docs" / "reference" / "keys.md").read_text()
    for counter in Counter:
        assert counter in table, counter
    for field in FailureRecord.__dataclass_fields__:
        assert field in table, field


def test_a_stored_failure_record_reads_back_whatever_it_holds() -> None:
    record = FailureRecord.from_dict({"id": 3, "kind": "error", "attempts": "x",
                                      "failed_at": 12, "unknown": 1})
    assert (record.id, record.kind, record.attempts, record.failed_at) == (None, "error",
                                                                          None, 12)
