// The Nave hub dashboard: polls this replica's admin API every 2 s and
// renders it. Data goes into the page only as text (never as HTML).
"use strict";

const POLL_MS = 2000;
const FETCH_TIMEOUT_MS = 10000; // a busy hub may take longer than a poll interval to answer
const TOKEN_KEY = "nave-admin-token";

// The admin token, when the API needs one: given once as #token=... (taken
// out of the address bar at once) or typed into the form; kept for the tab.
let token = sessionStorage.getItem(TOKEN_KEY) || "";
{
  const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (m) {
    history.replaceState(null, "", location.pathname + location.search);
    try {
      token = decodeURIComponent(m[1]);
      sessionStorage.setItem(TOKEN_KEY, token);
    } catch {
      token = ""; // not a valid encoding: the page asks for it
    }
  }
}

const $ = (id) => document.getElementById(id);

// el builds an element: attrs are attributes ("class", "data-*", ...), children strings or nodes.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) e.append(c instanceof Node ? c : String(c ?? ""));
  return e;
}
const row = (attrs, ...cells) => el("tr", attrs, ...cells.map((c) => (c instanceof Node && c.tagName === "TD" ? c : el("td", {}, c))));
const cell = (field, cls, text) => el("td", { "data-field": field, class: cls }, text);

function ago(ms) {
  if (ms < 0) ms = 0;
  const s = ms / 1000;
  if (s < 60) return Math.floor(s) + "s"; // the server's clock (Date) has whole seconds
  if (s < 3600) return Math.floor(s / 60) + "m" + Math.floor(s % 60) + "s";
  return Math.floor(s / 3600) + "h" + Math.floor((s % 3600) / 60) + "m";
}
const since = (now, t) => (t ? ago(now - Date.parse(t)) : "-");
const key = (k) => (k && k.name ? k.namespace + "/" + k.name : "-"); // a ServiceKey as "ns/name"
const loc = (l) => (l && l.region ? [l.region, l.zone, l.subzone || l.subZone].filter(Boolean).join("/") : "-");

class HTTPError extends Error {
  constructor(status, text) { super(status + " " + text); this.status = status; }
}

// get fetches one admin API path as JSON, with the server's clock (Date header).
async function get(path) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const resp = await fetch(path, { headers, cache: "no-store", signal: AbortSignal.timeout(FETCH_TIMEOUT_MS) });
  if (!resp.ok) throw new HTTPError(resp.status, (await resp.text()).trim());
  const now = Date.parse(resp.headers.get("Date")) || Date.now();
  return { body: await resp.json(), now };
}

function renderReplicas(hub, now) {
  $("self").textContent = "replica " + hub.id;
  $("leader").textContent = hub.leader || "none";
  $("leader").className = hub.leader ? "ok" : "bad";
  $("degraded").textContent = hub.degraded ? "degraded: " + hub.degraded : "ok";
  $("degraded").className = hub.degraded ? "bad" : "ok";
  const snap = hub.snapshot || {};
  $("snapshot").textContent = !snap.at ? "none" :
    `${snap.restored ? "restored" : "saved"} ${since(now, snap.at)} ago, ${snap.clusters} clusters`;
  $("replica-rows").replaceChildren(...(hub.members || []).map((m) => {
    const roles = [m.self ? "this replica" : "", m.name === hub.leader ? "leader" : ""].filter(Boolean).join(", ");
    return row({ "data-testid": "replica-row", "data-replica": m.name, "data-self": m.self || false, "data-leader": m.name === hub.leader },
      cell("name", m.self ? "ok" : "", m.name), cell("role", "", roles || "-"), cell("homeOf", "", m.homeOf),
      cell("unconverged", m.unconverged ? "warn" : "", m.unconverged), m.federation, m.xds, m.admin);
  }));
}

// clusterState is the one word that says how a cluster's data stands.
function clusterState(c) {
  if (c.dropped) return ["dropped", "bad"];
  if (c.stale) return ["stale", "bad"];
  if (c.restored) return ["restored", "warn"];
  if (c.home) return ["connected", "ok"];
  return ["no spoke", "warn"];
}

function renderClusters(clusters, now) {
  $("cluster-rows").replaceChildren(...clusters.map((c) => {
    const [state, cls] = clusterState(c);
    const age = c.home || !c.liveAt ? "live" : ago(now - Date.parse(c.liveAt));
    return row({ "data-testid": "cluster-row", "data-cluster": c.cluster, "data-state": state, "data-home": c.home || "" },
      cell("cluster", "", c.cluster), cell("state", cls, state), cell("home", "", c.home || "-"), cell("origin", "", c.origin || "-"),
      cell("age", c.home ? "" : "warn", age), cell("epoch", "", c.epoch + "." + c.version), c.network || "-",
      cell("services", "", c.services), cell("endpoints", "", c.endpoints));
  }));
}

function renderConflicts(services) {
  const rows = [];
  for (const s of services) {
    for (const c of s.conflicts || []) {
      rows.push(row({ "data-testid": "conflict-row", "data-service": key(s.service) }, key(s.service), c.property, c.winner, c.loser, c.reason));
    }
  }
  $("conflict-rows").replaceChildren(...rows);
}

// Services with routes or a TrafficPolicy (/debug/routes): how many routes,
// the policy and the cluster it came from, and how many of a cluster's
// routes or policies lost to another's (each in the cell's title).
function renderRoutes(services) {
  $("route-rows").replaceChildren(...services.map((s) => {
    const conflicts = s.conflicts || [];
    const td = cell("conflicts", conflicts.length ? "bad" : "", conflicts.length);
    td.title = conflicts.map((c) => `${c.reason} (kept ${c.winner}'s, ignored ${c.loser}'s)`).join("\n");
    return row({ "data-testid": "route-row", "data-service": key(s.service), "data-routes": s.routeCount,
      "data-policy": s.policy ? s.policy.name : "", "data-conflicts": conflicts.length },
      cell("service", "", key(s.service)), cell("routes", "", s.routeCount),
      cell("policy", "", s.policy ? `${s.policy.name} (${s.policyCluster})` : "-"), td);
  }));
}

// The topology is the hub's count of every cluster's endpoints by locality
// and health (/debug/topology).
function renderTopology(localities) {
  // region -> zone -> [counts]
  const tree = new Map();
  for (const l of localities || []) {
    const region = l.region || "(no region)", zone = l.zone || "(no zone)";
    if (!tree.has(region)) tree.set(region, new Map());
    const zones = tree.get(region);
    if (!zones.has(zone)) zones.set(zone, []);
    zones.get(zone).push(l);
  }
  const sorted = (m) => [...m.entries()].sort(([a], [b]) => a.localeCompare(b));
  const ul = el("ul");
  for (const [region, zones] of sorted(tree)) {
    const zl = el("ul");
    for (const [zone, counts] of sorted(zones)) {
      const chips = counts.map((n) => el("span", {
        class: "chip " + (n.healthy ? "ok" : "bad"), "data-testid": "topology-cluster", "data-cluster": n.cluster,
        "data-healthy": n.healthy, "data-draining": n.draining, "data-not-ready": n.notReady,
      }, `${n.cluster} ${n.healthy} healthy` + (n.draining ? ` / ${n.draining} draining` : "") + (n.notReady ? ` / ${n.notReady} not ready` : "")));
      zl.append(el("li", { "data-testid": "topology-zone", "data-zone": zone }, el("b", {}, zone), " ", ...chips));
    }
    ul.append(el("li", { "data-testid": "topology-region", "data-region": region }, el("b", {}, region), zl));
  }
  $("topology-tree").replaceChildren(tree.size ? ul : el("p", {}, "no endpoints"));
}

const STATE_CLASS = { SYNCED: "ok", STALE: "warn", NACKED: "bad" };

function typeState(t) {
  if (!t) return "-";
  if (t.rejecting) return "NACKED";
  return t.pending ? "STALE" : "SYNCED";
}

function renderClients(info, now) {
  const clients = info.clients || [];
  const counts = { SYNCED: 0, STALE: 0, NACKED: 0 };
  for (const c of clients) counts[c.state] = (counts[c.state] || 0) + 1;
  const cc = $("client-counts");
  cc.textContent = `${clients.length} client${clients.length === 1 ? "" : "s"}: ${counts.SYNCED} synced, ${counts.STALE} stale, ${counts.NACKED} nacked`;
  cc.dataset.total = clients.length;
  cc.dataset.synced = counts.SYNCED;
  cc.dataset.stale = counts.STALE;
  cc.dataset.nacked = counts.NACKED;
  $("client-rows").replaceChildren(...clients.map((c) => {
    // What a NACKed client said of each type it rejects.
    const reasons = ["lds", "rds", "cds", "eds"].flatMap((k) => {
      const t = c.types && c.types[k];
      return t && t.rejecting && t.lastNACK ? [`${k}: ${t.lastNACK.detail || "no detail"}`] : [];
    });
    const reason = c.state === "NACKED" ? reasons.join("; ") : "";
    const state = c.state + (c.state === "STALE" && c.staleSince ? ` (${since(now, c.staleSince)})` : "") +
      (reason ? ` (${reason.length > 120 ? reason.slice(0, 119) + "…" : reason})` : "");
    const types = ["lds", "rds", "cds", "eds"].map((k) => {
      const t = (c.types && c.types[k]) || {}, s = typeState(c.types && c.types[k]);
      const td = cell(k, STATE_CLASS[s] || "muted", s);
      td.dataset.acked = t.acked || "";
      td.title = `sent ${t.sent || "-"}, acknowledged ${t.acked || "-"}` + (t.rejecting && t.lastNACK ? `; rejected ${t.lastNACK.version}: ${t.lastNACK.detail}` : "");
      return td;
    });
    const stateCell = cell("state", STATE_CLASS[c.state] || "", state);
    if (reason) {
      stateCell.title = reason;
      stateCell.dataset.reason = reason;
    }
    return row({ "data-testid": "client-row", "data-node": c.nodeID, "data-state": c.state },
      cell("node", "", c.nodeID), `${c.stream.delta ? "delta" : "sotw"}-${c.stream.id}`, loc(c.locality),
      since(now, c.connectedSince) + " ago", stateCell, ...types);
  }));
}

function renderTraces(info, now) {
  $("trace-rows").replaceChildren(...(info.traces || []).map((t) => {
    const slow = (t.slowest || [])[0];
    const slowest = slow ? `${slow.nodeID} ${slow.hubToAckMs.toFixed(1)}` + (slow.endToEndMs ? `; ${slow.endToEndMs.toFixed(1)}` : "") : "-";
    return row({ "data-testid": "trace-row", "data-service": key(t.service), "data-cluster": t.cluster, "data-acked": t.acked },
      t.id, cell("service", "", key(t.service)), cell("cluster", "", t.cluster || "-"), since(now, t.received) + " ago",
      t.noChange ? "no change" : t.type || "-", t.pushed, cell("acked", "", t.acked), cell("nacked", t.nacked ? "bad" : "", t.nacked),
      cell("slowest", "", slowest));
  }));
}

let lastOK = 0;

function showStatus(state, text) {
  const s = $("status");
  s.dataset.state = state;
  s.textContent = text;
  $("token-form").hidden = state !== "unauthorized";
}

async function poll() {
  try {
    const [hub, clusters, services, topology, clients, traces, routes] = await Promise.all(
      ["/debug/hub", "/debug/clusters", "/debug/services", "/debug/topology", "/debug/clients", "/debug/trace?limit=10", "/debug/routes"].map(get));
    const now = hub.now;
    renderReplicas(hub.body, now);
    renderClusters(clusters.body, now);
    renderConflicts(services.body);
    renderRoutes(routes.body);
    renderTopology(topology.body.localities);
    renderClients(clients.body, now);
    renderTraces(traces.body, now);
    lastOK = Date.now();
    const at = new Date(lastOK).toLocaleTimeString();
    $("status").dataset.lastOk = lastOK;
    showStatus("live", "live · updated " + at);
    $("status").title = "";
  } catch (err) {
    if (err.status === 401) {
      showStatus("unauthorized", "the admin API needs its token");
    } else {
      const last = lastOK ? "last update " + new Date(lastOK).toLocaleTimeString() + " (" + ago(Date.now() - lastOK) + " ago)" : "never reached";
      showStatus("unreachable", "hub unreachable · " + last);
      $("status").title = String(err.message || err);
    }
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

$("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = $("token-input").value.trim();
  sessionStorage.setItem(TOKEN_KEY, token);
  $("token-input").value = "";
  showStatus("connecting", "connecting…");
});

poll();
