// berth's web console (docs/console.md). Plain JavaScript, no framework:
// berthd's API through Connect JSON (docs/http.md) and its WebSocket
// terminal (/ws/v1/terminal), all on this page's own origin.
"use strict";

const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("berth-token") || "";
let current = ""; // the selected sandbox's id
let term = null, fit = null, socket = null;

// ApiError is a Connect error: code ("not_found"), reason (ErrorInfo's,
// "SANDBOX_NOT_FOUND") and message.
class ApiError extends Error {
  constructor(code, message, reason) {
    super(message);
    this.code = code;
    this.reason = reason || "";
  }
  toString() { return `${this.code}${this.reason ? " " + this.reason : ""}: ${this.message}`; }
}

function apiError(j, status) {
  const info = (j.details || []).find((d) => d.type === "google.rpc.ErrorInfo");
  return new ApiError(j.code || `HTTP ${status}`, j.message || "", info && info.debug ? info.debug.reason : "");
}

function headers(contentType) {
  return { "Content-Type": contentType, "Authorization": "Bearer " + token };
}

// call makes a unary Connect JSON call: /berth.v1.<service>/<method>.
async function call(service, method, body) {
  const r = await fetch(`/berth.v1.${service}/${method}`, { method: "POST", headers: headers("application/json"), body: JSON.stringify(body) });
  const j = await r.json().catch(() => ({}));
  if (!r.ok) throw apiError(j, r.status);
  return j;
}

// envelope frames one Connect streaming message: flags, 4-byte length, JSON.
function envelope(msg) {
  const data = new TextEncoder().encode(JSON.stringify(msg));
  const out = new Uint8Array(5 + data.length);
  new DataView(out.buffer).setUint32(1, data.length);
  out.set(data, 5);
  return out;
}

// stream makes a Connect streaming call (server or client stream) whose
// request messages are msgs; it returns the response messages.
async function stream(service, method, msgs) {
  const parts = msgs.map(envelope);
  const r = await fetch(`/berth.v1.${service}/${method}`, { method: "POST", headers: headers("application/connect+json"), body: new Blob(parts) });
  const buf = new Uint8Array(await r.arrayBuffer());
  if (!r.ok) throw apiError(JSON.parse(new TextDecoder().decode(buf) || "{}"), r.status);
  const out = [];
  for (let i = 0; i + 5 <= buf.length;) {
    const flags = buf[i], n = new DataView(buf.buffer, buf.byteOffset + i + 1, 4).getUint32(0);
    const msg = JSON.parse(new TextDecoder().decode(buf.subarray(i + 5, i + 5 + n)));
    i += 5 + n;
    if (flags & 2) {
      if (msg.error) throw apiError(msg.error, r.status);
      return out;
    }
    out.push(msg);
  }
  throw new ApiError("internal", `${method}: the stream ended without its end message`);
}

function showError(err) {
  const box = $("error");
  box.textContent = String(err);
  box.hidden = false;
  clearTimeout(showError.timer);
  showError.timer = setTimeout(() => { box.hidden = true; }, 8000);
}

// guarded runs f, showing what fails.
const guarded = (f) => (...args) => f(...args).catch(showError);

function cell(row, text) {
  const td = row.insertCell();
  td.textContent = text == null ? "" : String(text);
  return td;
}

function button(td, label, onclick) {
  const b = document.createElement("button");
  b.textContent = label;
  b.addEventListener("click", guarded(onclick));
  td.appendChild(b);
  return b;
}

// Log in: the token is kept if ListSandboxes accepts it.
async function login(t) {
  token = t;
  try {
    await refresh();
  } catch (e) {
    token = "";
    sessionStorage.removeItem("berth-token");
    throw e;
  }
  sessionStorage.setItem("berth-token", t);
  $("login").hidden = true;
  $("app").hidden = false;
  $("logout").hidden = false;
}

function logout() {
  closeTerminal();
  sessionStorage.removeItem("berth-token");
  location.reload();
}

async function refresh() {
  const j = await call("SandboxService", "ListSandboxes", {});
  const rows = $("sandbox-rows");
  rows.replaceChildren();
  for (const sb of j.sandboxes || []) {
    const row = rows.insertRow();
    row.dataset.id = sb.id;
    if (sb.id === current) row.className = "selected";
    cell(row, sb.id);
    cell(row, (sb.state || "").replace("SANDBOX_STATE_", "").toLowerCase());
    cell(row, sb.image);
    cell(row, sb.createdAt ? new Date(sb.createdAt).toLocaleString() : "");
    const td = row.insertCell();
    button(td, "Open", () => select(sb.id));
    button(td, "Delete", async () => {
      if (!confirm(`Delete sandbox ${sb.id}?`)) return;
      await call("SandboxService", "DeleteSandbox", { sandboxId: sb.id });
      if (current === sb.id) { closeTerminal(); current = ""; $("sandbox").hidden = true; }
      await refresh();
    });
  }
}

async function create(e) {
  e.preventDefault();
  const btn = $("create");
  btn.disabled = true;
  try {
    const req = { image: $("create-image").value.trim() };
    if ($("create-id").value.trim()) req.sandboxId = $("create-id").value.trim();
    const j = await call("SandboxService", "CreateSandbox", req);
    $("create-id").value = "";
    await refresh();
    await select(j.sandbox.id);
  } finally {
    btn.disabled = false;
  }
}

async function select(id) {
  if (current !== id) closeTerminal();
  current = id;
  $("sandbox-id").textContent = id;
  $("sandbox").hidden = false;
  for (const row of $("sandbox-rows").rows) row.className = row.dataset.id === id ? "selected" : "";
  await Promise.all([listDir(), listExecs()]);
}

// The terminal: xterm.js on the WebSocket terminal (docs/http.md).
function openTerminal() {
  closeTerminal();
  if (!term) {
    term = new Terminal({ cursorBlink: true, convertEol: false });
    fit = new FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open($("terminal"));
    term.onData((d) => { if (socket && socket.readyState === WebSocket.OPEN) socket.send(new TextEncoder().encode(d)); });
    term.onResize(({ rows, cols }) => { if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "resize", rows, cols })); });
    window.addEventListener("resize", () => fit.fit());
  }
  term.reset();
  fit.fit();
  const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/v1/terminal`, "berth.v1");
  ws.binaryType = "arraybuffer";
  socket = ws;
  const status = (s) => { $("term-status").textContent = s; };
  status("connecting");
  ws.onopen = () => ws.send(JSON.stringify({
    token, sandboxId: current, rows: term.rows, cols: term.cols,
    process: { shellCommand: "if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi", env: { TERM: "xterm-256color" } },
  }));
  ws.onmessage = (ev) => {
    if (typeof ev.data !== "string") { term.write(new Uint8Array(ev.data)); return; }
    const m = JSON.parse(ev.data);
    if (m.type === "started") { status(`running (exec ${m.execId})`); term.focus(); }
    if (m.type === "exited") status(`exited ${m.result.exitCode ?? ""}${m.result.signal ? " " + m.result.signal : ""}`);
    if (m.type === "error") showError(new ApiError(m.code, m.message, m.reason));
  };
  ws.onclose = (ev) => {
    if (socket === ws) socket = null;
    if (ev.code !== 1000) status(`closed ${ev.code} ${ev.reason}`);
    listExecs().catch(() => {});
  };
}

function closeTerminal() {
  if (socket) { socket.close(1000); socket = null; }
}

// Files.
async function listDir(e) {
  if (e) e.preventDefault();
  const dir = $("dir").value;
  const msgs = await stream("FileService", "ListDir", [{ sandboxId: current, path: dir }]);
  const rows = $("file-rows");
  rows.replaceChildren();
  const entries = msgs.flatMap((m) => m.entries || []).sort((a, b) => (a.displayName < b.displayName ? -1 : 1));
  for (const f of entries) {
    const row = rows.insertRow();
    const type = (f.type || "").replace("FILE_TYPE_", "").toLowerCase();
    cell(row, f.displayName);
    cell(row, type);
    cell(row, f.sizeBytes || "0");
    cell(row, f.modifiedAt ? new Date(f.modifiedAt).toLocaleString() : "");
    const td = row.insertCell();
    if (type === "directory") button(td, "Open", async () => { $("dir").value = f.displayPath; await listDir(); });
    if (type === "regular") button(td, "Download", () => download(f.displayPath, f.displayName)).dataset.name = f.displayName;
  }
}

// fileURL is the raw file route of path in the current sandbox
// (docs/http.md, "Files as raw bodies").
function fileURL(path, params) {
  const q = new URLSearchParams({ path, ...params });
  return `/v1/sandboxes/${encodeURIComponent(current)}/files/content?${q}`;
}

// restError is the ApiError of a REST error body (google.rpc.Status JSON).
async function restError(r) {
  const j = await r.json().catch(() => ({}));
  const info = (j.details || []).find((d) => (d["@type"] || "").endsWith("/google.rpc.ErrorInfo"));
  return new ApiError(CODES[j.code] || `HTTP ${r.status}`, j.message || "", info ? info.reason : "");
}

const CODES = ["ok", "canceled", "unknown", "invalid_argument", "deadline_exceeded", "not_found", "already_exists", "permission_denied",
  "resource_exhausted", "failed_precondition", "aborted", "out_of_range", "unimplemented", "internal", "unavailable", "data_loss", "unauthenticated"];

// download saves a file through the raw route: the bytes go from the
// response into the browser's blob store (which keeps large blobs on
// disk), never through JavaScript arrays or base64.
async function download(path, name) {
  const r = await fetch(fileURL(path), { headers: { "Authorization": "Bearer " + token } });
  if (!r.ok) throw await restError(r);
  const url = URL.createObjectURL(await r.blob());
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
}

// upload sends the chosen file as the raw route's body: the browser reads
// the File from disk as it sends it (with its Content-Length), and berthd
// commits it only once the whole body arrived.
async function upload() {
  const input = $("upload");
  const file = input.files[0];
  if (!file) return;
  const dir = $("dir").value.replace(/\/+$/, "");
  const r = await fetch(fileURL(`${dir}/${file.name}`, { createParents: "true" }),
    { method: "PUT", headers: { "Authorization": "Bearer " + token, "Content-Type": "application/octet-stream" }, body: file });
  if (!r.ok) throw await restError(r);
  input.value = "";
  await listDir();
}

// Exec history.
async function listExecs() {
  const j = await call("SandboxService", "ListExecs", { sandboxId: current });
  const rows = $("exec-rows");
  rows.replaceChildren();
  const execs = (j.execs || []).sort((a, b) => ((a.startedAt || "") < (b.startedAt || "") ? 1 : -1));
  for (const x of execs) {
    const row = rows.insertRow();
    cell(row, x.execId);
    cell(row, (x.argv || []).join(" ") + (x.argvTruncated ? " …" : ""));
    cell(row, (x.state || "").replace("EXEC_STATE_", "").toLowerCase());
    const r = x.result || {};
    cell(row, r.exitCode !== undefined ? r.exitCode + (r.signal ? ` (${r.signal})` : "") + (r.timedOut ? " timed out" : "") + (r.oomKilled ? " OOM" : "") : "");
    cell(row, x.startedAt ? new Date(x.startedAt).toLocaleString() : "");
  }
}

$("login-form").addEventListener("submit", (e) => { e.preventDefault(); login($("token").value.trim()).catch(showError); });
$("logout").addEventListener("click", logout);
$("create-form").addEventListener("submit", guarded(create));
$("refresh").addEventListener("click", guarded(refresh));
$("term-open").addEventListener("click", openTerminal);
$("dir-form").addEventListener("submit", guarded(listDir));
$("upload").addEventListener("change", guarded(upload));
$("execs-refresh").addEventListener("click", guarded(listExecs));
if (token) login(token).catch(showError);
