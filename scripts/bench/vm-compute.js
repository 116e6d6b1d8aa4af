// make bench-compute: times the filter's request-path compute under node's
// V8 (the vm-bench crate, wasm32-unknown-unknown). Usage:
//   node scripts/bench/vm-compute.js <vm_bench.wasm> [requests] [big] [rounds]
// Prints us per request for parse, parse + hash and parse + route + release
// on the bodies of `prefix-bench overhead`: the median of `rounds` passes.
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
console.log(`filter compute under node ${process.version} (V8 ${process.versions.v8}), us per request, median of ${rounds} passes`);
console.log('| workload | ' + stages.join(' | ') + ' |');
console.log('|---|' + stages.map(() => '---|').join(''));
for (let w = 0; w < 3; w++) {
  console.log(`| ${workloads[w]} | ` + [0, 1, 2].map(st => result[`${w}/${st}`].toFixed(2)).join(' | ') + ' |');
}
