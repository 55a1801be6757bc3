"""The single-line bugs of the mutation check (``python -m tests.mutation``): each one a
place in the tree (a snippet that occurs there exactly once: ``tests/unit/
test_mutation_list.py`` checks it), what it becomes, and the transition
(``docs/state-machine.md``, T1 to T29) or rule it breaks. The default test run must fail
for every one."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bug:
    name: str
    path: str
    """The file, from the repository's root."""
    original: str
    """A snippet that occurs exactly once in the file (a line, or a line with its context)."""
    replacement: str
    breaks: str
    """The transition (``T<n>``) or rule it breaks, and how."""
    survives: str = ""
    """Why no test catches it, for a bug known to survive (empty: it must be caught)."""


LUA = "timers/store/lua/"
LISTENER = "timers/listener/"

BUGS: tuple[Bug, ...] = (
    # -- the scripts ----------------------------------------------------------------------
    Bug("schedule-due-late", LUA + "schedule.lua",
        "    due = now + due\n", "    due = now + due + 100\n",
        "T1: a timer is written due 100 ms later than asked"),
    Bug("reschedule-keeps-queue", LUA + "reschedule.lua",
        "unpark(ARGV[1], ARGV[3])  -- a timer held back",
        "-- unpark(ARGV[1], ARGV[3])  -- a timer held back",
        "T2: a rescheduled waiting timer stays in its key's queue as well"),
    Bug("cancel-leaves-key-queue", LUA + "flow.lua",
        "    redis.call('ZREM', flow_key(key_start, 'waitk', p.name), id)\n",
        "    -- (left in its key's queue)\n",
        "T3: a cancel leaves the timer in its key's queue"),
    Bug("claim-keeps-record", LUA + "claim.lua",
        "  call_all('HDEL', KEYS[2], ids)\n", "  -- (records kept)\n",
        "T4: a claimed timer keeps its pending record (cancel still finds it)"),
    Bug("claim-no-barrier-note", LUA + "claim.lua",
        "    out[#out + 1] = t[3]\n    note_keyed(token, run)\n",
        "    out[#out + 1] = t[3]\n",
        "T4: a claimed keyed timer is not noted in its key's order barrier (FIFO)"),
    Bug("claim-window-not-asked", LUA + "claim.lua",
        "        if not is_declared(ARGV[1] .. id .. ':' .. record) then short = true end\n",
        "        -- (the due timers' keys taken as given)\n",
        "T4 (declared keys): a claim does not ask for the keys of the due timers it may take "
        "and was not given (a cluster's claim given none, or the keys its lane's last claims "
        "asked for): those timers are left behind, the later ones it was given claimed"),
    Bug("recover-live-lease", LUA + "claim.lua",
        "redis.call('ZRANGEBYSCORE', running, '-inf', now, 'LIMIT', 0, limit - claimed)",
        "redis.call('ZRANGEBYSCORE', running, '-inf', now + 500, 'LIMIT', 0, limit - claimed)",
        "T5: a claim recovers a lease not yet lapsed (500 ms left)"),
    Bug("tokens-go-back", LUA + "prelude.lua",
        "  if base < now_us then base = now_us end\n", "",
        "T4/T5 (fence): a server that lost its last writes gives out run tokens again, below "
        "tokens of runs already started"),
    Bug("rerun-uncounted", LUA + "claim.lua",
        "local rerun = start((tonumber(reruns) + 1) .. me",
        "local rerun = start((tonumber(reruns)) .. me",
        "T5: a rerun is not counted (reruns + 1 dropped)"),
    Bug("rerun-loses-slot", LUA + "claim.lua",
        "local passed, took_back = transfer_slot(ARGV[1], token, rerun, lease_until)",
        "local passed, took_back = false, false",
        "T5: the cut run's slot is freed instead of passing to its rerun"),
    Bug("park-keeps-due-entry", LUA + "park.lua",
        "  redis.call('ZREM', index, id)\n  redis.call('DEL', ARGV[1] .. id",
        "  redis.call('DEL', ARGV[1] .. id",
        "T6: a parked timer stays in its due index as well"),
    Bug("gate-over-limit", LUA + "gate.lua",
        "if redis.call('ZCARD', slots) < limit and not waits_ahead then",
        "if redis.call('ZCARD', slots) <= limit and not waits_ahead then",
        "T7: a key runs limit + 1 at once"),
    Bug("gate-past-barrier", LUA + "gate.lua",
        "    if barred(ARGV[1], id, record, score, now) then",
        "    if false then",
        "T7: a free slot goes past the order barrier (FIFO)"),
    Bug("gate-rate-burst", LUA + "gate.lua",
        "if tat - now > (burst - 1) * interval then return false end",
        "if tat - now > burst * interval then return false end",
        "T7: a rate lets a start through one interval early"),
    Bug("gate-lost-goes", LUA + "gate.lua",
        "if not record or not redis.call('ZSCORE', rk, token) then return 'lost' end",
        "if not record then return 'lost' end",
        "T10: a gate lets a run go whose lease another listener took over"),
    Bug("hold-not-queued", LUA + "gate.lua",
        "  redis.call('ZADD', queue, flow_score(record, tonumber(record_option(record, 'w'))),"
        " id)\n  parked_write(ARGV[1], id, p)\n  return 'wait'",
        "  parked_write(ARGV[1], id, p)\n  return 'wait'",
        "T8, T9: a timer held back is in no queue (never promoted)"),
    Bug("rate-wait-no-barrier", LUA + "gate.lua",
        "      if status == 'wait' then\n        note_ungated",
        "      if false then\n        note_ungated",
        "T9: a keyed timer waiting for its rate loses its place in its key's order"),
    Bug("promote-no-kept-slot", LUA + "flow.lua",
        "        redis.call('ZADD', slots, ms_text(now + p.b), 'w:' .. id)\n",
        "        -- (no slot kept)\n",
        "T11: a promoted timer has no slot kept for it"),
    Bug("handoff-no-slot", LUA + "flow.lua",
        "        redis.call('ZADD', slots, taker.lease_until, token)\n",
        "        -- (handed without its slot)\n",
        "T12: a run handed over holds no slot"),
    Bug("next-past-barrier", LUA + "flow.lua",
        "      if barred(key_start, id, record, flow_score(",
        "      if false and barred(key_start, id, record, flow_score(",
        "T13: a run handed next in line past the order barrier"),
    Bug("pass-slot-dropped", LUA + "flow.lua",
        "  redis.call('ZADD', flow_key(key_start, 'slots', key), until_ms, successor)\n",
        "  -- (the slot is not passed on)\n",
        "T14: the run next in line takes over no slot"),
    # (``local next_tat = math.max(tat, at)``, the slot's interval not added, survives and
    # is equivalent: the pacer's own start raises tat to an interval less 5 ms after it)
    Bug("rate-promote-slot-now", LUA + "flow.lua",
        "      local at = math.max(tat - (burst - 1) * interval, now)\n",
        "      local at = now\n",
        "T15: a promoted pacer's slot is now, whatever the rate's last start"),
    Bug("finish-keeps-slot", LUA + "finish.lua",
        "  elseif slots_held then\n    release_slot(ARGV[1], token, now)",
        "  elseif false then\n    release_slot(ARGV[1], token, now)",
        "T16: an ending never frees its key's slot"),
    Bug("retry-at-once", LUA + "finish.lua",
        "if pend_again(id, record, now + tonumber(b)) then",
        "if pend_again(id, record, now) then",
        "T16: a retry is due at once, not after its delay"),
    Bug("release-loses-timer", LUA + "finish.lua",
        "    if pend_again(release[1], release[2], release[3]) then",
        "    if false then",
        "T17: a run handed back is lost"),
    Bug("cut-uncounted", LUA + "finish.lua",
        "with_reruns(record, (tonumber(reruns) or 0) + (cut and 1 or 0))",
        "with_reruns(record, (tonumber(reruns) or 0))",
        "T17: a run handed back while its task may still be going (a stop past its "
        "shutdown timeout) starts again as a first run, uncounted"),
    Bug("handback-counted", LUA + "finish.lua",
        "released_run(token, ARGV[i + 2] ~= '' and",
        "released_run(token, ARGV[i + 2] == '' or",
        "T17: a run handed back before it started comes back as a rerun (in quarantine)"),
    Bug("move-loses-timer", LUA + "finish.lua",
        "    if pend_again(id, moved, tonumber(b)) then counts.routed",
        "    if false then counts.routed",
        "T18: a run moved to its task's group is lost"),
    Bug("renew-revives", LUA + "renew.lua",
        "  if redis.call('ZADD', KEYS[1], 'XX', 'CH', lease_until, token) == 1",
        "  if redis.call('ZADD', KEYS[1], 'CH', lease_until, token) == 1",
        "T19: a renewal revives a run another listener recovered"),
    Bug("finish-takeover-written", LUA + "finish.lua",
        "  if redis.call('ZREM', KEYS[1], token) == 1 then return true end",
        "  redis.call('ZREM', KEYS[1], token); do return true end",
        "T20: a finish writes the ending of a token taken over"),
    Bug("rate-no-restart-floor", LUA + "flow.lua",
        "  if started then tat = math.max(tat, started + burst * interval) end",
        "  -- (no floor at the server's start)",
        "T21: a server that lost its last writes lets a rate start again at once"),
    Bug("rate-hold-keeps-next", LUA + "gate.lua",
        "      take_back_next(ARGV[1], token)\n",
        "      -- (the run next in line is not taken back)\n",
        "T22: a run next in line follows a run held for its rate into its slot"),
    Bug("pacer-early-paid", LUA + "gate.lua",
        "  if p.state == 'R' and now < p.c then",
        "  if false then",
        "T23: a pacer gated before its slot is paid"),
    Bug("retake-keeps-pacer", LUA + "gate.lua",
        "    p.c = p.c + later\n", "",
        "T29: a late run that asks its gate again starts now, and the pacer made after its "
        "first start keeps its slot: two starts closer than the interval"),
    Bug("retake-keeps-tat", LUA + "gate.lua",
        "ms_text(tat + later)", "ms_text(tat)",
        "T29: a late run that asks its gate again starts now, and the rate's next slot "
        "stays where its first start put it"),
    Bug("retake-after-others", LUA + "gate.lua",
        " or got[3] ~= token .. '|' .. got[2] then", " then",
        "T29: a late run takes its rate's slot again after another start was let go"),
    Bug("retake-past-interval", LUA + "gate.lua",
        "  if later > interval then return false end\n", "",
        "T29: a run late by more than an interval moves its rate's slots on by its lateness, "
        "which costs the rate more than the slot it let go"),
    Bug("retake-counts-wait-twice", LUA + "gate.lua",
        "  if record_option(record, 'w') and not again then",
        "  if record_option(record, 'w') then",
        "T29, counters: a late run that asks its gate again adds its wait to held_ms twice"),
    Bug("grant-unnamed", LUA + "gate.lua",
        "'last', ms_text(now), 'by', token .. '|' .. ms_text(now))\n  end",
        "'last', ms_text(now))\n  end",
        "T29, liveness: a late run that asks its gate again finds its start unnamed and "
        "waits for its rate: the rate loses the slot it let go"),
    Bug("arrive-twice", LUA + "arrive.lua",
        "    if redis.call('HEXISTS', KEYS[2], name) == 1 then",
        "    if false then",
        "T24: an arrival is written again"),
    # (``if not run then``, the running set's check dropped, survives and is equivalent: a
    # run record and its running set's entry are written and removed together)
    Bug("depart-with-slot", LUA + "depart.lua",
        "  elseif redis.call('HEXISTS', sys_key(key_start, 'held'), token) == 1 then",
        "  elseif false then",
        "T25: a run holding its key's slot leaves its shard (the slot is left behind)"),
    Bug("settle-drops-arrival", LUA + "arrive.lua",
        "      if verdict == 'c' then\n        local due, id, record",
        "      if false then\n        local due, id, record",
        "T26: an arrival settled 'c' is dropped instead of pended (the moved timer lost)"),
    Bug("restart-pacer-orphans-rate", LUA + "gate.lua",
        "    if slot_lost then promote_rate(ARGV[1], p.name, p.a, p.b, now) end\n",
        "    -- (the rate's next slot stays with nobody)\n",
        "T21, liveness: a pacer that lost its slot to a restart leaves its rate's queue "
        "without a pacer"),
    Bug("handback-keeps-barrier", LUA + "finish.lua",
        "      else\n        drop_ungated(ARGV[1], id, record)\n      end",
        "      end",
        "T16, T18, liveness: a run that ends dead or moved before its gate stays in its "
        "key's order barrier"),
    Bug("handback-drops-place", LUA + "finish.lua",
        "        redis.call('HSET', tokens, id, 'p|' .. barrier_of(record))\n"
        "        noted = {id, record}",
        "        drop_ungated(ARGV[1], id, record)",
        "T17, FIFO: a keyed run handed back before its gate leaves its key's order; a later "
        "timer of the key goes first"),
    Bug("handback-frees-slot", LUA + "finish.lua",
        "  if release and slots_held and", "  if grace > 0 and release and slots_held and",
        "T17, FIFO: a run handed back holding its key's slot frees it for the key's later "
        "timers"),
    Bug("handback-next-pends", LUA + "finish.lua",
        "      and take_back_next(ARGV[1], b, false) then",
        "      and false then",
        "T17, FIFO: a run next in line handed back goes to the due index, behind the key's "
        "later timers"),
    Bug("journal-rerun-blind", LISTENER + "lanes.py",
        "        if (run.source == _RECOVERED or run.reruns) and self.endings.ended_before",
        "        if run.source == _RECOVERED and self.endings.ended_before",
        "invariant 8: a run next in line taken back after its listener ran it to its end "
        "(journaled, unwritten) runs again"),
    Bug("renewal-retries", "timers/store/cluster.py",
        "cluster_error_retry_attempts=1,", "cluster_error_retry_attempts=10,",
        "fence, Cluster: one lease renewal call retries CLUSTERDOWN past the lease"),
    Bug("move-keeps-old", LUA + "move.lua",
        "  withdraw(KEYS[1], KEYS[2], ARGV[1], id)\n  moved = moved + 1\n",
        "  moved = moved + 1\n",
        "T27: a moved timer stays pending under its old prefix as well (it runs twice)"),
    # -- the listener ---------------------------------------------------------------------
    Bug("fence-no-margin", LISTENER + "leases.py",
        "        self.margin = lease / 10", "        self.margin = 0.0",
        "fence: a run starts with its lease about to lapse (the margin removed)"),
    Bug("fence-revalidate-blind", LISTENER + "leases.py",
        "        if run.token in gone:\n            log.warning(\"timer %s not started: this "
        "listener stalled",
        "        if False:\n            log.warning(\"timer %s not started: this listener stalled",
        "fence: after a stall a run another listener took over starts"),
    Bug("renewal-keeps-lost", LISTENER + "leases.py",
        "            timer_id = self.held.drop_lost(text)  # no use renewing it again",
        "            timer_id = None  # no use renewing it again",
        "leases: a run a renewal found lost stays fresh"),
    Bug("late-handed-back", LISTENER + "executor.py",
        '        elif outcome.kind == "late":  # past its window',
        '        elif False:  # past its window',
        "T29, liveness: a rate's run past its start window is handed back at once, its "
        "rate's slot lost, instead of asking its gate once more"),
    Bug("late-child-handed-back", LISTENER + "checks.py",
        '            if outcome.kind == "late" and not late:',
        '            if False:',
        "T29, liveness: a rerun whose quarantine child came past its start window is "
        "handed back at once, its rate's slot lost"),
    Bug("rerun-not-quarantined", LISTENER + "checks.py",
        "        return self._called(start) if is_suspect(start.run.reruns) else None\n",
        "        return None\n",
        "quarantine: a rerun (its listener died or stalled holding it) runs in the listener, "
        "where a poison kills it again with every run it holds, and no death is counted"),
    Bug("executor-fence-always-fresh", LISTENER + "executor.py",
        "        return lambda: fence.fresh(token)\n",
        "        return lambda: True\n",
        "fence: the executor hands the thread and the coroutine a fence that always holds"),
    Bug("revalidated-taken-starts", LISTENER + "executor.py",
        "        return None if await self.fence.revalidate(run) else TAKEN\n",
        "        return None if await self.fence.revalidate(run) else None\n",
        "fence: a run found stale where it was to start, and taken over by another "
        "listener, starts after all"),
    Bug("stale-thread-runs-if-taken", LISTENER + "executor.py",
        "            outcome = (await self._revalidated(run)\n"
        "                       or await",
        "            outcome = (await self._revalidated(run)\n"
        "                       and await",
        "fence: a run its thread found stale is called again only when taken over, and one "
        "still held ends with no outcome"),
    Bug("floor-raised-by-arrival", LUA + "claim.lua",
        "    if due and due < floor then floor = due end\n",
        "    if due or due < floor then floor = due end\n",
        "rule 5: a later timer moving in raises the floor past an earlier one, so a keyed "
        "timer waiting in the shard is claimed ahead of it"),
    Bug("rerun-loses-group", LUA + "claim.lua",
        "      local record = string.match(rest, '^[^|]*|[^:]*:(.*)$') or ''\n",
        "      local record = string.match(rest, '^[^|]*|[^:]*:(.*)$') and ''\n",
        "T5/groups: a lapsed run's rerun is held in the default group's running set, so a "
        "listener of another group takes it over when it lapses again"),
    Bug("thread-unfenced", LISTENER + "calling/thread_pool.py",
        "            stale = job.fence is not None and not job.fence()",
        "            stale = False",
        "fence: a run next in line started in its thread without the fence"),
    Bug("stale-lets-next-go", LISTENER + "calling/thread_pool.py",
        "                return None, wake",
        "                return self._done(job), wake",
        "fence: a run found stale in its thread lets the run next in line after it start "
        "there, before it is revalidated and run"),
    Bug("revalidate-alone", LISTENER + "leases.py",
        "        if run.follows and self.held.holds(run.follows):",
        "        if False:",
        "fence: a run next in line is revalidated without the run before it, whose lease "
        "lapsed in the same stall: a claim reruns that one and takes this one back after it "
        "started"),
    Bug("revalidate-gives-up", LISTENER + "leases.py",
        "                if sent >= gave_up:",
        "                if True:",
        "fence: a stale run whose lease cannot be checked while Redis fails over is dropped "
        "at once, while Redis still holds it next in line on its key"),
    Bug("park-keeps-barrier-note", LUA + "park.lua",
        "  drop_ungated(ARGV[1], id, record)\n",
        "  -- (its note in the order barrier kept)\n",
        "T6: a timer parked after a hand-back keeps its note in its key's order barrier: "
        "left in Redis after it ran"),
    Bug("release-after-gate-keeps-no-place", LUA + "finish.lua",
        "    if not note then  -- (noted: its own token was there)\n",
        "    if false then\n",
        "T17: a run handed back after its gate keeps its key's slot but not its place among its "
        "key's later timers: under a limit of 2 a later one takes the other slot first"),
    Bug("rate-late-called", LISTENER + "calling/thread_pool.py",
        "            elif job.start_by is not None and time.monotonic() > job.start_by:\n",
        "            elif job.start_by is not None and time.monotonic() > job.start_by + 60:\n",
        "invariant 3: a rate's run whose thread took it up past its start window is called "
        "anyway, as close to the rate's next start as its dispatch lag brings it"),
    Bug("floor-holds-pacer", LUA + "claim.lua",
        "    and redis.call('HEXISTS', sys_key(ARGV[1], 'parked'), id) == 0\n",
        "    and true\n",
        "Cluster rule 5: a promoted timer (its rate's pacer) waits for the floor, which the "
        "timers its rate holds may keep down: every claim of the prefix stops"),
    Bug("floor-counts-rate-waits", LUA + "park.lua",
        "        if not note or string.sub(note, 1, 2) ~= 'r|'\n",
        "        if true\n",
        "Cluster rule 5: a timer held for its rate lowers the other shards' floor to its "
        "due time: their keyed timers wait for its rate's queue to drain"),
    Bug("ended-ungated-keeps-flow", LUA + "finish.lua",
        "    if id then leave_flow(token, id) end\n",
        "    if false then leave_flow(token, id) end\n",
        "T28: a promoted timer whose run ends before its gate (missed, refused, ended from a "
        "dead process's journal) keeps its key's slot: the key runs nothing more"),
    Bug("child-completion-unnoted", LISTENER + "quarantine/child.py",
        "    if aside is not None and outcome.ok:\n",
        "    if False:\n",
        "invariant 8 in a quarantine child: a rerun that returned is known only once its "
        "listener reads the outcome; paused or dead before that, the run runs again"),
    Bug("plan-ignores-given-key", LISTENER + "flow/plan.py",
        "    escaped = record.options.get(Option.KEY)\n",
        "    escaped = None\n",
        "T7: a timer scheduled with key= runs past its key's limit (its plan reads no key)"),
    Bug("plan-not-kept", "timers/model/runs.py",
        "            planned = kept[_PLAN] = plan()\n",
        "            planned = plan()\n",
        "T7-T9: a run's plan is worked out again at each stage: a key function that is not "
        "pure gives one run two keys (its screen's and its gate's)"),
    Bug("screen-gates-rated", LISTENER + "flow/gate.py",
        "                 and plan.key_only]",
        "                 and bool(plan.key)]",
        "invariant 3: the claim's screen takes a rate slot a run may not use by its start"),
    Bug("rate-window-dropped", LISTENER + "flow/gate.py",
        "if spec.rate and window is not None and (not spec.key",
        "if False and (not spec.key",
        "invariant 3: a run a rate let go carries no start window (it starts however late)"),
    Bug("rate-window-for-shared-key", LISTENER + "flow/gate.py",
        "(not spec.key or spec.limit == 1)",
        "(not spec.key or spec.limit >= 1)",
        "invariant 2 (FIFO per key): a run holding one of several slots of its key gets a start "
        "window; handed back late, it starts after a later run of its key let go meanwhile"),
    Bug("rate-window-from-reply", LISTENER + "flow/gate.py",
        "                answer.set_result((status, sent))\n",
        "                answer.set_result((status, time.monotonic()))\n",
        "invariant 3: the start window counts from when the gate's reply was read, not from "
        "before its call (the gate decided up to a round trip earlier)"),
    Bug("lateness-unchecked", LISTENER + "checks.py",
        '        return None if missed is None else Outcome("missed", "Missed", missed)\n',
        "        return None\n",
        "max lateness: a run started past its task's or its timer's max lateness is run"),
    Bug("group-unchecked", LISTENER + "checks.py",
        "        if declared is None or group_of(record) == declared:\n",
        "        if True:\n",
        "groups: a timer of another group than its task declares runs here instead of moving"),
    Bug("checks-without-flow", LISTENER + "executor.py",
        "            self.quarantined, FlowCheck(flow))",
        "            self.quarantined)",
        "T7-T9: a run with limits starts without asking its flow gate"),
    Bug("kept-connection-unused", "timers/store/script_modes.py",
        "            runner.send_by(self.connection.execute_command)\n",
        "            pass\n",
        "speed: a client's script calls skip the connection it keeps for them"),
    Bug("rate-run-chained", LISTENER + "executor.py",
        "            own.solo = True  # it may not start: nothing follows in its thread\n",
        "            pass\n",
        "T17: a run next in line is chained in the thread of a rate's run that may find itself "
        "too late and not start: it starts on the key's slot the hand-back keeps for the run "
        "before it"),
    Bug("child-late-started", LISTENER + "quarantine/child.py",
        "        return Go(True, None if said[1] is None else float(said[1]))\n",
        "        return Go(True, None)\n",
        "invariant 3: a quarantine child drops the start window that came with its word"),
    Bug("child-unfenced", LISTENER + "quarantine/child.py",
        "        outcome = await runner.call(fn, json.loads(args_json), fence=held, "
        "start_by=start_by)\n",
        "        outcome = await runner.call(fn, json.loads(args_json), fence=None, "
        "start_by=start_by)\n",
        "fence: a quarantine child starts its rerun without checking the lease its parent "
        "shares with it"),
    Bug("lapses-are-crashes", LISTENER + "quarantine/parent.py",
        "                crashes, how = died + before_start, how_it_died(exitcode)\n",
        "                crashes, how = died + before_start + reruns, how_it_died(exitcode)\n",
        "crashes: lapsed leases (reruns) count toward max_crashes, as deaths seen do"),
    Bug("coroutine-unfenced", LISTENER + "calling/runner.py",
        "    if fence is not None and not fence():\n        return STALE",
        "    if False:\n        return STALE",
        "fence: an async def run next in line starts without the fence"),
    Bug("turn-not-revoked", LISTENER + "flow/turns.py",
        "                turn.revoked, turn.taken_back = True, taken_back",
        "                turn.taken_back = taken_back",
        "T22: a run next in line after a run held at its gate starts"),
    Bug("late-claim-unchecked", LISTENER + "finding/claimer.py",
        "        if runs and waited > self.lease / 2:",
        "        if False:",
        "fence: a claim reply read late is not revalidated"),
    Bug("retry-deaf-to-stop", LISTENER + "retrying.py",
        "        await pause(self.delays.next(), self.until)\n",
        "        await asyncio.sleep(self.delays.next())\n",
        "stop: a loop waiting for Redis to come back sleeps its whole back-off through a stop"),
    Bug("async-write-unchecked", "timers/producer/async_client.py",
        "        await self._check(tasks)\n        return await self.run(operation)\n",
        "        return await self.run(operation)\n",
        "format: an AsyncTimers write other than schedule skips the data-format and eviction "
        "checks (writes into a prefix of a newer format)"),
    Bug("sync-schedule-unchecked", "timers/producer/client.py",
        "        if not self.first_write.clear or self._unasked(spec):\n"
        "            self._check(tasks_of([spec], self.ops.group))\n",
        "",
        "format: a sync schedule skips the data-format and eviction checks (writes into a "
        "prefix of a newer format)"),
    Bug("stale-rerun-old-rate-slot", LISTENER + "flow/gate.py",
        "        if run.token in self.holding and not plan.rate:\n",
        "        if run.token in self.holding:\n",
        "T9: a rerun whose quarantine child found its lease stale starts in a new child on "
        "the rate slot the first child's word carried, an interval or less before the "
        "rate's next start"),
    Bug("subreaper-reaps-nothing", LISTENER + "supervision/supervisor.py",
        "ctypes.byref(flag), 0, 0, 0) == 0\n",
        "ctypes.byref(flag), 0, 0, 0) != 0\n",
        "orphans: a supervisor run as a child subreaper (not PID 1) takes itself for a plain "
        "process and leaves the orphans re-parented to it as zombies"),
    Bug("trim-stale-ids-kept", LUA + "history.lua",
        "      elseif not value or history_value_fields(value) ~= 'de' then\n",
        "      elseif not value and history_value_fields(value) ~= 'de' then\n",
        "history: a trimmed batch's id whose record is gone fails the trim (the history is "
        "no longer bounded), and one that ended again since keeps its stale dead-end entry"),
    Bug("claims-forget-their-keys", LISTENER + "finding/claimer.py",
        "            known_keys=tuple(self.known.keys) if declaring else ())\n",
        "            known_keys=())\n",
        "T4 (declared keys): a lane does not pass the keys its last claims asked for, so "
        "every claim that finds timers due on a cluster asks first: two calls, not one"),
    Bug("known-keys-cut-to-each-claim", LISTENER + "finding/claimer.py",
        "        over = len(keys) - self.cap\n",
        "        over = len(keys) - self.most(limit)\n",
        "T4 (declared keys): a lane cuts the keys it keeps to each claim's size, so a claim "
        "of one or two timers after a wider one drops the head of the window that one asked "
        "for, and the next claim asks for it again"),
    Bug("one-stop-passed-twice", LISTENER + "supervision/supervisor.py",
        "            if forwarded < max(self.signals_received, 1) and (\n",
        "            if forwarded <= max(self.signals_received, 1) and (\n",
        "stop: one SIGTERM to the supervisor reaches its children twice, the second past the "
        "same-stop window, which aborts their running tasks instead of letting them finish"),
    Bug("recycling-without-standby", LISTENER + "supervision/supervisor.py",
        "standby=options.recycles and not options.burst)",
        "standby=options.recycles and options.burst)",
        "recycling: a recycled listener child is replaced cold (no standby child takes over "
        "at once), and a burst run keeps a standby it never uses"),
    Bug("peak-memory-units", LISTENER + "supervision/recycling.py",
        '        return int(peak if sys.platform == "darwin" else peak * 1024)\n',
        '        return int(peak if sys.platform != "darwin" else peak * 1024)\n',
        "recycling: where /proc is missing the peak memory is read in the wrong unit (Linux: "
        "1024 times too small, a memory limit never reached; macOS: 1024 times too big)"),
    Bug("standby-never-ready", LISTENER + "supervision/retiring.py",
        "                self.standby_ready = True\n",
        "                self.standby_ready = False\n",
        "recycling: the standby child's word that it is ready is not taken, so every recycled "
        "child is replaced cold, the standby never used"),
    Bug("retiring-tells-other-slot", LISTENER + "supervision/retiring.py",
        "if old.slot == slot and not old.told and old.child.poll() is None:",
        "if old.slot == slot or not old.told and old.child.poll() is None:",
        "recycling: one slot's replacement claiming tells every other slot's recycled child "
        "to stop claiming before its own replacement claims (a dip below N claiming)"),
    Bug("renewal-twin-loses-server", LISTENER + "leases.py",
        'if (k in _PASSED_ON or k.startswith("ssl_")) and k in accepted}',
        'if (k in _PASSED_ON and k.startswith("ssl_")) and k in accepted}',
        "T5: the lease keeper's client drops the listener's server, database, credentials "
        "and TLS settings, so its renewals go to localhost:6379 (or fail): every lease "
        "lapses while its run goes on, and a claim runs it again"),
    Bug("sharded-retry-runs-unrunnable", "timers/ops/sharded.py",
        "                           runnable_only: bool = True) -> Operation[RetrySummary]:\n"
        "        retried = pending",
        "                           runnable_only: bool = False) -> Operation[RetrySummary]:\n"
        "        retried = pending",
        "failures: on a prefix of several shards, retry_all_failures() schedules again the "
        "dead timers whose task no live listener runs (they are only refused again), "
        "instead of leaving them and saying how many"),
    Bug("claim-on-every-freed-slot", LISTENER + "finding/claimer.py",
        "if delay > 0 and not self.poke.is_set():",
        "if delay > 0 and self.poke.is_set():",
        "idle cost: a listener at its concurrency sends a claim, finding nothing, each time "
        "one of its runs ends while nothing is due"),
    Bug("move-cursor-restarts", LUA + "move.lua",
        "page[#page] or '', page[#page - 1] or ''}",
        "page[#page] and '', page[#page - 1] or ''}",
        "move (design invariant 14): the cursor loses its score, so every page starts over "
        "from the head of the index, and a walk past timers it leaves reads them for ever"),
    Bug("group-failure-waits", LISTENER + "endings/outcomes.py",
        '        if outcome.kind == "disagreed" and record is not None and policy.group',
        '        if outcome.kind == "disagreed" or record is not None and policy.group',
        "a task of a declared group that raises is left waiting as a group disagreement: "
        "never retried, never recorded dead"),
    Bug("moved-run-counted", LISTENER + "endings/outcomes.py",
        "    if kind not in _COUNTED or report.task is None:",
        "    if kind not in _COUNTED and report.task is None:",
        "a run moved to its task's group (never run) counts as a failed run in the "
        "task's series"),
    Bug("unconfirmed-claim-starts", LISTENER + "finding/claimer.py",
        "        if runs and isinstance(reply, UnreplicatedReply):",
        "        if False and runs and isinstance(reply, UnreplicatedReply):",
        "replicas= (T4): runs whose claim no replica confirmed in time start at once, so a "
        "failover that loses the claim runs them again, uncounted"),
    Bug("unconfirmed-handoff-starts", LISTENER + "endings/writer.py",
        "        if handed and isinstance(reply, UnreplicatedReply):",
        "        if False and handed and isinstance(reply, UnreplicatedReply):",
        "replicas= (T12, T13): the next run on a key, handed on by an ending no replica "
        "confirmed, starts at once"),
    Bug("retry-all-skips-one-instant", "timers/ops/failures.py",
        "if not (score == low and member in seen)][:FAILURE_PAGE]",
        "if not (score == low or member in seen)][:FAILURE_PAGE]",
        "failures: retry_all_failures() passes over every record of the score its last page "
        "ended on, so of timers refused at one instant only the first page is retried"),
    Bug("journal-unterminated", LISTENER + "endings/journal.py",
        "            mapped[new] = 0\n", "            pass\n",
        "crash safety (invariant 8): a journal emptied and written again ends its text "
        "nowhere: an adopter reads old lines past the new ones and writes endings Redis "
        "has already"),
    Bug("move-ends-with-a-run-out", "timers/ops/moves.py",
        "        if not moved and not before and not after:\n",
        "        if not moved and not before:\n",
        "operations miss nothing (invariant 14): a move ends while a run claimed during its "
        "last walk is out, and says nothing is left; handed back, the timer stays behind"),
    Bug("rerun-gated-per-child", LISTENER + "quarantine/parent.py",
        "            if admitted or admit is None:\n", "            if admit is None:\n",
        "limits (T7, T8): a rerun whose quarantine child died asks its gate again for the "
        "next child: a second slot of its rate"),
    Bug("starts-before-due", LISTENER + "finding/due_tracker.py",
        "        uncertainty_ms = self._offset.rtt_ms / 2 if self._offset else 0.0\n",
        "        uncertainty_ms = -self._offset.rtt_ms / 2 if self._offset else 0.0\n",
        "a run starts up to half a round trip before its due time on the Redis clock"),
    Bug("idle-trim-deaf-to-writes", LISTENER + "lanes.py",
        "        self.trimmer.written()\n", "        pass\n",
        "history bounds: a listener that writes after an idle spell trims its writes only "
        "when its idle wait ends (up to TRIM_IDLE_MAX), its count overshot meanwhile"),
    Bug("trim-idles-while-dropping", LISTENER + "endings/history.py",
        "            idle = (TRIM_EVERY if done or self._wrote else",
        "            idle = (TRIM_EVERY if self._wrote else",
        "history bounds: a trim loop whose calls still drop records (expired ones, another "
        "listener's writes over the count) waits ever longer between them"),
    Bug("trim-always-empty", LISTENER + "endings/history.py",
        "        self.empty = bool(int(empty))\n",
        "        self.empty = True\n",
        "history bounds: an idle listener waits five minutes between trim calls though the "
        "history holds records to expire"),
    Bug("trim-empty-with-records", LUA + "trim.lua",
        "== 0 and redis.call('HLEN', KEYS[3]) == 0 then",
        "== 0 or redis.call('HLEN', KEYS[3]) == 0 then",
        "history bounds: a history whose records no batch names is said empty, and its "
        "trimmer waits five minutes"),
    Bug("reader-keeps-a-moved-group", LISTENER + "finding/events.py",
        "                    return  # a shard moved into or out of this node's group",
        "                    pass  # a shard moved into or out of this node's group",
        "events (Cluster): a lane whose shard moved to another node is still subscribed for "
        "on the old node's group; its wake messages go unheard until something else "
        "resubscribes"),
    Bug("late-finish-silent", LISTENER + "endings/writer.py",
        "report_late_finishes(int(reply[0] or 0), self.eviction_policy)",
        "report_late_finishes(0, self.eviction_policy)",
        "late finishes: a run gone from Redis when its ending is written (evicted, flushed, "
        "or taken over after a stall) is counted but never reported: no ERROR line"),
    Bug("loop-death-ignored", LISTENER + "lanes.py",
        "        exc = task.exception()\n        if exc is not None:\n",
        "        exc = task.exception()\n        if exc is None:\n",
        "a listener loop that dies of a bug leaves the listener running without it, not "
        "stopped and marked crashed (no exit status, no restart by its supervisor)"),
    Bug("idle-lease-renews", LISTENER + "leases.py",
        "        if not tokens or self._stop.is_set():\n",
        "        if not tokens and self._stop.is_set():\n",
        "idle cost: a listener holding no run still sends a lease renewal every third of a "
        "lease"),
    Bug("gate-call-unmarked", LISTENER + "flow/gate.py",
        "            leases.ending(tokens)\n", "            pass\n",
        "leases: a renewal that runs between the gate holding a run back (T7/T9) and the "
        "listener reading that reply warns that the run was recovered elsewhere, which "
        "never happened"),
    Bug("gate-go-stays-marked", LISTENER + "flow/gate.py",
        "for t, s in zip(tokens, statuses, strict=True) if s == GO]",
        "for t, s in zip(tokens, statuses, strict=True) if s == '-']",
        "leases: a run its gate let go stays marked as ending, so its real loss to another "
        "listener later goes without a warning"),
    Bug("recurrence-not-told-the-end", LISTENER + "executor.py",
        "        if start.recurring:  # (a run stopped before its recurrence's step",
        "        if False:  # (a run stopped before its recurrence's step",
        "recurrences: an occurrence's run never tells its recurrence it ended: with overlap "
        "off the next occurrence is skipped while the slot it never freed is held"),
    Bug("lacking-not-passed", LISTENER + "checks.py",
        '            return Outcome("passed", "", runners[0].describe())\n',
        "            pass\n",
        "groups: a task this listener lacks is refused though a live listener that has it "
        "serves its group, instead of handed back for that one"),
    Bug("unwritten-ending-rerun", LISTENER + "endings/writer.py",
        "            self.add(done.for_run(run), self.facts_of(done))\n            return True\n",
        "            self.add(done.for_run(run), self.facts_of(done))\n            return False\n",
        "invariant 8: a rerun whose cut run's ending was still on its way to Redis from this "
        "listener is ended that way and run again as well"),
    Bug("follower-chained-when-recurring", LISTENER + "checks.py",
        "        if after is not None and (start.recurring or is_suspect(run.reruns)\n",
        "        if after is not None and (is_suspect(run.reruns)\n",
        "T6: a recurrence's run next in line starts in the thread of the run before it, "
        "before its recurrence's step has scheduled the next occurrence"),
    Bug("follower-start-not-reset", LISTENER + "checks.py",
        "            start.started_ms = self.tracker.redis_now_ms()\n",
        "            pass\n",
        "lateness: a run next in line that waited for the run before it counts its start "
        "from before the wait: its max lateness misses it, its report misdates it"),
    Bug("follower-revoked-starts", LISTENER + "checks.py",
        "is not None and own.revoked:\n", "is not None and not own.revoked:\n",
        "T5/T17: a run next in line asked back before it started (the run before it did "
        "not start) starts anyway, and one not asked back does not"),
    Bug("recurrence-step-skipped", LISTENER + "checks.py",
        "        if not start.recurring:\n            return None\n",
        "        if start.recurring:\n            return None\n",
        "recurrences: an occurrence's run schedules no next occurrence: the chain ends"),
    Bug("resolve-ignores-task-limits", LISTENER + "checks.py",
        "        start.limited = policy.flow_limited or start.limited\n",
        "        start.limited = start.limited\n",
        "T7-T9: a run of a task that declares a rate or concurrency starts without asking "
        "its flow gate (only a key given at scheduling is gated)"),
    Bug("context-not-entered", LISTENER + "checks.py",
        "        context.enter_run(start.run, start.record, start.started_ms, start.fence)\n",
        "        pass\n",
        "timers.current(): a task sees no context of its run (its id, attempt, lease check)"),
    # -- drawn at random and survived, until a test looked there (bench/FINDINGS.md, "Bugs
    # drawn at random") ---------------------------------------------------------------------
    Bug("finish-follow-flag-unchecked", LUA + "finish.lua",
        "    or (ARGV[8] ~= '0' and ARGV[8] ~= '1') or not is_count(ARGV[9]) or not",
        "    or (ARGV[8] ~= '0' and ARGV[8] ~= '1') and not is_count(ARGV[9]) or not",
        "bad input: finish takes a follow flag other than 0 or 1, or a history age that is "
        "not a count, and writes"),
    Bug("finish-follows-undeclared", LUA + "finish.lua",
        "    if kind == 'release' and ARGV[i + 3] ~= '' then need_release(",
        "    if kind ~= 'release' and ARGV[i + 3] ~= '' then need_release(",
        "T17 (declared keys): a run next in line handed back naming the run before it "
        "touches that run's key queue undeclared (Cluster: -ASK mid-script in a migration)"),
    Bug("recurrence-after-silent", LISTENER + "cron_hook.py",
        "                if attempt + 1 == self.AFTER_ATTEMPTS:\n",
        "                if attempt - 1 == self.AFTER_ATTEMPTS:\n",
        "recurrences: a step after a run that Redis refused every time ends in silence: a "
        "catch_up='all' occurrence's next is never scheduled, the chain ends"),
    Bug("rejected-ask-dropped", LISTENER + "finding/rejected.py",
        '        elif screened == "ask":', '        elif screened != "ask":',
        "rejections: an expired key of a task nobody runs, met with a view in hand, is "
        "dropped in silence instead of recorded as rejected"),
    Bug("keeper-thread-idle", LISTENER + "leases.py",
        "        while not self._stop.wait(self.lease / 3):\n            self.renew_once()\n",
        "        while not self._stop.wait(self.lease / 3):\n            pass\n",
        "T19: the lease keeper's thread renews nothing: every run longer than its lease is "
        "recovered and run again elsewhere"),
    Bug("status-ender-unnamed", "timers/ops/status.py",
        "        return f\"cancelled {when} by {record.listener or '?'}\"",
        "        return f\"cancelled {when} by {record.listener and '?'}\"",
        "status: a cancelled timer's line says '?' for who cancelled it"),
    Bug("batch-untracked", "timers/producer/coalesce.py",
        "            self._in_flight.add(task)\n", "            pass\n",
        "asyncio producer: closing the client does not wait for a batch of schedules on the "
        "wire (its connection closes under it), and a batch's task may be collected"),
    Bug("history-scan-unbounded", "timers/ops/history.py",
        "        while len(out) < limit and offset < HISTORY_SCAN:",
        "        while len(out) < limit or offset < HISTORY_SCAN:",
        "history: a filtered read of an index goes on past its scan cap (a dashboard page "
        "reads a whole index of millions)"),
)
