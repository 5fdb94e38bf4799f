// The nvcf-mono console: one page over the platform's public API, with the signed-in credential's
// scopes and account. No build step, no third-party code. The credential lives in sessionStorage
// (this tab only) and goes out only as an Authorization header, never in a URL. Text from the API is
// always set as text (textContent), never parsed as HTML.
"use strict";

const TOKEN = "nvcf.console.token";
const ACCOUNT = "nvcf.console.account";
const REFRESH_MS = 2000;
// Pages that sum up many things (the dashboard, the function list, the traffic charts, which the
// nodes report every few seconds in minute buckets).
const SLOW_REFRESH_MS = 5000;
// How long one try-it call waits for its answer before the page shows it is still under way and asks again.
const TRY_POLL_SECONDS = 5;
const FUNCTION_STATUSES = ["ACTIVE", "DEPLOYING", "DEGRADING", "DEGRADED", "ERROR", "INACTIVE"];
let timers = [];
let me = { admin: false, accounts: [] };
// Each navigation starts a new page; work a page started after it was left must not draw on the next one.
let generation = 0;
function alive() { const mine = generation; return () => mine === generation; }

// ---- small DOM helpers -------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else if (key === "style") Object.assign(el.style, value); // CSSOM: allowed by the page's CSP, unlike style=""
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const main = () => document.getElementById("main");
function show(...nodes) { main().replaceChildren(...nodes); }
function badge(text) { return h("span", { class: `badge ${text || ""}` }, text || "-"); }
function when(iso) { return iso ? new Date(iso).toLocaleString() : "-"; }
function kv(pairs) {
  return h("dl", { class: "kv" }, pairs.filter(([, v]) => v !== undefined && v !== null && v !== "")
    .map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}
function table(head, rows, attrs) {
  return h("table", attrs || {}, h("thead", {}, h("tr", {}, head.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows.length ? rows : [h("tr", {}, h("td", { colspan: head.length, class: "muted" }, "none"))]));
}
function toast(message, ok) {
  const el = document.getElementById("toast");
  el.textContent = message;
  el.className = ok ? "ok" : "";
  el.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { el.hidden = true; }, ok ? 3000 : 8000);
}
// Every ``ms`` while the page is shown; a round still under way (a slow API) is not started twice.
function every(ms, fn) {
  let busy = false;
  timers.push(setInterval(async () => {
    if (busy) return;
    busy = true;
    try { await fn(); } finally { busy = false; }
  }, ms));
}

// ---- the API -------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

// An admin acting on another account uses the API's cross-account twins (/v2/nvcf/accounts/{ncaId}/...).
function scoped(path) {
  const account = sessionStorage.getItem(ACCOUNT);
  if (!account || !me.admin) return path;
  const id = encodeURIComponent(account);
  if (path.startsWith("/v2/nvcf/") && !path.startsWith("/v2/nvcf/accounts") && !path.startsWith("/v2/nvcf/pexec")) {
    return `/v2/nvcf/accounts/${id}/${path.slice("/v2/nvcf/".length)}`;
  }
  if (path.startsWith("/v1/nvct/")) return `/v1/nvct/accounts/${id}/${path.slice("/v1/nvct/".length)}`;
  return path;
}

async function call(method, path, body, options) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(TOKEN) || ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  Object.assign(headers, (options && options.headers) || {});
  const response = await fetch(options && options.raw ? path : scoped(path), {
    method, headers, body: body === undefined ? undefined : (typeof body === "string" ? body : JSON.stringify(body)),
    cache: "no-store",
  });
  if (options && options.raw) return response;
  const text = await response.text();
  let doc = null;
  try { doc = text ? JSON.parse(text) : null; } catch (e) { doc = null; }
  if (!response.ok) {
    const detail = doc && (doc.detail || doc.title) ? (doc.detail || doc.title) : `${response.status} ${response.statusText}`;
    if (response.status === 401 && !(options && options.signingIn)) signOut(`Signed out: ${detail}`);
    throw new ApiError(response.status, detail);
  }
  return doc;
}
const get = (path) => call("GET", path);

// A panel whose data may be refused (a scope the credential lacks): it says so instead of failing the page.
async function guarded(title, load) {
  const card = h("section", { class: "card" }, h("h2", {}, title), h("p", { class: "muted" }, "Loading…"));
  try {
    const content = await load();
    card.replaceChildren(h("h2", {}, title), content);
  } catch (err) {
    card.replaceChildren(h("h2", {}, title), h("p", { class: "muted" }, err.status === 403 ? `Not allowed with this credential: ${err.message}` : err.message));
  }
  return card;
}

// ---- charts (inline SVG) ------------------------------------------------------------------------

const COLORS = ["#76b900", "#1e88e5", "#e53935", "#8e24aa"];

function chart(series, unit) {
  const W = 600, H = 150, L = 44, B = 18, R = 4;  // R: room for a dot at the last minute
  const points = series.flatMap((s) => s.values.filter((v) => v !== null && v !== undefined));
  const max = Math.max(1e-9, ...points) * 1.1;
  const n = Math.max(1, ...series.map((s) => s.values.length)) - 1 || 1;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const add = (tag, attrs, text) => {
    const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    if (text !== undefined) el.textContent = text;
    svg.append(el);
  };
  for (const f of [0, 0.5, 1]) {
    const y = H - B - f * (H - B - 8);
    add("line", { x1: L, x2: W, y1: y, y2: y, class: "axis" });
    add("text", { x: 2, y: y + 3 }, `${fmt(f * max / 1.1)}${unit || ""}`);
  }
  add("text", { x: L, y: H - 4 }, "-60 min");
  add("text", { x: W - 30, y: H - 4 }, "now");
  series.forEach((s, i) => {
    // A minute without a value (no calls, so no latency) breaks the line rather than bridging it,
    // and a value alone between two gaps is drawn as a dot (a one-point line draws nothing).
    const stroke = COLORS[i % COLORS.length];
    const segments = [[]];
    s.values.forEach((v, j) => {
      if (v === null || v === undefined) {
        if (segments[segments.length - 1].length) segments.push([]);
      } else {
        segments[segments.length - 1].push(`${L + (j / n) * (W - L - R)},${H - B - (v / max) * (H - B - 8)}`);
      }
    });
    for (const seg of segments) {
      if (seg.length > 1) add("polyline", { points: seg.join(" "), fill: "none", stroke, "stroke-width": 2 });
      else if (seg.length === 1) add("polyline", { points: `${seg[0]} ${seg[0]}`, fill: "none", stroke, "stroke-width": 5, "stroke-linecap": "round", class: "dot" });
    }
  });
  const legend = h("div", { class: "legend" }, series.map((s, i) =>
    h("span", {}, h("i", { style: { background: COLORS[i % COLORS.length] } }), s.name)));
  return h("div", {}, svg, legend);
}
function fmt(v) { return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2); }

function trafficCharts(stats) {
  const points = stats.total;
  const per = stats.stepSeconds || 60;
  return h("div", { class: "grid" },
    h("div", {}, h("h2", {}, "Invocations per second"), chart([
      { name: "invocations/s", values: points.map((p) => p.invocations / per) },
      { name: "errors/s", values: points.map((p) => p.errors / per) }])),
    h("div", {}, h("h2", {}, "Latency"), chart([
      { name: "p50", values: points.map((p) => p.p50Ms ?? null) },
      { name: "p95", values: points.map((p) => p.p95Ms ?? null) }], " ms")));
}

// ---- pages --------------------------------------------------------------------------------------

function signInPage(message) {
  const input = h("input", { id: "token", type: "password", autocomplete: "off", placeholder: "nvapi-… or the admin token" });
  const error = h("p", { id: "signin-error", class: "error" }, message || "");
  const form = h("form", {
    class: "card signin", id: "signin",
    onsubmit: async (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN, input.value.trim());
      sessionStorage.removeItem(ACCOUNT);
      try {
        await call("GET", "/v2/nvcf/functions", undefined, { signingIn: true });
      } catch (err) {
        // 403 is a valid credential without this scope (a tasks key): its pages say what it may not see.
        if (err.status !== 403) {
          sessionStorage.removeItem(TOKEN);
          chrome();
          error.textContent = `The credential was refused: ${err.message}`;
          return;
        }
      }
      await whoAmI();
      location.hash = "#/";
      route();
    },
  }, h("h1", {}, "Sign in"),
  h("p", { class: "muted" }, "An API key or token. It stays in this browser tab and is sent only to this platform's API."),
  input, h("button", { type: "submit", id: "signin-submit" }, "Sign in"), error);
  show(form);
  input.focus();
}

async function whoAmI() {
  me = { admin: false, accounts: [] };
  try {
    const doc = await call("GET", "/v2/nvcf/accounts", undefined, { signingIn: true });
    me = { admin: true, accounts: doc.cloudAccounts.map((a) => a.ncaId) };
  } catch (err) { /* not an admin: its own account only */ }
  chrome();
}

function chrome() {
  const signedIn = Boolean(sessionStorage.getItem(TOKEN));
  document.getElementById("nav").hidden = !signedIn;
  document.getElementById("signout").hidden = !signedIn;
  document.getElementById("who").textContent = signedIn ? (me.admin ? "admin" : "") : "";
  const switcher = document.getElementById("account-switch");
  switcher.hidden = !(signedIn && me.admin);
  const select = document.getElementById("account");
  const current = sessionStorage.getItem(ACCOUNT) || "";
  select.replaceChildren(h("option", { value: "" }, "own account"),
    ...me.accounts.map((id) => h("option", { value: id, selected: id === current }, id)));
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN);
  sessionStorage.removeItem(ACCOUNT);
  me = { admin: false, accounts: [] };
  chrome();
  location.hash = "#/signin";
  signInPage(message);
}

async function dashboard() {
  const live = alive();
  // A credential without list_functions (a tasks key) still gets the page, saying what it may not see.
  let functions = [];
  let refused = null;
  try { functions = (await get("/v2/nvcf/functions")).functions; } catch (err) {
    if (err.status !== 403) throw err;
    refused = `Not allowed with this credential: ${err.message}`;
  }
  if (!live()) return;
  const byStatus = {};
  for (const f of functions) byStatus[f.status] = (byStatus[f.status] || 0) + 1;
  const instances = functions.reduce((n, f) => n + (f.activeInstances || []).length, 0);
  const head = h("div", { class: "grid" },
    h("div", { class: "card" }, h("h2", {}, "Functions"), h("div", { class: "stat", id: "function-count" }, refused ? "-" : functions.length),
      refused ? h("p", { class: "muted" }, refused) : h("div", {}, Object.entries(byStatus).map(([s, n]) => h("span", {}, badge(s), ` ${n} `)))),
    h("div", { class: "card" }, h("h2", {}, "Instances running"), h("div", { class: "stat" }, refused ? "-" : instances)),
    h("div", { class: "card", id: "queue-now" }, h("h2", {}, "Queued now"), h("div", { class: "stat" }, "…"), h("p", { class: "muted" })));
  show(h("h1", {}, "Dashboard"), head, h("div", { id: "traffic" }), h("div", { id: "clusters" }));
  // A queue is asked for per function: those deployed (an undeployed one has none), 25 at most.
  const deployed = [...new Set(functions.filter((f) => f.status !== "INACTIVE").map((f) => f.id))];
  const ids = deployed.slice(0, 25);
  // The traffic, the queues and the GPUs are read again while the page is open (the functions
  // and their counts when it is opened again).
  const refresh = async () => {
    const traffic = await guarded("Traffic, the last hour", async () => trafficCharts(await get("/v2/nvcf/stats")));
    if (!live()) return;
    document.getElementById("traffic").replaceChildren(traffic);
    let queued = 0;
    for (const id of ids) {
      try { queued += (await get(`/v2/nvcf/queues/functions/${id}`)).queues.reduce((n, q) => n + q.queueDepth, 0); } catch (e) { /* not visible */ }
    }
    if (!live()) return;
    document.querySelector("#queue-now .stat").textContent = refused ? "-" : String(queued);
    document.querySelector("#queue-now .muted").textContent = deployed.length > ids.length
      ? `in the first ${ids.length} of ${deployed.length} deployed functions` : "";
    const gpus = await guarded("Clusters and GPUs", gpuTable);
    if (live()) document.getElementById("clusters").replaceChildren(gpus);
  };
  await refresh();
  if (live()) every(SLOW_REFRESH_MS, refresh);
}

async function gpuTable() {
  const groups = (await get("/v2/nvcf/clusterGroups")).clusterGroups;
  const rows = [];
  for (const group of groups) {
    for (const cluster of group.clusters) {
      let status = null;
      try { status = await get(`/v1/accounts/${encodeURIComponent(group.ncaId)}/clusters/${cluster.id}/status`); } catch (e) { status = null; }
      const gpus = status ? status.gpus : group.gpus.map((g) => ({ name: g.name }));
      for (const gpu of gpus) {
        const used = gpu.allocated ?? null, capacity = gpu.capacity ?? null;
        rows.push(h("tr", {}, h("td", {}, cluster.name), h("td", {}, status ? badge(status.status) : "-"), h("td", {}, gpu.name),
          h("td", {}, used === null ? "-" : `${used} used`), h("td", {}, capacity === null ? "-" : `${gpu.available} free of ${capacity}`),
          h("td", {}, capacity ? h("div", { class: "bar" }, h("span", { style: { width: `${Math.round(100 * used / capacity)}%` } })) : "")));
      }
    }
  }
  return table(["Cluster", "Status", "GPU", "Used", "Free", ""], rows);
}

async function functionsPage() {
  const live = alive();
  let functions = (await get("/v2/nvcf/functions")).functions;
  if (!live()) return;
  const search = h("input", { id: "search", placeholder: "Search name or id" });
  const status = h("select", { id: "status-filter" }, h("option", { value: "" }, "any status"),
    ...FUNCTION_STATUSES.map((s) => h("option", { value: s }, s)));
  const body = h("tbody");
  const render = () => {
    const q = search.value.trim().toLowerCase();
    const rows = functions.filter((f) => (!q || f.name.toLowerCase().includes(q) || f.id.includes(q) || f.versionId.includes(q))
      && (!status.value || f.status === status.value)).map((f) => h("tr", { "data-function": f.name },
      h("td", {}, h("a", { href: `#/functions/${f.id}/versions/${f.versionId}`, class: "function-link" }, f.name)),
      h("td", {}, badge(f.status)), h("td", { class: "mono" }, f.id), h("td", { class: "mono" }, f.versionId),
      h("td", {}, (f.activeInstances || []).length), h("td", {}, when(f.createdAt))));
    body.replaceChildren(...(rows.length ? rows : [h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No functions"))]));
  };
  search.addEventListener("input", render);
  status.addEventListener("change", render);
  render();
  const creating = newFunctionForm();
  creating.hidden = true;
  const create = h("button", { type: "button", id: "new-function", onclick: () => { creating.hidden = !creating.hidden; } }, "New function");
  show(h("h1", {}, "Functions"), h("div", { class: "row" }, search, status, h("span", { class: "spacer" }), create), creating,
    h("section", { class: "card" }, h("table", { id: "functions" }, h("thead", {}, h("tr", {},
      ["Name", "Status", "Function id", "Version id", "Instances", "Created"].map((x) => h("th", {}, x)))), body)));
  // Statuses and instance counts move while the page is open; the search and the filter stay.
  every(SLOW_REFRESH_MS, async () => {
    const doc = await get("/v2/nvcf/functions").catch(() => null);
    if (!doc || !live()) return;
    functions = doc.functions;
    render();
  });
}

// The fields `nvcf-mono function create` asks for most; the rest keep NVCF's defaults. Once made, the
// version's page deploys it.
function newFunctionForm() {
  const input = (id, attrs) => h("input", { id, ...attrs });
  const name = input("new-name", { required: true, placeholder: "my-function" });
  const image = input("new-image", { required: true, placeholder: "echo, or registry/path:tag" });
  const url = input("new-inference-url", { required: true, value: "/" });
  const port = input("new-inference-port", { type: "number", min: 1, max: 65535, value: 8000, style: { width: "90px" } });
  const health = input("new-health-uri", { value: "/v2/health/ready" });
  const healthPort = input("new-health-port", { type: "number", min: 1, max: 65535, placeholder: "same", style: { width: "90px" } });
  return h("form", { class: "card inline", id: "new-function-form", onsubmit: async (event) => {
    event.preventDefault();
    const inferencePort = Number(port.value);
    const body = { name: name.value.trim(), containerImage: image.value.trim(), inferenceUrl: url.value.trim(), inferencePort,
      health: { protocol: "HTTP", uri: health.value.trim(), port: Number(healthPort.value) || inferencePort, timeout: "PT10S", expectedStatusCode: 200 } };
    try {
      const made = (await call("POST", "/v2/nvcf/functions", body)).function;
      toast(`Created ${made.name}`, true);
      location.hash = `#/functions/${made.id}/versions/${made.versionId}`;
    } catch (err) { toast(`Creating failed: ${err.message}`); }
  } }, h("label", {}, "Name", name), h("label", {}, "Image", image), h("label", {}, "Inference URL", url),
  h("label", {}, "Inference port", port), h("label", {}, "Health URI", health), h("label", {}, "Health port", healthPort),
  h("button", { type: "submit", id: "new-submit" }, "Create"));
}

async function versionPage(fid, vid) {
  const live = alive();
  let fn = (await get(`/v2/nvcf/functions/${fid}/versions/${vid}`)).function;
  if (!live()) return;
  const status = h("span", { id: "version-status" }, badge(fn.status));
  const base = `/v2/nvcf/deployments/functions/${fid}/versions/${vid}`;
  const deployment = h("section", { class: "card", id: "deployment" }, h("h2", {}, "Deployment"));
  const instances = h("section", { class: "card", id: "instances" }, h("h2", {}, "Instances"));
  const logs = h("section", { class: "card", id: "logs", hidden: true });
  const queue = h("span", { id: "queue-depth" }, "…");
  const traffic = h("div", { id: "version-traffic" });
  show(h("h1", {}, fn.name, " ", status),
    h("section", { class: "card" }, kv([["Function id", h("span", { class: "mono" }, fn.id)], ["Version id", h("span", { class: "mono" }, fn.versionId)],
      ["Image", fn.containerImage || fn.helmChart], ["Inference URL", fn.inferenceUrl], ["Created", when(fn.createdAt)],
      ["Telemetry", telemetryOf(fn)], ["Queued now", queue]]), h("div", { class: "row" }, h("span", { class: "spacer" }),
      h("button", { class: "danger", id: "delete-version", onclick: () => deleteVersion(fn) }, "Delete version"))),
    deployment, instances, logs, tryIt(fn), traffic);
  let shownLogs = null;
  let first = true;
  const refresh = async () => {
    if (!live()) return;
    if (!first) {
      // The version's status moves as it deploys, scales and undeploys.
      try { fn = (await get(`/v2/nvcf/functions/${fid}/versions/${vid}`)).function; } catch (e) { /* kept as drawn */ }
      if (!live()) return;
      status.replaceChildren(badge(fn.status));
    }
    first = false;
    try {
      const q = (await get(`/v2/nvcf/queues/functions/${fid}/versions/${vid}`)).queues[0];
      queue.textContent = q.waitReason ? `${q.queueDepth} (waiting: ${q.waitReason.replace("_", " ")})` : String(q.queueDepth);
    } catch (e) { queue.textContent = "-"; }
    await renderDeployment(deployment, fn, base);
    await renderInstances(instances, fid, vid, (iid) => { shownLogs = iid; renderLogs(logs, iid); });
    if (shownLogs) await renderLogs(logs, shownLogs);
  };
  await refresh();
  if (!live()) return;
  every(REFRESH_MS, refresh);
  const charts = async () => {
    const drawn = await guarded("Traffic, the last hour", async () =>
      trafficCharts(await get(`/v2/nvcf/stats?functionId=${fid}&versionId=${vid}`)));
    if (live()) traffic.replaceChildren(drawn);
  };
  await charts();
  if (live()) every(SLOW_REFRESH_MS, charts);
}

// Where the version's telemetry goes, kind by kind: the endpoints' names once read (a key without
// manage_telemetries sees their ids).
function telemetryOf(fn) {
  const chosen = fn.telemetries || {};
  const kinds = ["traces", "metrics", "logs"].filter((k) => chosen[`${k}TelemetryId`]);
  if (!kinds.length) return "-";
  const label = (names) => kinds.map((k) => `${k} → ${names[chosen[`${k}TelemetryId`]] || chosen[`${k}TelemetryId`]}`).join(", ");
  const cell = h("span", { id: "telemetry" }, label({}));
  get("/v2/nvcf/telemetries").then((doc) => {
    cell.textContent = label(Object.fromEntries(doc.telemetries.map((t) => [t.telemetryId, t.name])));
  }).catch(() => { /* ids stay */ });
  return cell;
}

async function renderDeployment(card, fn, base) {
  let dep = null;
  try { dep = (await get(base)).deployment; } catch (err) {
    if (err.status === 403) { card.replaceChildren(h("h2", {}, "Deployment"), h("p", { class: "muted" }, `Not allowed with this credential: ${err.message}`)); return; }
    if (err.status !== 404) throw err;
  }
  if (typingIn(card)) return; // drawn again, the form would lose what is being typed
  if (!dep) {
    card.replaceChildren(h("h2", {}, "Deployment"), h("p", { class: "muted" }, "Not deployed."), await deployForm(base));
    return;
  }
  const specs = dep.deploymentSpecifications || [];
  const rows = specs.map((s) => {
    const p = s.placement || {};
    return h("tr", {}, h("td", {}, s.gpu), h("td", {}, s.instanceType), h("td", { class: "min" }, s.minInstances), h("td", { class: "max" }, s.maxInstances),
      h("td", {}, s.maxRequestConcurrency ?? 1), h("td", {}, `${p.runningInstances ?? 0} running, ${p.startingInstances ?? 0} starting, ${p.waitingInstances ?? 0} waiting, ${p.failedInstances ?? 0} failed`),
      h("td", { class: "autoscaler" }, p.autoscaler || "-"));
  });
  const min = h("input", { id: "scale-min", type: "number", min: 0, value: specs[0] ? specs[0].minInstances : 0, style: { width: "80px" } });
  const max = h("input", { id: "scale-max", type: "number", min: 1, value: specs[0] ? specs[0].maxInstances : 1, style: { width: "80px" } });
  const scale = h("form", { class: "inline", id: "scale", onsubmit: async (event) => {
    event.preventDefault();
    const lo = Number(min.value), hi = Number(max.value);
    if (!confirm(`Scale ${fn.name} to min ${lo}, max ${hi}?`)) return;
    try {
      await call("PUT", base, { deploymentSpecifications: specs.map((s) => ({ ...withoutPlacement(s), minInstances: lo, maxInstances: hi })) });
      toast(`Scaled to min ${lo}, max ${hi}`, true);
      await renderDeployment(card, fn, base);
    } catch (err) { toast(`Scaling failed: ${err.message}`); }
  } }, h("label", {}, "Min instances", min), h("label", {}, "Max instances", max), h("button", { type: "submit", id: "scale-submit" }, "Scale"),
  h("button", { type: "button", class: "danger", id: "undeploy", onclick: async () => {
    if (!confirm(`Undeploy ${fn.name}? Its instances are stopped.`)) return;
    try { await call("DELETE", base); toast("Undeploying", true); await renderDeployment(card, fn, base); } catch (err) { toast(`Undeploy failed: ${err.message}`); }
  } }, "Undeploy"));
  // Why it failed (a deployment in ERROR, or instances that could not start): the instances' reasons.
  const why = (dep.healthInfo || []).map((i) => h("pre", { class: "log health-info" }, `${i.gpu} ${i.instanceType}: ${i.error}`));
  card.replaceChildren(h("h2", {}, "Deployment ", badge(dep.functionStatus)),
    table(["GPU", "Instance type", "Min", "Max", "Concurrency", "Instances", "Autoscaler's last decision"], rows, { id: "specs" }),
    ...(why.length ? [h("h2", { class: "muted", style: { marginTop: "12px" } }, "Why"), ...why] : []), h("p"), scale);
}

// The field with the focus is in ``card``: the user is filling in its form.
function typingIn(card) {
  const el = document.activeElement;
  return Boolean(el) && card.contains(el) && el.matches("input, select, textarea");
}

function withoutPlacement(spec) {
  const copy = { ...spec };
  delete copy.placement;
  return copy;
}

// Where something can run: a choice of the clusters' GPUs and instance types, or, for a credential
// that may not list cluster groups (a tasks key), the two names typed in.
async function gpuPicker(id) {
  const choices = [];
  try {
    for (const group of (await get("/v2/nvcf/clusterGroups")).clusterGroups) {
      for (const gpu of group.gpus) for (const t of gpu.instanceTypes) choices.push({ gpu: gpu.name, type: t.name });
    }
  } catch (e) { /* typed in instead */ }
  if (choices.length) {
    const select = h("select", { id }, choices.map((c, i) => h("option", { value: i }, `${c.gpu} · ${c.type}`)));
    return { fields: [h("label", {}, "GPU and instance type", select)], chosen: () => choices[Number(select.value)] };
  }
  const gpu = h("input", { id: `${id}-gpu`, placeholder: "H100", style: { width: "90px" } });
  const type = h("input", { id: `${id}-instance-type`, placeholder: "ON-PREM.GPU.H100_1x" });
  return { fields: [h("label", {}, "GPU", gpu), h("label", {}, "Instance type", type)],
    chosen: () => (gpu.value.trim() && type.value.trim() ? { gpu: gpu.value.trim(), type: type.value.trim() } : undefined) };
}

async function deployForm(base) {
  const where = await gpuPicker("deploy-type");
  const min = h("input", { id: "deploy-min", type: "number", min: 0, value: 1, style: { width: "80px" } });
  const max = h("input", { id: "deploy-max", type: "number", min: 1, value: 1, style: { width: "80px" } });
  const concurrency = h("input", { id: "deploy-concurrency", type: "number", min: 1, value: 1, style: { width: "80px" } });
  return h("form", { class: "inline", id: "deploy", onsubmit: async (event) => {
    event.preventDefault();
    const choice = where.chosen();
    if (!choice) { toast("No GPU to deploy on: name one that a cluster offers"); return; }
    try {
      await call("POST", base, { deploymentSpecifications: [{ gpu: choice.gpu, instanceType: choice.type,
        minInstances: Number(min.value), maxInstances: Number(max.value), maxRequestConcurrency: Number(concurrency.value) }] });
      toast("Deploying", true);
    } catch (err) { toast(`Deploying failed: ${err.message}`); }
  } }, ...where.fields, h("label", {}, "Min", min), h("label", {}, "Max", max),
  h("label", {}, "Concurrency", concurrency), h("button", { type: "submit" }, "Deploy"));
}

async function deleteVersion(fn) {
  if (!confirm(`Delete version ${fn.versionId} of ${fn.name}? This cannot be undone.`)) return;
  try {
    await call("DELETE", `/v2/nvcf/functions/${fn.id}/versions/${fn.versionId}`);
    toast("Deleted", true);
    location.hash = "#/functions";
  } catch (err) { toast(`Delete failed: ${err.message}`); }
}

async function renderInstances(card, fid, vid, openLogs) {
  let doc;
  try { doc = await get(`/v2/nvcf/functions/${fid}/versions/${vid}/instances`); } catch (err) {
    card.replaceChildren(h("h2", {}, "Instances"), h("p", { class: "muted" }, err.message));
    return;
  }
  const rows = doc.instances.map((i) => h("tr", { "data-instance": i.instanceId },
    h("td", { class: "mono" }, i.instanceId), h("td", {}, badge(i.instanceStatus)), h("td", {}, badge(i.instanceState)),
    h("td", {}, i.clusterName || i.clusterId), h("td", {}, i.instanceType), h("td", {}, i.restarts ?? 0), h("td", {}, when(i.readyAt)),
    h("td", {}, h("button", { class: "secondary logs-button", type: "button", onclick: () => openLogs(i.instanceId) }, "Logs"))));
  card.replaceChildren(h("h2", {}, `Instances (${doc.instances.length})`),
    table(["Instance", "Status", "State", "Cluster", "Type", "Restarts", "Ready", ""], rows, { id: "instance-table" }),
    doc.unreachableClusters && doc.unreachableClusters.length ? h("p", { class: "muted" }, `Not answering: ${doc.unreachableClusters.join(", ")}`) : "");
}

async function renderLogs(card, iid) {
  card.hidden = false;
  let doc;
  try { doc = await get(`/v2/nvcf/instances/${encodeURIComponent(iid)}/logs?lines=200`); } catch (err) {
    card.replaceChildren(h("h2", {}, `Logs of ${iid}`), h("p", { class: "muted" }, err.message));
    return;
  }
  card.replaceChildren(h("h2", {}, `Logs of ${iid} `, h("span", { class: "muted" }, "(refreshed every 2 s)")),
    ...doc.logs.map((log) => h("div", {}, h("h2", { class: "muted" }, log.name), h("pre", { class: "log", "data-log": log.name }, log.text || "(empty)"))));
}

function tryIt(fn) {
  const body = h("textarea", { id: "try-body" }, '{"message": "hello"}');
  const out = h("div", { id: "try-result" });
  return h("section", { class: "card" }, h("h2", {}, "Try it"),
    h("p", { class: "muted" }, `POST /v2/nvcf/pexec/functions/${fn.id}/versions/${fn.versionId} with this JSON body`), body,
    h("div", { class: "row" }, h("button", { id: "try-invoke", type: "button", onclick: async () => {
      let text = body.value;
      try { JSON.parse(text); } catch (err) { out.replaceChildren(h("p", { class: "error" }, `Not JSON: ${err.message}`)); return; }
      out.replaceChildren(h("p", { class: "muted" }, "Invoking…"));
      const live = alive();
      const started = performance.now();
      const poll = { headers: { "NVCF-POLL-SECONDS": String(TRY_POLL_SECONDS) }, raw: true };
      try {
        let response = await call("POST", `/v2/nvcf/pexec/functions/${fn.id}/versions/${fn.versionId}`, text, poll);
        // A 202 is an answer not there yet (queued, a cold start, a long call): followed as the CLI does.
        while (response.status === 202 && response.headers.get("NVCF-REQID") && live()) {
          const reqid = response.headers.get("NVCF-REQID");
          const percent = response.headers.get("NVCF-PERCENT-COMPLETE");
          out.replaceChildren(h("p", { class: "muted", id: "try-waiting" },
            `In progress for ${((performance.now() - started) / 1000).toFixed(0)} s${percent ? `, ${percent} %` : ""}; asking again (${reqid})…`));
          response = await call("GET", `/v2/nvcf/pexec/status/${reqid}`, undefined, poll);
        }
        if (!live()) return;
        const answer = await response.text();
        let pretty = answer;
        try { pretty = JSON.stringify(JSON.parse(answer), null, 2); } catch (e) { /* not JSON: as it came */ }
        const header = (name) => response.headers.get(name) || "-";
        out.replaceChildren(kv([["Status", h("span", { id: "try-status" }, String(response.status))], ["NVCF-REQID", h("span", { id: "try-reqid", class: "mono" }, header("NVCF-REQID"))],
          ["NVCF-STATUS", header("NVCF-STATUS")], ["Server-Timing", h("span", { id: "try-timing", class: "mono" }, header("Server-Timing"))],
          ["Content-Type", header("Content-Type")], ["Round trip", `${(performance.now() - started).toFixed(1)} ms`]]),
        h("pre", { id: "try-answer" }, pretty));
      } catch (err) { out.replaceChildren(h("p", { class: "error" }, err.message)); }
    } }, "Invoke")), out);
}

// A task in one of these changes no more.
const TASK_ENDED = new Set(["COMPLETED", "ERRORED", "CANCELED", "EXCEEDED_MAX_RUNTIME_DURATION", "EXCEEDED_MAX_QUEUED_DURATION"]);
const TASKS_PAGE = 100;

function taskRow(t) {
  return h("tr", { "data-task": t.id, "data-status": t.status }, h("td", {}, h("a", { href: `#/tasks/${t.id}` }, t.name)),
    h("td", { class: "status" }, badge(t.status)), h("td", { class: "progress" }, progressOf(t)), h("td", { class: "mono" }, t.id),
    h("td", {}, when(t.createdAt)));
}
function progressOf(t) { return t.percentComplete !== undefined ? `${t.percentComplete} %` : "-"; }

// The listed tasks that have not ended, asked for again: their statuses in bulk (100 a call), and the
// progress of those running (the first 25; a task's own page has all of it).
async function refreshTaskRows(rows, live) {
  const open = rows.filter((r) => !TASK_ENDED.has(r.dataset.status));
  const set = (row, t) => {
    row.dataset.status = t.status;
    row.querySelector("td.status").replaceChildren(badge(t.status));
    if (t.percentComplete !== undefined) row.querySelector("td.progress").textContent = progressOf(t);
  };
  for (let i = 0; i < open.length; i += TASKS_PAGE) {
    const batch = open.slice(i, i + TASKS_PAGE);
    const doc = await call("POST", "/v1/nvct/tasks/bulk", { taskIds: batch.map((r) => r.dataset.task) });
    if (!live()) return;
    const byId = new Map((doc.tasks || []).map((t) => [t.id, t]));
    for (const row of batch) if (byId.has(row.dataset.task)) set(row, byId.get(row.dataset.task));
  }
  for (const row of open.filter((r) => r.dataset.status === "RUNNING").slice(0, 25)) {
    const task = (await get(`/v1/nvct/tasks/${row.dataset.task}`)).task;
    if (!live()) return;
    set(row, task);
  }
}

async function tasksPage() {
  const live = alive();
  const rows = [];
  let cursor = null;
  // The API answers a page at a time (oldest first); "More" asks for the next one.
  const next = async () => {
    const doc = await get(`/v1/nvct/tasks?limit=${TASKS_PAGE}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
    rows.push(...(doc.tasks || []).map(taskRow));
    cursor = doc.cursor || null;
  };
  await next();
  if (!live()) return;
  const card = h("section", { class: "card" });
  const draw = () => {
    const more = h("button", { class: "secondary", type: "button", id: "more-tasks", onclick: async () => {
      try { await next(); } catch (err) { toast(`Could not list more tasks: ${err.message}`); return; }
      if (live()) draw();
    } }, "More");
    card.replaceChildren(table(["Name", "Status", "Progress", "Id", "Created"], rows, { id: "tasks" }), ...(cursor ? [h("div", { class: "row" }, more)] : []));
  };
  draw();
  const launching = await newTaskForm();
  if (!live()) return;
  launching.hidden = true;
  const launch = h("button", { type: "button", id: "new-task", onclick: () => { launching.hidden = !launching.hidden; } }, "New task");
  show(h("h1", {}, "Tasks"), h("div", { class: "row" }, h("span", { class: "spacer" }), launch), launching, card);
  every(SLOW_REFRESH_MS, () => refreshTaskRows(rows, live).catch(() => { /* the next round tries again */ }));
}

// A task to run once: the fields `nvcf-mono task create` asks for most; its page follows it.
async function newTaskForm() {
  const where = await gpuPicker("task-type");
  const name = h("input", { id: "task-name", required: true, placeholder: "my-task" });
  const image = h("input", { id: "task-image", required: true, placeholder: "task-example, or registry/path:tag" });
  const args = h("input", { id: "task-args", placeholder: "--steps 5" });
  const runtime = h("input", { id: "task-runtime", value: "PT1H", style: { width: "90px" } });
  return h("form", { class: "card inline", id: "new-task-form", onsubmit: async (event) => {
    event.preventDefault();
    const choice = where.chosen();
    if (!choice) { toast("Name the GPU and instance type to run on"); return; }
    const body = { name: name.value.trim(), containerImage: image.value.trim(), gpuSpecification: { gpu: choice.gpu, instanceType: choice.type } };
    if (args.value.trim()) body.containerArgs = args.value.trim();
    if (runtime.value.trim()) body.maxRuntimeDuration = runtime.value.trim();
    try {
      const made = (await call("POST", "/v1/nvct/tasks", body)).task;
      toast(`Launched ${made.name}`, true);
      location.hash = `#/tasks/${made.id}`;
    } catch (err) { toast(`Launching failed: ${err.message}`); }
  } }, h("label", {}, "Name", name), h("label", {}, "Image", image), h("label", {}, "Arguments", args), ...where.fields,
  h("label", {}, "Longest run", runtime), h("button", { type: "submit", id: "task-submit" }, "Launch"));
}

async function taskPage(id) {
  const live = alive();
  const title = h("h1", {});
  const summary = h("section", { class: "card", id: "task-summary" });
  const events = h("div", {}, "…");
  const results = h("div", {}, "…");
  let ended = false;
  // Drawn again every 2 s until the task has ended: its status, progress, events and results as they come.
  const refresh = async () => {
    if (ended) return;
    const task = (await get(`/v1/nvct/tasks/${id}`)).task;
    if (!live()) return;
    ended = TASK_ENDED.has(task.status);
    title.replaceChildren(task.name, " ", badge(task.status));
    const error = task.healthInfo && task.healthInfo.error;
    const action = ended
      ? h("button", { class: "danger", type: "button", id: "delete-task", onclick: async () => {
        if (!confirm(`Delete task ${task.name} with its events and results?`)) return;
        try { await call("DELETE", `/v1/nvct/tasks/${id}`); toast("Deleted", true); location.hash = "#/tasks"; } catch (err) { toast(`Delete failed: ${err.message}`); }
      } }, "Delete")
      : h("button", { class: "danger", type: "button", id: "cancel-task", onclick: async () => {
        if (!confirm(`Cancel task ${task.name}?`)) return;
        try { await call("POST", `/v1/nvct/tasks/${id}/cancel`); toast("Cancelled", true); await refresh(); } catch (err) { toast(`Cancel failed: ${err.message}`); }
      } }, "Cancel");
    summary.replaceChildren(kv([["Id", h("span", { class: "mono" }, task.id)], ["Image", task.containerImage || task.helmChart],
      ["Progress", task.percentComplete !== undefined ? h("span", { id: "task-progress" }, `${task.percentComplete} %`) : "-"],
      ["Created", when(task.createdAt)], ["Last heartbeat", when(task.lastHeartbeatAt)],
      ["Error", error ? h("pre", { class: "log", id: "task-error" }, error) : null]]),
    h("div", { class: "row" }, action));
    try {
      const doc = await get(`/v1/nvct/tasks/${id}/events?limit=100`);
      events.replaceChildren(table(["When", "Message"], (doc.events || []).map((e) => h("tr", {}, h("td", {}, when(e.createdAt)), h("td", {}, e.message)))));
    } catch (err) { events.replaceChildren(h("p", { class: "muted" }, err.message)); }
    try {
      const doc = await get(`/v1/nvct/tasks/${id}/results?limit=100`);
      results.replaceChildren(table(["Name", "Created", ""], (doc.results || []).map((r) => h("tr", { "data-result": r.resultId }, h("td", {}, r.name), h("td", {}, when(r.createdAt)),
        h("td", {}, h("button", { class: "secondary download", type: "button", onclick: () => download(`/v1/nvct/tasks/${id}/results/${r.resultId}/content`, r.name) }, "Download"))))),
        ...(doc.cursor ? [h("p", { class: "muted" }, "The first 100; nvcf-mono task results lists them all.")] : []));
    } catch (err) { results.replaceChildren(h("p", { class: "muted" }, err.message)); }
  };
  show(title, summary, h("section", { class: "card" }, h("h2", {}, "Events"), events), h("section", { class: "card" }, h("h2", {}, "Results"), results));
  await refresh();
  if (live() && !ended) every(REFRESH_MS, () => refresh().catch(() => { /* the next round tries again */ }));
}

async function download(path, name) {
  // Fetched with the credential (a link would need it in the URL), then handed to the browser as a file.
  try {
    const response = await call("GET", scoped(path), undefined, { raw: true });
    if (!response.ok) throw new ApiError(response.status, `${response.status} ${response.statusText}`);
    const url = URL.createObjectURL(await response.blob());
    const a = h("a", { href: url, download: name || "result" });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  } catch (err) { toast(`Download failed: ${err.message}`); }
}

async function clustersPage() {
  show(h("h1", {}, "Clusters"), await guarded("GPUs", gpuTable), await guarded("Cluster groups and instance types", async () => {
    const groups = (await get("/v2/nvcf/clusterGroups")).clusterGroups;
    return table(["Group", "Clusters", "GPU", "Instance types"], groups.flatMap((g) => g.gpus.map((gpu) => h("tr", {},
      h("td", {}, g.name), h("td", {}, g.clusters.map((c) => c.name).join(", ")), h("td", {}, gpu.name),
      h("td", {}, gpu.instanceTypes.map((t) => t.name).join(", "))))));
  }));
}

// ---- routing ------------------------------------------------------------------------------------

async function route() {
  timers.forEach(clearInterval);
  timers = [];
  generation += 1;
  const live = alive();
  if (!sessionStorage.getItem(TOKEN)) { signInPage(); return; }
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean);
  try {
    if (parts[0] === "signin") signInPage();
    else if (parts[0] === "functions" && parts.length === 4) await versionPage(parts[1], parts[3]);
    else if (parts[0] === "functions") await functionsPage();
    else if (parts[0] === "tasks" && parts[1]) await taskPage(parts[1]);
    else if (parts[0] === "tasks") await tasksPage();
    else if (parts[0] === "clusters") await clustersPage();
    else await dashboard();
  } catch (err) {
    if (live()) show(h("section", { class: "card" }, h("h1", {}, err.status === 404 ? "Not found" : err.status === 403 ? "Not allowed with this credential" : "Something went wrong"), h("p", { class: "error", id: "page-error" }, err.message)));
  }
}

window.addEventListener("hashchange", route);
document.getElementById("signout").addEventListener("click", () => signOut("Signed out."));
document.getElementById("account").addEventListener("change", (event) => {
  if (event.target.value) sessionStorage.setItem(ACCOUNT, event.target.value);
  else sessionStorage.removeItem(ACCOUNT);
  location.hash = "#/";
  route();
});
(async () => {
  if (sessionStorage.getItem(TOKEN)) await whoAmI();
  chrome();
  route();
})();
