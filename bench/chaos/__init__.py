"""The chaos checker: ``python -m bench.chaos --short | --minutes N [--cluster | --sentinel]
[--seed S] [--faults KIND,…] [--keep DIR]``.

After Jepsen: a **generator** (:mod:`~bench.chaos.generator`) plays a seeded mixed
workload through the public API — plain timers, keyed ones (``concurrency=1`` per device
by a key function, by ``key=``, an ``async def``, and one with a rate), a rate-limited task, a
concurrency-capped one, two recurrences (an interval, a cron with seconds), tasks that fail
then succeed (retries), cancels, and a batch moved to another prefix with ``timers move``
while the source's listeners work. A **nemesis** (:mod:`~bench.chaos.nemesis`) injects
seeded faults one at a time into real ``timers listen`` processes (a ``--processes 2``
supervisor and two plain listeners, :mod:`~bench.chaos.world`): ``kill -9``, ``SIGSTOP``
past the lease, a poison task, a partition of one listener from Redis (a proxy in its path
stops forwarding, :mod:`~bench.chaos.proxy`), a Redis restart (AOF on), a full server, a
Sentinel failover, a Cluster slot migration and primary kill. The **history** is a ledger
every task run writes as it starts and ends (timer, fencing token, ``still_held()``,
listener, pid, monotonic and Redis-clock times, key and place in its key's order;
:mod:`bench.fault_tasks.chaos`), the faults with the processes they cut, and the final
state read from Redis (:mod:`~bench.chaos.history`). The **checker**
(:mod:`~bench.chaos.checker`, pure) counts each violation: lost, completed twice, started
twice without a cut, started again with no rerun or retry counted, an older token after a
newer one, runs of one key beyond its limit,
FIFO per key, starts closer than a rate, dead without the deaths to prove it, dead for
another reason, left behind by a move, ran after a cancel.

Every run prints its seed, and ``--seed`` replays its plan (the same workload and faults at
the same moments; what the processes do in between is the machine's). Exit status 1 when
any violation was found. The ledger and the listeners' logs are kept when it fails (or
with ``--keep``).
"""
