// rateloop dashboard: poll /api/state and draw it.  Plain DOM, no build step; text only
// goes through textContent, so a scope name can never inject markup.
"use strict";

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function clock(iso) {
  return iso ? new Date(iso).toLocaleTimeString([], { hour12: false }) : "?";
}

function fmt(n) {
  return Number.isInteger(n) || Math.abs(n) >= 100 ? String(Math.round(n)) : n.toFixed(1);
}

// A moment in the browser's time, with its date when it is not today's.
function when(iso, nowIso) {
  const at = new Date(iso), now = new Date(nowIso);
  if (at.toDateString() === now.toDateString()) return clock(iso);
  const pad = (n) => String(n).padStart(2, "0");
  return `${at.getFullYear()}-${pad(at.getMonth() + 1)}-${pad(at.getDate())} ${clock(iso)}`;
}

// The scope's verdict, as the server words it (rateloop.observe.present, as in `rateloop
// status`): admitting, paused or refusing (a quota spent, here or in a broader scope).
function badgeText(v, nowIso) {
  if (v.state === "admitting") return "admitting";
  const until = v.until ? ` until ${when(v.until, nowIso)}, ${v.left} left` : "";
  return `${v.state}${until}${v.why ? ` (${v.why})` : ""}`;
}

function gauge(d, governedBy, nowIso) {
  const pct = Math.round(d.headroom_fraction * 100);
  const fill = el("div", { class: "fill" + (pct <= 0 ? " empty" : pct < 20 ? " low" : "") });
  fill.style.width = pct + "%";
  let note = `headroom ${fmt(d.headroom)} of ${fmt(d.capacity)} (${pct}%)`;
  if (d.blocked_until) note += `, blocked until ${when(d.blocked_until, nowIso)}`;
  else if (d.resets_at) note += `, resets ${when(d.resets_at, nowIso)}`;
  const source = governedBy === "learned" || governedBy === "recorded" ? ` (${governedBy})` : "";
  return el(
    "div",
    { class: "gauge", "data-dimension": d.dimension, "data-headroom": String(d.headroom) },
    el("span", {}, `${d.dimension} · ${d.configured}${d.kind === "day" ? "/day" : d.kind === "bucket" ? "/min" : " slots"}${source}`),
    el("div", { class: "bar", role: "meter", "aria-valuenow": String(pct), "aria-valuemin": "0", "aria-valuemax": "100" }, fill),
    el("span", {}, note),
  );
}

// The calls sleeping on the scope now, by priority (read from the shared event stream).
function waitersLine(waiters) {
  const entries = Object.entries(waiters);
  const total = entries.reduce((sum, [, n]) => sum + n, 0);
  const line = el("p", { class: "waiters", "data-waiting": String(total) }, "waiting: ");
  if (!total) line.append("none");
  entries.forEach(([priority, n], i) => {
    if (i) line.append(" · ");
    line.append(el("span", { class: "waiter", "data-priority": priority }, `${priority} ${n}`));
  });
  return line;
}

function drawScopes(snapshot, views) {
  const box = $("scopes");
  box.replaceChildren();
  const now = new Date(snapshot.at);
  if (!snapshot.scopes.length) {
    box.append(el("p", { class: "empty" }, "no scopes: nothing configured and no state under this prefix"));
    return;
  }
  for (const s of snapshot.scopes) {
    const view = views[s.scope] || { verdict: { state: "admitting" }, within: null };
    const card = el(
      "section",
      { class: "scope", "data-scope": s.scope, "data-paused": String(s.paused),
        "data-state": view.verdict.state },
      el("h3", {}, s.scope,
        el("span", { class: "badge " + view.verdict.state }, badgeText(view.verdict, snapshot.at)),
        el("span", { class: "meta" }, `AIMD ${s.factor.toFixed(2)} · leases ${s.leases}`)),
    );
    card.append(waitersLine(s.waiters || {}));
    if (!s.dimensions.length) {
      let note = "no limits known (start with --config)";
      if (view.within) note = `within the limits of ${view.within}`;
      else if (Object.keys(s.counts || {}).length) {
        note = Object.entries(s.counts).map(([d, n]) => `${d} ${fmt(n)} today (limit unknown)`).join(", ");
      } else if (s.configured) note = "no limited dimension";
      card.append(el("p", { class: "empty" }, note));
    }
    for (const d of s.dimensions) card.append(gauge(d, s.governed_by, snapshot.at));
    box.append(card);
  }
}

function drawTimeline(entries) {
  const list = $("timeline");
  list.replaceChildren();
  if (!entries.length) list.append(el("li", { class: "empty" }, "nothing yet"));
  for (const e of entries) {
    list.append(el("li", { "data-kind": e.kind, "data-scope": e.scope },
      el("time", { datetime: e.at }, clock(e.at)), `${e.scope}: ${e.text}`));
  }
}

function drawQueue(queue) {
  const panel = $("tasks-panel");
  panel.hidden = !queue;
  if (!queue) return;
  const states = Object.entries(queue.by_state).filter(([, n]) => n).map(([s, n]) => `${s} ${n}`);
  const oldest = queue.oldest_age || "-";
  $("queue-summary").textContent =
    `depth ${queue.depth} · oldest ${oldest} · ${states.join(", ") || "empty"}`;
  const body = $("tasks").querySelector("tbody");
  body.replaceChildren();
  if (!queue.waiting.length) {
    body.append(el("tr", {}, el("td", { colspan: "6", class: "empty" }, "no parked tasks")));
  }
  for (const t of queue.waiting) {
    body.append(el("tr", { "data-task-id": t.task_id, "data-state": t.state },
      el("td", {}, `${t.task} ${t.task_id}`), el("td", {}, t.state), el("td", {}, t.priority),
      el("td", { class: "retry-at" }, t.retry_at ? `${when(t.retry_at, queue.at)} (in ${t.wakes_in})` : "-"),
      el("td", { class: "remaining" }, t.remaining_steps.join(", ") || "-"),
      el("td", { class: "reason" }, t.reason || "-")));
  }
}

async function refresh() {
  let wait = 1000;
  try {
    const resp = await fetch("/api/state", { cache: "no-store" });
    const state = await resp.json();
    wait = Math.max(250, Math.min(2000, state.interval * 1000));
    $("interval").textContent = String(state.interval);
    const err = $("error");
    err.hidden = !state.error;
    err.textContent = state.error || "";
    if (state.snapshot) {
      $("source").textContent = `prefix ${state.snapshot.prefix}`;
      $("updated").textContent = `read at ${clock(state.snapshot.at)}`;
      drawScopes(state.snapshot, state.views || {});
    }
    drawQueue(state.queue);
    drawTimeline(state.timeline);
    if (state.snapshot && typeof uPlot !== "undefined") {
      $("history-window").textContent = `(last ${state.history_minutes} min)`;
      drawCharts(state.history, state.history_minutes, Date.parse(state.snapshot.at) / 1000);
    }
    document.body.dataset.updated = state.served_at;
  } catch (e) {
    $("error").hidden = false;
    $("error").textContent = `cannot reach the dashboard server: ${e}`;
  }
  setTimeout(refresh, wait);
}

refresh();
