// ci-sizer operator's page. Hand-written, no dependencies, no build step.
// The token lives in this tab's sessionStorage and travels only in the Authorization header.
// Every piece of data arrives as an HTML fragment rendered (and escaped) by the server; messages
// built here are set with textContent.
"use strict";

(() => {
  const KEY = "ci-sizer-token";
  const $ = (sel, root = document) => root.querySelector(sel);
  const view = () => $("#view");
  let token = sessionStorage.getItem(KEY); // null: not asked yet; "": the service runs without tokens
  const state = {
    fleet: { org: "", repo: "", workflow: "", q: "", phase: "", sort: "waste_memory", cursor: "" },
    overrides: { org: "", repo: "", workflow: "", job: "", cursor: "" },
    polling: null,
  };

  // ------------------------------------------------------------------ requests

  function authHeaders(extra) {
    const h = Object.assign({}, extra || {});
    if (token) h.Authorization = "Bearer " + token;
    return h;
  }

  function problemText(status, text) {
    try {
      const p = JSON.parse(text);
      return `${p.status} ${p.title}${p.detail ? ": " + p.detail : ""}`;
    } catch (_) {
      return `HTTP ${status}`;
    }
  }

  class HttpError extends Error {}

  async function fragment(path, params) {
    const qs = new URLSearchParams();
    for (const [k, v] of Object.entries(params || {})) {
      if (v !== undefined && v !== null && v !== "") qs.set(k, v);
    }
    const query = qs.toString();
    const r = await fetch("fragments/" + path + (query ? "?" + query : ""), {
      headers: authHeaders(),
      credentials: "omit",
      cache: "no-store",
    });
    const text = await r.text();
    if (r.status === 401) {
      forget(problemText(r.status, text));
      throw new HttpError("unauthorized");
    }
    if (!r.ok) throw new HttpError(problemText(r.status, text));
    return text;
  }

  async function api(method, path, body, extra) {
    const init = { method, headers: authHeaders(extra), credentials: "omit", cache: "no-store" };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers["Content-Type"] = "application/json";
    }
    const r = await fetch(path, init);
    if (r.status === 401) forget("The token was not accepted.");
    return r;
  }

  function say(message) {
    $("#status").textContent = message || "";
  }

  async function guarded(work) {
    say("");
    try {
      await work();
    } catch (e) {
      if (e instanceof HttpError && e.message === "unauthorized") return;
      say(e.message || String(e));
    }
  }

  // ------------------------------------------------------------------ token

  function forget(message) {
    token = null;
    sessionStorage.removeItem(KEY);
    $("#nav").hidden = true;
    $("#forget").hidden = true;
    $("#who").textContent = "";
    view().textContent = "";
    $("#login").hidden = false;
    $("#login-error").textContent = message || "";
    $("#token").value = "";
    $("#token").focus();
  }

  async function signIn() {
    const html = await fragment("me");
    $("#who").innerHTML = html;
    $("#login").hidden = true;
    $("#nav").hidden = false;
    $("#forget").hidden = !token;
    route();
  }

  // ------------------------------------------------------------------ views

  function mount(templateId) {
    const v = view();
    v.textContent = "";
    v.appendChild($(templateId).content.cloneNode(true));
  }

  function fillForm(form, values) {
    for (const [k, v] of Object.entries(values)) {
      if (form.elements[k]) form.elements[k].value = v;
    }
  }

  function formValues(form, names) {
    const out = {};
    for (const n of names) out[n] = form.elements[n] ? form.elements[n].value.trim() : "";
    return out;
  }

  async function showFleet() {
    mount("#tpl-fleet");
    fillForm($("#job-filter"), state.fleet);
    await loadJobs();
  }

  async function loadJobs() {
    $("#jobs-fragment").innerHTML = await fragment("jobs", state.fleet);
  }

  function jobHash(k) {
    return "#job/" + [k.org, k.repo, k.workflow, k.job].map(encodeURIComponent).join("/");
  }

  async function showJob(key) {
    view().innerHTML = await fragment("job", key);
    const holder = $("#job-override");
    if (holder) await loadEditor(holder, key, () => showJob(key));
  }

  async function showOverrides() {
    mount("#tpl-overrides");
    fillForm($("#override-filter"), state.overrides);
    await loadOverrides();
  }

  async function loadOverrides() {
    $("#overrides-fragment").innerHTML = await fragment("overrides", state.overrides);
  }

  async function showAnalyses() {
    view().innerHTML = await fragment("analyses");
  }

  function route() {
    stopPolling();
    const hash = location.hash.replace(/^#/, "") || "fleet";
    const [name, ...rest] = hash.split("/");
    for (const a of document.querySelectorAll("#nav a")) {
      a.classList.toggle("active", a.dataset.view === name);
    }
    guarded(async () => {
      if (name === "job" && rest.length === 4) {
        const [org, repo, workflow, job] = rest.map(decodeURIComponent);
        await showJob({ org, repo, workflow, job });
      } else if (name === "overrides") {
        await showOverrides();
      } else if (name === "analyses") {
        await showAnalyses();
      } else {
        await showFleet();
      }
    });
  }

  // ------------------------------------------------------------------ overrides

  function keyOf(el) {
    const d = el.dataset;
    return { org: d.org || "", repo: d.repo || "", workflow: d.workflow || "", job: d.job || "" };
  }

  function overridePath(k) {
    const parts = [k.org, k.repo, k.workflow, k.job].filter((p) => p);
    return "/api/v1/sizing/overrides/" + parts.map(encodeURIComponent).join("/");
  }

  // the editor of one scope's override inside ``holder``; ``done`` runs after a write
  async function loadEditor(holder, key, done) {
    holder.innerHTML = await fragment("override", key || {});
    const form = $("form", holder);
    if (form) form.onDone = done;
  }

  function scopeOf(form) {
    if (form.dataset.org !== undefined) return keyOf(form);
    const v = formValues(form, ["org", "repo", "workflow", "job"]);
    // a lower level without the one above it names no scope: let the API say so
    return v;
  }

  function formStatus(form, message) {
    $(".form-status", form).textContent = message;
  }

  async function saveOverride(form) {
    const key = scopeOf(form);
    if (!key.org) return formStatus(form, "An org is required.");
    const v = formValues(form, ["cpu_request", "cpu_limit", "memory_request", "memory_limit", "reason", "expires_at"]);
    const body = {};
    for (const n of ["cpu_request", "cpu_limit", "memory_request", "memory_limit", "reason"]) {
      body[n] = v[n] === "" ? null : v[n];
    }
    body.expires_at = v.expires_at ? v.expires_at + (v.expires_at.length === 16 ? ":00Z" : "Z") : null;
    const etag = form.dataset.etag;
    const r = await api("PUT", overridePath(key), body, etag ? { "If-Match": etag } : { "If-None-Match": "*" });
    if (r.status === 412) return showConflict(form, key);
    if (!r.ok) return formStatus(form, problemText(r.status, await r.text()));
    const saved = await r.json();
    form.dataset.etag = saved.etag;
    formStatus(form, r.status === 201 ? "Created." : "Saved.");
    if (form.onDone) await form.onDone();
    else await showOverrides();
  }

  async function deleteOverride(form) {
    const key = scopeOf(form);
    const r = await api("DELETE", overridePath(key), undefined, { "If-Match": form.dataset.etag || "*" });
    if (r.status === 412) return showConflict(form, key);
    if (r.status !== 204) return formStatus(form, problemText(r.status, await r.text()));
    formStatus(form, "Deleted.");
    if (form.onDone) await form.onDone();
    else await showOverrides();
  }

  // a write met a newer version: show what is stored now, keep the operator's values, and take
  // the new ETag so that a retry replaces exactly what was shown
  async function showConflict(form, key) {
    const box = $(".conflict", form);
    box.innerHTML = await fragment("override", Object.assign({ view: "current" }, key));
    box.hidden = false;
    const current = $("[data-current]", box);
    form.dataset.etag = current ? current.dataset.etag : "";
    formStatus(form, "Conflict: not saved.");
  }

  async function takeCurrent(form) {
    const key = scopeOf(form);
    const holder = form.parentElement;
    await loadEditor(holder, key, form.onDone);
  }

  // ------------------------------------------------------------------ analyses

  function list(text, asInt) {
    const parts = text.split(",").map((s) => s.trim()).filter((s) => s);
    return asInt ? parts.map((s) => Number(s)) : parts;
  }

  async function startAnalysis(kind, body) {
    const r = await api("POST", `/api/v1/${kind}s`, body);
    const text = await r.text();
    if (r.status !== 202) throw new Error(problemText(r.status, text));
    const id = JSON.parse(text).id;
    await pollAnalysis(kind, id);
  }

  function stopPolling() {
    if (state.polling) clearTimeout(state.polling);
    state.polling = null;
  }

  async function pollAnalysis(kind, id) {
    stopPolling();
    const target = $("#analysis-result");
    if (!target) return;
    target.innerHTML = await fragment("analysis", { kind, id });
    const status = $("[data-status]", target).dataset.status;
    if (status === "queued" || status === "running") {
      state.polling = setTimeout(() => guarded(() => pollAnalysis(kind, id)), 1000);
    }
  }

  // ------------------------------------------------------------------ copying

  async function copy(button) {
    const pre = document.getElementById(button.dataset.target);
    const text = pre ? pre.textContent : "";
    try {
      await navigator.clipboard.writeText(text);
    } catch (_) {
      const range = document.createRange();
      range.selectNodeContents(pre);
      const sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      document.execCommand("copy");
      sel.removeAllRanges();
    }
    button.textContent = "Copied";
    setTimeout(() => (button.textContent = "Copy"), 1500);
  }

  // ------------------------------------------------------------------ events

  document.addEventListener("click", (ev) => {
    const el = ev.target.closest("[data-action]");
    if (!el || el.type === "submit") return;
    const form = el.closest("form");
    const action = el.dataset.action;
    guarded(async () => {
      if (action === "open-job") location.hash = jobHash(keyOf(el));
      else if (action === "jobs-page") {
        state.fleet.cursor = el.dataset.cursor;
        await loadJobs();
      } else if (action === "overrides-page") {
        state.overrides.cursor = el.dataset.cursor;
        await loadOverrides();
      } else if (action === "new-override") await loadEditor($("#override-editor"), null, null);
      else if (action === "edit-override") await loadEditor($("#override-editor"), keyOf(el), null);
      else if (action === "delete-override") await deleteOverride(form);
      else if (action === "retry-override") await saveOverride(form);
      else if (action === "take-current") await takeCurrent(form);
      else if (action === "close-editor") form.parentElement.textContent = "";
      else if (action === "copy") await copy(el);
    });
  });

  document.addEventListener("submit", (ev) => {
    const form = ev.target;
    ev.preventDefault();
    guarded(async () => {
      if (form.id === "token-form") {
        token = $("#token").value.trim();
        sessionStorage.setItem(KEY, token);
        $("#token").value = "";
        await signIn();
      } else if (form.id === "job-filter") {
        Object.assign(state.fleet, formValues(form, ["org", "repo", "workflow", "q", "phase", "sort"]), { cursor: "" });
        await loadJobs();
      } else if (form.id === "override-filter") {
        Object.assign(state.overrides, formValues(form, ["org", "repo", "workflow", "job"]), { cursor: "" });
        await loadOverrides();
      } else if (form.classList.contains("override-form")) {
        await saveOverride(form);
      } else if (form.id === "backtest-form") {
        const v = formValues(form, ["org", "runs", "buffer", "cpu_percentile"]);
        const body = { runs: list(v.runs, true), buffer: list(v.buffer, true), cpu_percentile: list(v.cpu_percentile) };
        if (v.org) body.org = v.org;
        await startAnalysis("backtest", body);
      } else if (form.id === "simulation-form") {
        const v = formValues(form, ["days", "builds_per_day", "cpu", "memory", "price"]);
        await startAnalysis("simulation", {
          synthetic: { days: Number(v.days), builds_per_day: Number(v.builds_per_day) },
          pool: { shapes: [{ name: "node", cpu: v.cpu, memory: v.memory, price_per_hour: Number(v.price) }] },
        });
      }
    });
  });

  $("#forget").addEventListener("click", () => forget(""));
  window.addEventListener("hashchange", () => {
    if (token !== null) route();
  });

  if (token === null) forget("");
  else guarded(signIn);
})();
