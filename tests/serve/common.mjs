// Shared by the zipage-serve tests: start the server on a free port of 127.0.0.1, load the OpenAI client
// installed by npm_install.sh, helpers for raw HTTP and /metrics.
//   env ZIPAGE_SERVE_BIN: the zipage-serve binary; ZIPAGE_SERVE_NODE_DIR: the directory holding node_modules.
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';

export const SKIP = 77;

// Fails the test (exit 1) if it runs longer than `seconds`.
export function deadline(seconds) {
  setTimeout(() => {
    console.error(`FAIL: the test ran longer than ${seconds} s`);
    process.exit(1);
  }, seconds * 1000).unref();
}

export function loadOpenAI() {
  const dir = process.env.ZIPAGE_SERVE_NODE_DIR;
  try {
    const req = createRequire(path.join(dir ?? '.', 'package.json'));
    const mod = req('openai');
    return mod.OpenAI ?? mod.default ?? mod;
  } catch (e) {
    console.log(`SKIPPED: the OpenAI Node client is not installed in ${dir}/node_modules (npm unavailable?): ${e.message}`);
    process.exit(SKIP);
  }
}

// Starts zipage-serve with `args` on port 0 and resolves once it prints its URL and /health answers.
export async function startServer(args, { quiet = true } = {}) {
  const bin = process.env.ZIPAGE_SERVE_BIN;
  if (!bin) throw new Error('ZIPAGE_SERVE_BIN is not set');
  const proc = spawn(bin, ['--host', '127.0.0.1', '--port', '0', ...args], { stdio: ['ignore', 'inherit', 'pipe'] });
  let log = '';
  let exitStatus = null;  // set if the server exits, e.g. killed by a signal mid-test
  const exited = new Promise((resolve) =>
    proc.on('exit', (code, signal) => {
      exitStatus = { code, signal, at: new Date().toISOString() };
      resolve(exitStatus);
    }));
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`zipage-serve did not start in 30 s:\n${log}`)), 30000);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      if (!quiet) process.stderr.write(d);
      const m = log.match(/on http:\/\/127\.0\.0\.1:(\d+)\/v1/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    proc.on('exit', (code) => reject(new Error(`zipage-serve exited (${code}) before listening:\n${log}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 100; ++i) {
    try {
      if ((await fetch(`${base}/health`)).ok) break;
    } catch {}
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    proc,
    port,
    base,
    exited,
    log: () => log,
    exitStatus: () => exitStatus,
    async stop() {
      if (proc.exitCode === null) proc.kill('SIGTERM');
      return exited;
    },
  };
}

export async function post(base, route, body, headers = {}) {
  const res = await fetch(`${base}${route}`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {}
  return { status: res.status, text, json };
}

// The Prometheus samples of /metrics as { name: value } (labels dropped, first sample of each name).
export async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$/);
    if (m && !(m[1] in out)) out[m[1]] = Number(m[3]);
  }
  return out;
}

// Polls /metrics (the engine's counters as of its last step) until pred(samples) holds; returns them, or
// throws `${what} within ${ms} ms` with the last samples.
export async function waitMetrics(base, pred, what, ms = 3000) {
  const until = Date.now() + ms;
  let m;
  while (Date.now() < until) {
    m = await metrics(base);
    if (pred(m)) return m;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`${what} within ${ms} ms: ${JSON.stringify(m)}`);
}

// Waits until /metrics shows no KV block in use and nothing running or waiting.
export function waitIdle(base, ms = 10000) {
  return waitMetrics(base, (m) => m.zipage_kv_blocks_used === 0 && m.zipage_num_requests_running === 0 &&
                                  m.zipage_num_requests_waiting === 0 && m.zipage_num_requests_swapped === 0,
                     'the server is not idle', ms);
}

export function percentile(values, p) {
  if (values.length === 0) return NaN;
  const s = [...values].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}

// Runs `main`, stops the server(s) it registered and reports the result; a failure exits with 1.
export async function run(name, main) {
  const servers = [];
  const t0 = Date.now();
  let failed = false;
  try {
    await main(servers);
    console.log(`${name}: OK (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  } catch (e) {
    failed = true;
    console.error(`${name}: FAIL: ${e.stack ?? e}`);
    for (const s of servers) {
      const st = s.exitStatus();
      console.error(`--- server log (${st ? `the server had exited: code ${st.code}, signal ${st.signal}, at ${st.at}` :
                                          'the server was still running'}) ---\n${s.log().slice(-4000)}`);
    }
  } finally {
    for (const s of servers) await s.stop();
  }
  if (failed) process.exit(1);
}
