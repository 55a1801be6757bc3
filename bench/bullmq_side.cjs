// BullMQ on the workload of bench/side.py, driven as its README says.
//
//   NODE_PATH=<folder>/node_modules node bench/bullmq_side.cjs SCENARIO URL [SINK] [N] [SECONDS]
//
// bench/peers.py installs bullmq with npm into its own folder under /tmp (the project never
// depends on it) and runs this with that NODE_PATH. Prints one JSON object of figures on its
// last line of stdout, as side.py does. Scenarios, each bounded in count and time:
//   single  queue.add() one after another for SECONDS, delay an hour, 100-byte data;
//   bulk    one queue.addBulk() of N jobs, delay an hour;
//   batches addBulk() calls of B jobs (BATCH, the sixth argument) one after another, until
//           N jobs or SECONDS (the jobs built before the clock starts), as side.py's batches;
//   async   100 add() calls in flight (100 loops awaiting add) for SECONDS;
//   fire    N jobs due at one instant (addBulk with their delay), one Worker process
//           (concurrency 50, a child of this one) whose async processor RPUSHes
//           "seq,due_ms,start_ms" to the second server SINK with its own ioredis client;
//   alone   the floor under fire: that processor's RPUSH alone, N calls from 50 loops
//           (its concurrency) on one ioredis client, no BullMQ around it;
//   scripts {sha: name} of the Lua scripts BullMQ's client defines (to name EVALSHA calls).
"use strict";
const fs = require("fs");
const { spawn } = require("child_process");
const { Queue, Worker } = require("bullmq");
const IORedis = require("ioredis");

const QUEUE = "bench";
const HOUR_MS = 3600 * 1000;
const SINK_LIST = "bench:pushed";
const DATA = { user_id: 1, text: "x".repeat(87) };
const PAYLOAD = "p".repeat(100);

function connection(url) {
  const u = new URL(url);
  return { host: u.hostname, port: Number(u.port || 6379), maxRetriesPerRequest: null };
}

function cpuUs() {
  const u = process.cpuUsage();
  return u.user + u.system;
}

function procCpuS(pid) {
  const fields = fs.readFileSync(`/proc/${pid}/stat`, "utf8").split(")").pop().trim().split(/\s+/);
  return (Number(fields[11]) + Number(fields[12])) / 100; // USER_HZ is 100 on Linux
}

async function single(url, seconds, maxN) {
  const queue = new Queue(QUEUE, { connection: connection(url) });
  for (let i = 0; i < 50; i++) await queue.add("noop", DATA, { delay: HOUR_MS });
  let n = 0;
  const c0 = cpuUs();
  const start = performance.now();
  const end = start + seconds * 1000;
  while (performance.now() < end && n < maxN) {
    for (let i = 0; i < 50; i++) await queue.add("noop", DATA, { delay: HOUR_MS });
    n += 50;
  }
  const wall = (performance.now() - start) / 1000;
  const cpu = cpuUs() - c0;
  await queue.close();
  return { rate: n / wall, n, client_cpu_us: cpu / n };
}

async function bulk(url, n) {
  const queue = new Queue(QUEUE, { connection: connection(url) });
  await queue.add("noop", DATA, { delay: HOUR_MS });
  const jobs = [];
  for (let i = 0; i < n; i++) {
    jobs.push({ name: "noop", data: { user_id: i, text: "x".repeat(88 - String(i).length) },
                opts: { delay: HOUR_MS } });
  }
  const c0 = cpuUs();
  const start = performance.now();
  await queue.addBulk(jobs);
  const wall = (performance.now() - start) / 1000;
  const cpu = cpuUs() - c0;
  await queue.close();
  return { rate: n / wall, n, client_cpu_us: cpu / n };
}

async function batches(url, n, batch, seconds) {
  const queue = new Queue(QUEUE, { connection: connection(url) });
  const jobsOf = (count) => Array.from({ length: count }, (_, i) => (
    { name: "noop", data: { user_id: i, text: "x".repeat(88 - String(i).length) },
      opts: { delay: HOUR_MS } }));
  await queue.addBulk(jobsOf(Math.min(batch, 100)));
  const calls = Array.from({ length: Math.max(Math.floor(n / batch), 1) }, () => jobsOf(batch));
  let done = 0;
  const c0 = cpuUs();
  const start = performance.now();
  const end = start + seconds * 1000;
  for (const jobs of calls) {
    await queue.addBulk(jobs);
    done += batch;
    if (performance.now() > end) break;
  }
  const wall = (performance.now() - start) / 1000;
  const cpu = cpuUs() - c0;
  await queue.close();
  return { rate: done / wall, n: done, client_cpu_us: cpu / done };
}

async function inFlight(url, seconds, maxN, width = 100) {
  const queue = new Queue(QUEUE, { connection: connection(url) });
  await Promise.all(Array.from({ length: width }, () => queue.add("noop", DATA, { delay: HOUR_MS })));
  let done = 0;
  const c0 = cpuUs();
  const start = performance.now();
  const end = start + seconds * 1000;
  async function loop() {
    while (performance.now() < end && done < maxN) {
      await queue.add("noop", DATA, { delay: HOUR_MS });
      done += 1;
    }
  }
  await Promise.all(Array.from({ length: width }, loop));
  const wall = (performance.now() - start) / 1000;
  const cpu = cpuUs() - c0;
  await queue.close();
  return { rate: done / wall, n: done, client_cpu_us: cpu / Math.max(done, 1) };
}

async function work(url, sinkUrl, maxSeconds) {
  const sink = new IORedis(sinkUrl);
  const worker = new Worker(QUEUE, async (job) => {
    const startMs = Date.now() + (performance.now() % 1); // ms since the epoch
    const [seq, dueMs] = job.data;
    await sink.rpush(SINK_LIST, `${seq},${dueMs},${startMs.toFixed(3)}`);
  }, { connection: connection(url), concurrency: 50 });
  const stop = async () => {
    await worker.close();
    sink.disconnect();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  setTimeout(stop, maxSeconds * 1000).unref();
  await worker.waitUntilReady();
  process.stdout.write("ready\n");
}

async function fire(url, sinkUrl, n, timeout) {
  const sink = new IORedis(sinkUrl);
  await sink.del(SINK_LIST);
  const broker = new IORedis(connection(url));
  const child = spawn(process.execPath, [__filename, "work", url, sinkUrl, String(n),
                                         String(timeout + 60)],
                      { stdio: ["ignore", "pipe", "inherit"], env: process.env });
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("the worker did not get ready")), 30000);
    child.stdout.on("data", (d) => { if (String(d).includes("ready")) { clearTimeout(timer); resolve(); } });
    child.on("exit", () => reject(new Error("the worker exited")));
  });
  const queue = new Queue(QUEUE, { connection: connection(url) });
  await queue.waitUntilReady();
  // room to add all N before the due time, from this producer's addBulk rate here and now
  const warm = Array.from({ length: 1000 }, () => ({ name: "noop", data: DATA, opts: { delay: HOUR_MS } }));
  const t0 = performance.now();
  await queue.addBulk(warm);
  const rate = 1000 / ((performance.now() - t0) / 1000);
  const lead = 2 + 1.5 * n / rate;
  const dueMs = Date.now() + Math.round(lead * 1000);
  for (let i = 0; i < n; i += 1000) {
    const jobs = [];
    for (let j = i; j < Math.min(n, i + 1000); j++) {
      jobs.push({ name: "push", data: [j, dueMs, PAYLOAD], opts: { delay: dueMs - Date.now() } });
    }
    await queue.addBulk(jobs);
  }
  const lateEnqueue = Math.max(0, Date.now() - dueMs);
  const serverCpu = async () => {
    const info = await broker.info("cpu");
    const get = (k) => Number(info.match(new RegExp(`${k}:([0-9.]+)`))[1]);
    return get("used_cpu_sys") + get("used_cpu_user");
  };
  const server0 = await serverCpu();
  const cpu0 = procCpuS(child.pid);
  const end = Date.now() + Math.max(0, dueMs - Date.now()) + timeout * 1000;
  while ((await sink.llen(SINK_LIST)) < n && Date.now() < end) {
    await new Promise((r) => setTimeout(r, 50));
  }
  const cpu = procCpuS(child.pid) - cpu0;
  const server = (await serverCpu()) - server0;
  child.kill("SIGTERM");
  await new Promise((r) => { child.on("exit", r); setTimeout(r, 20000); });
  const starts = (await sink.lrange(SINK_LIST, 0, -1)).map((l) => Number(l.split(",")[2]));
  await queue.close();
  sink.disconnect();
  broker.disconnect();
  if (!starts.length) return { rate: 0, n: 0, complete: 0 };
  const span = (Math.max(...starts) - dueMs) / 1000;
  return { rate: starts.length / span, n: starts.length, complete: starts.length >= n ? 1 : 0,
           first_ms: Math.min(...starts) - dueMs, last_s: span,
           worker_cpu_us: cpu / starts.length * 1e6, server_cpu_us: server / starts.length * 1e6,
           late_enqueue_ms: lateEnqueue };
}

async function alone(sinkUrl, n, width = 50) {
  const sink = new IORedis(sinkUrl);
  const push = (seq) => {
    const startMs = Date.now() + (performance.now() % 1);
    return sink.rpush(SINK_LIST, `${seq},0,${startMs.toFixed(3)}`);
  };
  await Promise.all(Array.from({ length: width }, (_, i) => push(i)));
  const per = Math.floor(n / width);
  const c0 = cpuUs();
  const start = performance.now();
  async function loop() {
    for (let i = 0; i < per; i++) await push(i);
  }
  await Promise.all(Array.from({ length: width }, loop));
  const wall = (performance.now() - start) / 1000;
  const cpu = cpuUs() - c0;
  sink.disconnect();
  return { rate: per * width / wall, n: per * width, worker_cpu_us: cpu / (per * width) };
}

function scripts() {
  // ioredis sends each script by the SHA1 of the text BullMQ defines it with
  const defined = require("bullmq/dist/cjs/scripts");
  const out = {};
  for (const script of Object.values(defined)) {
    if (script && typeof script.content === "string") {
      out[require("crypto").createHash("sha1").update(script.content).digest("hex")] = script.name;
    }
  }
  return out;
}

async function main() {
  const [scenario, url, sinkUrl, nText, secondsText, batchText] = process.argv.slice(2);
  const n = Number(nText || 20000);
  const seconds = Number(secondsText || 3);
  let out;
  if (scenario === "work") return work(url, sinkUrl, seconds);
  if (scenario === "single") out = await single(url, seconds, n * 10);
  else if (scenario === "bulk") out = await bulk(url, n);
  else if (scenario === "batches") out = await batches(url, n, Number(batchText), seconds);
  else if (scenario === "async") out = await inFlight(url, seconds, n * 100);
  else if (scenario === "fire") out = await fire(url, sinkUrl, n, 10 + n / 500);
  else if (scenario === "alone") out = await alone(sinkUrl, n);
  else if (scenario === "scripts") out = scripts();
  else throw new Error(`unknown scenario ${scenario}`);
  process.stdout.write(JSON.stringify(out) + "\n");
  process.exit(0);
}

main().catch((e) => { console.error(e); process.exit(1); });
