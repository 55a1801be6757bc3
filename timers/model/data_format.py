"""The version of the data format timers keeps in Redis, and who may work on it.

Every key of a prefix (:mod:`timers.model.keys`) is written in one *data format*: the key
names, the records, the scripts' states. Its number is kept in ``P|format`` (the
one-shard keyspace of the prefix: on a sharded prefix, the home shard, beside
``P|shards``), an integer. 0.1.0 wrote format 1 and never stored the key, so an absent key
is format 1.

- A listener, as it starts, writes :data:`FORMAT` there if the key is absent (``SET …
  NX``) and reads what is there; a producer reads it before its first write (once per
  client, in the round trip that reads the eviction policy).
- A process that finds a format newer than it knows (or a value that is no format)
  refuses, with :class:`~timers.exceptions.UnknownFormat` and nothing written: its code
  would misread what a newer release wrote.
- A release whose keys an older release can still read and write keeps the number; one
  that changes them raises it, says so in the changelog, and reads the formats of the
  releases it upgrades from (a rolling upgrade: both run on one prefix for a while;
  ``tests/integration/test_rolling_upgrade.py`` runs one against the last release).

Format 1: 0.1.0 and 0.2.0.
"""

from __future__ import annotations

from timers.exceptions import UnknownFormat

FORMAT = 1
"""The newest data format this release reads and writes."""
ABSENT_FORMAT = 1
"""The format of a prefix whose ``P|format`` key is absent (0.1.0 wrote none)."""


def stored_format(raw: bytes | str | int | None) -> int | None:
    """The format a ``GET P|format`` reply names: :data:`ABSENT_FORMAT` for none, None for
    a value that is no format (not a whole number of at least 1)."""
    if raw is None:
        return ABSENT_FORMAT
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        return None
    return int(text)


def refusal(raw: bytes | str | int | None, key: str, who: str) -> UnknownFormat | None:
    """The error to refuse with when ``P|format`` (``key``) holds ``raw``, or None when this
    release can work on it; ``who`` is what refuses (``"listener"``, ``"producer"``)."""
    found = stored_format(raw)
    if found is not None and found <= FORMAT:
        return None
    shown = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    what = (f"data format {found}" if found is not None
            else f"{shown[:40]!r}, which is no data format")
    return UnknownFormat(
        f"{key} holds {what}; this {who} knows formats up to {FORMAT}: upgrade timers "
        f"here (a newer release wrote that prefix); nothing was written",
        stored=shown, known=FORMAT)
