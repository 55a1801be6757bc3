"""The bench's alternating mode reads each side's table the same way (pure parts)."""

from bench.alternate import figures, report

TABLE = """\
| Scenario | Figure | Result | Target | Met |
|---|---|---|---|---|
| Flow: 1,000 over 50 keys | handoff, per key | p50 0.4 ms, p99 22.4 ms, max 40.4 ms | - | - |
| Fire: 20,000 due at once | fires/s (N / (last start - due)) | 5,466 (20,000 in 3.66 s) | - | - |

- Fire: 20,000 due at once: per fire, Redis CPU 51.4 us and listener CPU 132.0 us (over 5.1 s)
"""


def test_each_number_of_a_row_is_read_with_the_word_before_it() -> None:
    rows = figures(TABLE)
    assert rows["Flow: 1,000 over 50 keys | handoff, per key"] == [
        ("p50", 0.4), ("p99", 22.4), ("max", 40.4)]
    assert rows["Fire: 20,000 due at once | fires/s (N / (last start - due))"][0] == ("", 5466.0)
    note = rows["Fire: 20,000 due at once | per fire"]
    assert note[:2] == [("Redis CPU", 51.4), ("listener CPU", 132.0)]


def test_the_report_gives_medians_spread_and_new_over_old_and_leaves_out_constants() -> None:
    old = figures(TABLE)
    new = figures(TABLE.replace("5,466", "6,013").replace("p99 22.4", "p99 11.2"))
    lines = report({"old": [old, old], "new": [new]}, "old", "new")
    fires = next(line for line in lines if "fires/s [#1]" in line)
    assert "5,466.0 (5,466.0-5,466.0)" in fires and fires.endswith("| 1.10x |")
    p99 = next(line for line in lines if "[p99]" in line)
    assert p99.endswith("| 0.50x |")
    assert not any("[max]" in line or "[#2]" in line for line in lines)  # same on every run
