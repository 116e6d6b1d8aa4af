// make bench-compute: times the filter's request-path compute under node's
// V8 (the vm-bench crate, wasm32-unknown-unknown). Usage:
//   node scripts/bench/vm-compute.js <vm_bench.wasm> [requests] [big] [rounds]
// Prints us per request for parse, parse + hash and parse + route + release
// on the bodies of `prefix-bench overhead`: the median of `rounds` passes
// (warm: one body after another), then the same one body at a time with the
// CPU caches flushed before each (cold: a 4 MiB buffer written, about one
// core's L2 twice over; Envoy's own work between two requests does the
// same to the filter's code and data), and allocations per request.
'use strict';
const fs = require('fs');
const [wasm, n = '3000', big = '20', rounds = '5'] = process.argv.slice(2);
if (!wasm) {
  console.error('usage: vm-compute.js <vm_bench.wasm> [requests] [big] [rounds]');
  process.exit(2);
}
const e = new WebAssembly.Instance(new WebAssembly.Module(fs.readFileSync(wasm)), {}).exports;
if (!e.prepare(Number(n), Number(big))) {
  console.error('vm-bench: the configuration was refused');
  process.exit(1);
}
const workloads = ['8 KB chat, matched prefix', '8 KB chat, new prefix', '400 KiB completions, new'];
const stages = ['parse', 'parse + hash', 'parse + route + release'];
function median(xs) { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; }
// Routing writes the table: every routing pass starts from the primed
// table (reset, not timed), so new prefixes are new in every pass.
const order = [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2], [2, 0], [2, 1], [2, 2]];
const result = {};
for (const [w, st] of order) {
  const count = e.bodies(w);
  const times = [];
  if (st === 2) e.reset();
  e.run(st, w); // warm-up pass
  for (let r = 0; r < Number(rounds); r++) {
    if (st === 2) e.reset();
    const t0 = process.hrtime.bigint();
    const ok = e.run(st, w);
    const dt = Number(process.hrtime.bigint() - t0) / 1000;
    if (ok !== count) { console.error(`vm-bench: ${ok} of ${count} ${workloads[w]} failed ${stages[st]}`); process.exit(1); }
    times.push(dt / count);
  }
  result[`${w}/${st}`] = median(times);
}
// Cold: each body alone, after the flush; the median over the bodies.
const flush = new Float64Array(4 * 1024 * 1024 / 8);
let sink = 0;
function evict() {
  for (let i = 0; i < flush.length; i += 8) flush[i] += 1;
  sink += flush[0];
}
const cold = {};
const allocs = {};
for (const [w, st] of order) {
  const count = e.bodies(w);
  if (st === 2) e.reset();
  e.allocations();
  const times = [];
  for (let i = 0; i < count; i++) {
    evict();
    const t0 = process.hrtime.bigint();
    const ok = e.run_one(st, w, i);
    const dt = Number(process.hrtime.bigint() - t0) / 1000;
    if (ok !== 1) { console.error(`vm-bench: ${workloads[w]} body ${i} failed ${stages[st]}`); process.exit(1); }
    times.push(dt);
  }
  allocs[`${w}/${st}`] = e.allocations() / count;
  cold[`${w}/${st}`] = median(times);
}
function table(title, values, digits) {
  console.log(title);
  console.log('| workload | ' + stages.join(' | ') + ' |');
  console.log('|---|' + stages.map(() => '---|').join(''));
  for (let w = 0; w < 3; w++) {
    console.log(`| ${workloads[w]} | ` + [0, 1, 2].map(st => values[`${w}/${st}`].toFixed(digits)).join(' | ') + ' |');
  }
}
table(`filter compute under node ${process.version} (V8 ${process.versions.v8}), us per request, warm: median of ${rounds} passes`, result, 2);
table('\ncold (caches flushed before each request): median us per request', cold, 2);
table('\nallocations (and reallocations) per request', allocs, 1);
if (sink === 0) console.log('');
