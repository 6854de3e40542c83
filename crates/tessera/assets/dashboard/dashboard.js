// The Tessera dashboard: polls the daemon's read-only API every two seconds and draws
// throughput, IOPS and latency over time per mounted file system, capacity, arrays,
// pdisks, component health and events. No build step and no network beyond the daemon.
"use strict";

const REFRESH_MS = 2000;
// The daemon keeps an hour of one-second samples; so does the page.
const WINDOW_SAMPLES = 3600;
const charts = new Map(); // fs name -> { card, data, lastMs, plots }
let refreshes = 0;

async function api(path) {
  const r = await fetch("/api/v1/" + path, { cache: "no-store" });
  const body = await r.json();
  if (!r.ok) throw new Error(path + ": " + (body.error || r.status));
  return body;
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : String(c));
  return e;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + units[i];
}

function time(unix) {
  return new Date(unix * 1000).toLocaleString();
}

function fill(table, rows) {
  const body = document.querySelector("#" + table + " tbody");
  body.replaceChildren(...rows);
}

// pdisk states as `pdisk ls` prints them, grouped the way an admin reads them.
function pdiskClass(state) {
  if (state.startsWith("ok") && !state.includes("catching")) return "state-ok";
  if (["dead", "missing"].some((s) => state.startsWith(s))) return "state-failed";
  return "state-degraded";
}

function plotOptions(title, unit, series, width) {
  return {
    title, width, height: 220,
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(max, 1e-9) * 1.1] } },
    axes: [{}, { label: unit, size: 70 }],
    series: [{}, ...series],
  };
}

function fsCard(name) {
  const card = el("div", { class: "fs", id: "fs-" + name, "data-fs": name });
  const summary = el("div", { class: "summary" });
  const plots = el("div", { class: "charts" });
  card.append(el("h3", {}, name), summary, plots);
  document.getElementById("filesystems").append(card);
  const width = Math.max(360, Math.min(620, (window.innerWidth - 80) / 2));
  const data = { t: [], rb: [], wb: [], ro: [], wo: [], r50: [], r99: [], w50: [], w99: [] };
  const mk = (opts) => {
    const holder = el("div");
    plots.append(holder);
    return new uPlot(opts, [[]], holder);
  };
  const entry = {
    card, summary, data, lastMs: 0,
    throughput: mk(plotOptions("Throughput", "MB/s", [
      { label: "read MB/s", stroke: "#2a9d8f", width: 2 },
      { label: "write MB/s", stroke: "#e76f51", width: 2 },
    ], width)),
    iops: mk(plotOptions("Operations", "ops/s", [
      { label: "reads/s", stroke: "#2a9d8f", width: 2 },
      { label: "writes/s", stroke: "#e76f51", width: 2 },
    ], width)),
    latency: mk(plotOptions("Latency", "ms", [
      { label: "read p50", stroke: "#2a9d8f" },
      { label: "read p99", stroke: "#2a9d8f", dash: [4, 4] },
      { label: "write p50", stroke: "#e76f51" },
      { label: "write p99", stroke: "#e76f51", dash: [4, 4] },
    ], width)),
  };
  charts.set(name, entry);
  return entry;
}

async function refreshFs(fs) {
  const entry = charts.get(fs.name) || fsCard(fs.name);
  const t = await api("filesystems/" + encodeURIComponent(fs.name) + "/throughput?since=" + entry.lastMs);
  const d = entry.data;
  for (const s of t.samples) {
    d.t.push(s.unix_ms / 1000);
    d.rb.push(s.read_bytes_per_s / 1e6);
    d.wb.push(s.write_bytes_per_s / 1e6);
    d.ro.push(s.read_ops_per_s);
    d.wo.push(s.write_ops_per_s);
    d.r50.push(s.read_p50_ms); d.r99.push(s.read_p99_ms);
    d.w50.push(s.write_p50_ms); d.w99.push(s.write_p99_ms);
    entry.lastMs = s.unix_ms;
  }
  for (const k of Object.keys(d)) {
    if (d[k].length > WINDOW_SAMPLES) d[k].splice(0, d[k].length - WINDOW_SAMPLES);
  }
  entry.throughput.setData([d.t, d.rb, d.wb]);
  entry.iops.setData([d.t, d.ro, d.wo]);
  entry.latency.setData([d.t, d.r50, d.r99, d.w50, d.w99]);
  const peak = (xs) => xs.reduce((a, b) => Math.max(a, b), 0);
  const last = (xs) => (xs.length ? xs[xs.length - 1] : 0);
  // What the page shows, also as attributes, so that a test can read it off the DOM.
  entry.card.setAttribute("data-samples", d.t.length);
  entry.card.setAttribute("data-peak-read-bytes-per-s", Math.round(peak(d.rb) * 1e6));
  entry.card.setAttribute("data-peak-write-bytes-per-s", Math.round(peak(d.wb) * 1e6));
  const u = fs.usage;
  const used = u.size_bytes - u.free_bytes;
  const pct = u.size_bytes ? (100 * used) / u.size_bytes : 0;
  const bar = el("span", { class: "bar" }, el("div", { style: "" }));
  bar.firstChild.style.width = pct.toFixed(1) + "%";
  entry.summary.replaceChildren(
    el("span", {}, "mounted at ", el("b", {}, fs.mount_point)),
    el("span", {}, "capacity ", bar, " ", bytes(used) + " of " + bytes(u.size_bytes) + " (" + pct.toFixed(1) + "%)"),
    el("span", {}, "inodes ", el("b", {}, u.inodes_used.toLocaleString()), " of " + u.inodes_max.toLocaleString()),
    el("span", {}, "now: read ", el("b", {}, last(d.rb).toFixed(1) + " MB/s"), ", write ", el("b", {}, last(d.wb).toFixed(1) + " MB/s")),
    el("span", {}, "peak: read " + peak(d.rb).toFixed(1) + " MB/s, write " + peak(d.wb).toFixed(1) + " MB/s"),
  );
}

async function refresh() {
  const [fss, das, pdisks, health, events] = await Promise.all([
    api("filesystems"), api("das"), api("pdisks"), api("health"), api("events"),
  ]);
  const mounted = fss.filesystems.filter((f) => f.mounted_here);
  for (const [name, entry] of charts) {
    if (!mounted.some((f) => f.name === name)) { entry.card.remove(); charts.delete(name); }
  }
  for (const fs of mounted) await refreshFs(fs);
  document.getElementById("no-filesystems").hidden = mounted.length > 0;

  fill("das", das.map((a) => el("tr", { "data-da": a.name },
    el("td", {}, a.name),
    el("td", { class: a.state === "ok" ? "state-ok" : a.state === "data loss" ? "state-failed" : "state-degraded" }, a.state),
    el("td", { class: "num" }, a.pdisks),
    el("td", { class: "num" }, bytes(a.capacity_bytes)),
    el("td", { class: "num" }, bytes(a.free_bytes)),
    el("td", {}, a.tasks.map((t) => t.task + " " + (t.total ? ((100 * t.done) / t.total).toFixed(0) : 0) + "%" +
      (t.finished ? " (done)" : t.eta_seconds != null ? ", " + t.eta_seconds + " s left" : "")).join("; ") || "none"),
  )));
  fill("pdisks", pdisks.map((p) => el("tr", { "data-pdisk": p.name, "data-state": p.state },
    el("td", {}, p.name), el("td", {}, p.da), el("td", {}, p.enclosure + "/" + p.slot),
    el("td", { class: pdiskClass(p.state) }, pdiskClass(p.state) === "state-failed" ? "FAILED (" + p.state + ")" : p.state),
    el("td", { class: "num" }, p.read_errors), el("td", { class: "num" }, p.write_errors),
    el("td", { class: "num" }, p.checksum_errors), el("td", {}, p.device),
  )));
  fill("health", health.components.map((c) => el("tr", { "data-component": c.component, "data-entity": c.entity, "data-status": c.status },
    el("td", {}, c.component), el("td", {}, c.entity), el("td", { class: c.status }, c.status),
    el("td", {}, time(c.since_unix)), el("td", {}, c.reasons.join("; ")),
  )));
  // The node's status is its worst component's, as `tessera health node show` rolls it up.
  const rank = { HEALTHY: 0, DEGRADED: 1, FAILED: 2 };
  const worst = health.components.reduce((w, c) => (rank[c.status] > rank[w] ? c.status : w), "HEALTHY");
  const status = document.getElementById("node-status");
  status.textContent = health.components.length ? worst : "";
  status.className = "status " + worst;
  status.setAttribute("data-status", worst);
  fill("events", events.events.slice(-50).reverse().map((e) => el("tr", {},
    el("td", {}, time(e.unix)), el("td", { class: e.severity === "error" ? "FAILED" : e.severity === "warning" ? "DEGRADED" : "" }, e.severity),
    el("td", {}, e.component), el("td", {}, e.entity), el("td", {}, e.event), el("td", {}, e.message),
  )));
  document.getElementById("updated").textContent = new Date().toLocaleTimeString();
  refreshes += 1;
  document.body.setAttribute("data-refreshes", refreshes);
}

async function start() {
  try {
    const c = await api("cluster");
    document.getElementById("cluster").textContent = c.identity.name;
    const me = c.nodes.find((n) => n.number === c.me);
    document.getElementById("node").textContent = me ? me.name : c.me;
  } catch (e) {
    // A node without a configuration yet still shows its file systems and health.
  }
  const loop = async () => {
    const error = document.getElementById("error");
    try {
      await refresh();
      error.hidden = true;
    } catch (e) {
      error.textContent = "cannot reach the daemon's API: " + e.message;
      error.hidden = false;
    }
    setTimeout(loop, REFRESH_MS);
  };
  loop();
}

start();
