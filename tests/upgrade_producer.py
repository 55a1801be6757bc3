"""The rolling upgrade test's producer: schedules a batch of :mod:`tests.upgrade_tasks.jobs`
timers with the ``timers`` this process imports (this release's, or the last one's when its
tree comes first on the path), and prints the tag of each timer scheduled, one a line::

    python -m tests.upgrade_producer URL LABEL PLAIN KEYED PACED SPREAD KEYS

``LABEL`` starts every tag; the plain and keyed timers come due over the next ``SPREAD``
seconds, in turn, the keyed ones over ``KEYS`` concurrency keys (a keyed timer's tag ends
with ``@<its key>``); the paced ones all at once, half way (a burst their rate spaces
out). One ``schedule`` call per timer, as an app makes them.
"""

from __future__ import annotations

import sys

import timers


def schedule_batch(url: str, label: str, plain: int, keyed: int, paced: int, spread: float,
                   keys: int) -> list[str]:
    """Schedule the batch; the tags of its timers, in the order they were scheduled. A
    keyed timer's tag ends with ``@<its key>``."""
    kinds = ["plain"] * plain + ["keyed"] * keyed + ["paced"] * paced
    order = sorted(range(len(kinds)), key=lambda i: (i % 7, i))  # the kinds mixed in time
    tags = []
    with timers.Timers(url) as client:
        for n, i in enumerate(order):
            kind = kinds[i]
            key = f"dev-{i % keys}" if kind == "keyed" else None
            tag = f"{label}-{kind}-{i}" + (f"@{key}" if key else "")
            # the paced ones due at once, half way: they wait in their rate's queue
            due = spread / 2 if kind == "paced" else spread * n / max(1, len(kinds) - 1)
            client.schedule(f"jobs.{kind}", [tag], in_=due, key=key)
            tags.append(tag)
    return tags


if __name__ == "__main__":
    url, label, *numbers = sys.argv[1:]
    for tag in schedule_batch(url, label, int(numbers[0]), int(numbers[1]), int(numbers[2]),
                              float(numbers[3]), int(numbers[4])):
        print(tag)
