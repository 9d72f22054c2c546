// rateloop dashboard charts: each scope's history (/api/state "history"), drawn with the
// vendored uPlot (static/uPlot.iife.min.js, MIT; see uPlot.VERSION).  One block per scope,
// made once and updated with setData on every poll.  Text only goes through textContent.
"use strict";

const CHART_COLORS = ["#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457"];
const charts = new Map(); // scope -> {block, usage, counts, dims, pauses}

// Shade each pause band [start, end] (epoch seconds) behind the series.
function pauseBands(block) {
  return {
    hooks: {
      drawClear: [
        (u) => {
          const { ctx } = u;
          const { left, top, width, height } = u.bbox;
          ctx.save();
          ctx.fillStyle = "rgba(198, 40, 40, 0.15)";
          for (const [start, end] of block.pauses) {
            const x0 = Math.max(left, u.valToPos(start, "x", true));
            const x1 = Math.min(left + width, u.valToPos(end, "x", true));
            if (x1 > x0) ctx.fillRect(x0, top, Math.max(2, x1 - x0), height);
          }
          ctx.restore();
        },
      ],
    },
  };
}

function opts(title, series, block, width) {
  return {
    title, width, height: 150,
    // Each point is a minute's start: the axis runs to the end of the last minute.
    scales: { x: { time: true, range: (u, min, max) => [min, max + 60] } },
    series: [{}, ...series.map((label, i) => ({
      label, stroke: CHART_COLORS[i % CHART_COLORS.length], width: 1.5, spanGaps: false,
    }))],
    plugins: [pauseBands(block)],
  };
}

// The dense minute axis of the window, and each minute's record by its start.
function axis(history, minutes, now) {
  const last = Math.floor(now / 60);
  const xs = [];
  for (let m = last - minutes + 1; m <= last; m++) xs.push(m * 60);
  const byMinute = new Map(history.minutes.map((m) => [Math.floor(Date.parse(m.at) / 1000), m]));
  return { xs, rows: xs.map((x) => byMinute.get(x)) };
}

function usageSeries(dims, rows) {
  // Percent of the limit: a bucket's units per minute, a day quota's count, leases held.
  return dims.map((d) => rows.map((m) => {
    const u = m && m.usage[d];
    if (!u || !u.limit) return null;
    const value = d === "requests_per_day" || d === "concurrency" ? (u.count ?? u.used) : u.used;
    return (100 * value) / u.limit;
  }));
}

function countSeries(rows) {
  const of = (key) => rows.map((m) => (m ? m[key] : 0));
  return [of("admissions"), of("refusals"), of("waits"), of("fallbacks")];
}

function chartBlock(scope, dims, width) {
  const block = el("div", { class: "history", "data-scope": scope });
  block.append(el("h4", {}, scope));
  const state = { block, dims, pauses: [] };
  const usageBox = el("div", { class: "chart usage" });
  const countBox = el("div", { class: "chart counts" });
  block.append(usageBox, countBox);
  state.usage = new uPlot(opts("usage, % of the limit per minute", dims, state, width), [[]], usageBox);
  state.counts = new uPlot(
    opts("per minute", ["admissions", "refusals", "local waits", "fallbacks"], state, width),
    [[]], countBox);
  return state;
}

function drawCharts(history, minutes, now) {
  const box = $("charts");
  const scopes = Object.keys(history || {}).sort();
  if (!scopes.length) {
    if (!box.querySelector(".empty")) box.replaceChildren(el("p", { class: "empty" }, "no history yet"));
    return;
  }
  box.querySelector(".empty")?.remove();
  const width = Math.max(300, Math.min(700, box.clientWidth || 600));
  for (const scope of scopes) {
    const h = history[scope];
    const dims = [...new Set(h.minutes.flatMap((m) => Object.keys(m.usage)))].sort();
    let state = charts.get(scope);
    if (state && state.dims.join() !== dims.join()) {  // a new dimension: new series
      state.usage.destroy(); state.counts.destroy(); state.block.remove();
      state = undefined;
    }
    if (!state) {
      state = chartBlock(scope, dims, width);
      charts.set(scope, state);
      box.append(state.block);
    }
    const { xs, rows } = axis(h, minutes, now);
    state.pauses = h.pauses.map(([a, b]) => [Date.parse(a) / 1000, Date.parse(b) / 1000]);
    state.usage.setData([xs, ...usageSeries(dims, rows)]);
    state.counts.setData([xs, ...countSeries(rows)]);
    const total = (key) => h.minutes.reduce((n, m) => n + m[key], 0);
    Object.assign(state.block.dataset, {
      series: String(dims.length + 4),
      minutes: String(h.minutes.length),
      admissions: String(total("admissions")),
      refusals: String(total("refusals")),
      pauses: String(state.pauses.length),
    });
  }
  for (const [scope, state] of charts) {
    if (!(scope in history)) { state.usage.destroy(); state.counts.destroy(); state.block.remove(); charts.delete(scope); }
  }
}
