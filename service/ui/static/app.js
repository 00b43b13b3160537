// ci-sizer operator's page. Hand-written, no dependencies, no build step.
// The token lives in this tab's sessionStorage and travels only in the Authorization header.
// Every piece of data arrives as an HTML fragment rendered (and escaped) by the server; messages
// built here are set with textContent.
//
// Where the user is, is in the address: #fleet?org=acme&sort=risk, #trends?org=acme,
// #overrides?org=acme, #job/org/repo/workflow/job, #analyses, #analysis/backtest/<id>.
"use strict";

(() => {
  const KEY = "ci-sizer-token";
  const $ = (sel, root = document) => root.querySelector(sel);
  const view = () => $("#view");
  let token = sessionStorage.getItem(KEY); // null: not asked yet; "": the service runs without tokens
  const LEVELS = ["org", "repo", "workflow", "job"];
  const FILTERS = {
    fleet: ["org", "repo", "workflow", "q", "phase", "sort", "cursor"],
    trends: ["org", "repo", "workflow", "q"],
    overrides: ["org", "repo", "workflow", "job", "cursor"],
  };
  const DEFAULTS = { fleet: { sort: "money" } };
  const VALUES = ["cpu_request", "cpu_limit", "memory_request", "memory_limit", "reason", "expires_at"];
  const state = { polling: null, params: {} };

  // ------------------------------------------------------------------ requests

  function authHeaders(extra) {
    const h = Object.assign({}, extra || {});
    if (token) h.Authorization = "Bearer " + token;
    return h;
  }

  function parseProblem(text) {
    try {
      const p = JSON.parse(text);
      return p && typeof p === "object" ? p : null;
    } catch (_) {
      return null;
    }
  }

  function problemText(status, text) {
    const p = parseProblem(text);
    return p ? `${p.status} ${p.title}${p.detail ? ": " + p.detail : ""}` : `HTTP ${status}`;
  }

  class HttpError extends Error {}

  function query(params) {
    const qs = new URLSearchParams();
    for (const [k, v] of Object.entries(params || {})) {
      if (v !== undefined && v !== null && v !== "") qs.set(k, v);
    }
    return qs.toString();
  }

  async function fragment(path, params) {
    const q = query(params);
    const r = await fetch("fragments/" + path + (q ? "?" + q : ""), {
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

  // an action's error: a banner at the top of the window, where the user looks
  function say(message) {
    $("#status-text").textContent = message || "";
    $("#status").hidden = !message;
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

  // a view that cannot be shown: the view says so, in place of what was there
  function showError(title, message) {
    const v = view();
    v.textContent = "";
    const box = document.createElement("section");
    box.className = "error-view";
    box.setAttribute("role", "alert");
    box.dataset.testid = "error-view";
    const h = document.createElement("h2");
    h.textContent = title;
    h.tabIndex = -1;
    const p = document.createElement("p");
    p.className = "error";
    p.textContent = message;
    const back = document.createElement("p");
    const a = document.createElement("a");
    a.href = "#fleet";
    a.textContent = "← Fleet";
    back.appendChild(a);
    box.append(h, p, back);
    v.appendChild(box);
    for (const link of document.querySelectorAll("#nav a")) link.classList.remove("active");
    window.scrollTo(0, 0);
    h.focus();
  }

  // ------------------------------------------------------------------ token

  function forget(message) {
    token = null;
    sessionStorage.removeItem(KEY);
    $("#nav").hidden = true;
    $("#forget").hidden = true;
    $("#who").textContent = "";
    view().textContent = "";
    say("");
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

  // ------------------------------------------------------------------ the address

  function parseHash() {
    const hash = location.hash.replace(/^#/, "") || "fleet";
    const at = hash.indexOf("?");
    const path = at < 0 ? hash : hash.slice(0, at);
    const params = Object.fromEntries(new URLSearchParams(at < 0 ? "" : hash.slice(at + 1)));
    return { parts: path.split("/"), params };
  }

  // go to a view with its filters; the same address again reloads it
  function go(name, params) {
    const q = query(params);
    const hash = "#" + name + (q ? "?" + q : "");
    if (location.hash === hash) route();
    else location.hash = hash;
  }

  function jobHash(k) {
    return "#job/" + LEVELS.map((l) => encodeURIComponent(k[l])).join("/");
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

  function filtered(name, params) {
    const out = Object.assign({}, DEFAULTS[name] || {});
    for (const k of FILTERS[name]) if (params[k]) out[k] = params[k];
    return out;
  }

  async function showList(name, params) {
    const wanted = filtered(name, params);
    state.params = wanted;
    mount("#tpl-" + name);
    fillForm($("form", view()), wanted);
    const path = name === "fleet" ? "jobs" : name;
    const html = await fragment(path, wanted);
    $(`#${path}-fragment`).innerHTML = html;
  }

  async function showJob(key) {
    const html = await fragment("job", key);
    view().innerHTML = html;
    window.scrollTo(0, 0);
    const holder = $("#job-override");
    if (holder) await loadEditor(holder, key, () => route());
  }

  async function showAnalyses(open) {
    view().innerHTML = await fragment("analyses");
    if (open) await pollAnalysis(open.kind, open.id);
  }

  const TITLES = { fleet: "the fleet", trends: "the trends", overrides: "the overrides", analyses: "the analyses" };

  async function route() {
    stopPolling();
    say("");
    const { parts, params } = parseHash();
    const [name, ...rest] = parts;
    let what = TITLES[name] || TITLES.fleet;
    let work;
    if (name === "job" && rest.length === 4) {
      const key = Object.fromEntries(LEVELS.map((l, i) => [l, decodeURIComponent(rest[i])]));
      what = `the job ${LEVELS.map((l) => key[l]).join(" / ")}`;
      work = () => showJob(key);
    } else if (name === "analysis" && rest.length === 2) {
      what = `the ${rest[0]} ${rest[1]}`;
      work = () => showAnalyses({ kind: rest[0], id: rest[1] });
    } else if (name === "analyses") {
      work = () => showAnalyses(null);
    } else if (name === "trends" || name === "overrides") {
      work = () => showList(name, params);
    } else {
      work = () => showList("fleet", params);
    }
    const active = name === "job" ? "" : name === "analysis" ? "analyses" : TITLES[name] ? name : "fleet";
    for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.view === active);
    try {
      await work();
    } catch (e) {
      if (e instanceof HttpError && e.message === "unauthorized") return;
      showError(`Cannot show ${what}`, e.message || String(e));
    }
  }

  // ------------------------------------------------------------------ override editor

  function keyOf(el) {
    const d = el.dataset;
    return { org: d.org || "", repo: d.repo || "", workflow: d.workflow || "", job: d.job || "" };
  }

  // a scope names every level above its own: a gap is an error naming the missing field
  function scopeOf(form) {
    const k = form.dataset.org !== undefined ? keyOf(form) : formValues(form, LEVELS);
    for (let i = 0; i < LEVELS.length; i++) {
      const below = LEVELS.slice(i + 1).filter((l) => k[l]);
      if (!k[LEVELS[i]] && (i === 0 || below.length)) {
        const why = i === 0 ? "an org is required" : `${below.join(" and ")} ${below.length > 1 ? "are" : "is"} set`;
        return { error: { field: LEVELS[i], message: `Fill in the ${LEVELS[i]}: ${why}, and a scope names every level above its own.` } };
      }
    }
    return { key: k };
  }

  function overridePath(k) {
    const parts = [];
    for (const l of LEVELS) {
      if (!k[l]) break;
      parts.push(encodeURIComponent(k[l]));
    }
    return "/api/v1/sizing/overrides/" + parts.join("/");
  }

  async function loadEditor(holder, key, done) {
    holder.innerHTML = await fragment("override", key || {});
    const form = $("form", holder);
    if (form) form.onDone = done;
  }

  function formStatus(form, message) {
    $(".form-status", form).textContent = message;
  }

  function clearErrors(form) {
    for (const el of form.querySelectorAll(".field-error")) {
      el.textContent = "";
      el.hidden = true;
    }
    for (const el of form.querySelectorAll(".invalid")) {
      el.classList.remove("invalid");
      el.removeAttribute("aria-invalid");
    }
    formStatus(form, "");
  }

  // every error beside its field, the field highlighted; those of no field in the status line
  function showFieldErrors(form, errors, title) {
    const elsewhere = [];
    let first = null;
    for (const e of errors) {
      const name = String(e.field || "").split("/").pop();
      const input = form.elements[name];
      const slot = Array.from(form.querySelectorAll(".field-error")).find((s) => s.dataset.errorFor === name);
      if (input && slot && input.tagName) {
        input.classList.add("invalid");
        input.setAttribute("aria-invalid", "true");
        slot.textContent = slot.textContent ? slot.textContent + " " + e.message : e.message;
        slot.hidden = false;
        first = first || input;
      } else {
        elsewhere.push(e.message);
      }
    }
    formStatus(form, title + (elsewhere.length ? ": " + elsewhere.join("; ") : first ? ": see the marked fields" : ""));
    if (first) first.focus();
  }

  function showProblem(form, status, text) {
    const p = parseProblem(text);
    if (p && Array.isArray(p.errors) && p.errors.length) {
      showFieldErrors(form, p.errors, `${p.status} ${p.title}`);
    } else {
      formStatus(form, problemText(status, text));
    }
  }

  function bodyOf(form) {
    const v = formValues(form, VALUES);
    const body = {};
    for (const n of ["cpu_request", "cpu_limit", "memory_request", "memory_limit", "reason"]) {
      body[n] = v[n] === "" ? null : v[n];
    }
    body.expires_at = v.expires_at ? v.expires_at + (v.expires_at.length === 16 ? ":00Z" : "Z") : null;
    return body;
  }

  function gib(bytes) {
    return bytes >= 2 ** 30 ? (bytes / 2 ** 30).toFixed(1) + " GiB" : Math.ceil(bytes / 2 ** 20) + " MiB";
  }

  function usedText(r) {
    return r.field === "memory_limit"
      ? `memory limit ${r.pinned} < peak ${gib(r.used_value)}`
      : `CPU limit ${r.pinned} < CPU p95 ${r.used}`;
  }

  // the dry run found jobs the pin puts below what they use: name them, and ask
  function showPinCheck(form, check) {
    const box = $(".pin-check", form);
    box.textContent = "";
    const jobs = Array.from(new Set(check.below_use.map((r) => [r.org, r.repo, r.workflow, r.job].join(" / "))));
    const head = document.createElement("p");
    head.appendChild(document.createElement("strong")).textContent =
      `This pin puts ${jobs.length} of the ${check.jobs} job(s) it covers below what they use ` +
      "(pins skip the OOM backoff: a memory limit below the peak is killed on every run):";
    const list = document.createElement("ul");
    for (const r of check.below_use) {
      const li = document.createElement("li");
      li.dataset.job = r.job;
      li.textContent = `${[r.org, r.repo, r.workflow, r.job].join(" / ")}, container ${r.container}: ${usedText(r)} (newest ${r.runs} runs)`;
      list.appendChild(li);
    }
    const buttons = document.createElement("p");
    const yes = document.createElement("button");
    yes.type = "button";
    yes.dataset.action = "confirm-pin";
    yes.textContent = `Pin anyway: ${jobs.join(", ")}`;
    const no = document.createElement("button");
    no.type = "button";
    no.dataset.action = "cancel-pin";
    no.textContent = "Cancel";
    buttons.append(yes, " ", no);
    box.append(head, list, buttons);
    box.hidden = false;
    formStatus(form, "Not saved yet: confirm or cancel.");
    yes.focus();
  }

  async function saveOverride(form, confirmed) {
    clearErrors(form);
    $(".pin-check", form).hidden = true;
    const scope = scopeOf(form);
    if (scope.error) return showFieldErrors(form, [scope.error], "Not saved");
    const body = bodyOf(form);
    if (!confirmed) {
      const check = await api("PUT", overridePath(scope.key) + "?dry_run=true", body);
      const text = await check.text();
      if (!check.ok) return showProblem(form, check.status, text);
      const found = JSON.parse(text);
      if (found.below_use.length) return showPinCheck(form, found);
    }
    const etag = form.dataset.etag;
    const r = await api("PUT", overridePath(scope.key), body, etag ? { "If-Match": etag } : { "If-None-Match": "*" });
    if (r.status === 412) return showConflict(form, scope.key);
    if (!r.ok) return showProblem(form, r.status, await r.text());
    const saved = await r.json();
    form.dataset.etag = saved.etag;
    formStatus(form, r.status === 201 ? "Created." : "Saved.");
    if (form.onDone) await form.onDone();
    else await route();
  }

  async function deleteOverride(form) {
    $(".delete-confirm", form).hidden = true;
    const scope = scopeOf(form);
    if (scope.error) return showFieldErrors(form, [scope.error], "Not deleted");
    const r = await api("DELETE", overridePath(scope.key), undefined, { "If-Match": form.dataset.etag || "*" });
    if (r.status === 412) return showConflict(form, scope.key);
    if (r.status !== 204) return showProblem(form, r.status, await r.text());
    formStatus(form, "Deleted.");
    if (form.onDone) await form.onDone();
    else await route();
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
    const scope = scopeOf(form);
    await loadEditor(form.parentElement, scope.key, form.onDone);
  }

  // ------------------------------------------------------------------ analyses

  function list(text, asInt) {
    const parts = text.split(",").map((s) => s.trim()).filter((s) => s);
    return asInt ? parts.map((s) => Number(s)) : parts;
  }

  async function startAnalysis(form, kind, body) {
    const r = await api("POST", `/api/v1/${kind}s`, body);
    const text = await r.text();
    if (r.status !== 202) {
      const p = parseProblem(text);
      const detail = p && Array.isArray(p.errors) && p.errors.length ? p.errors.map((e) => e.message).join("; ") : null;
      const status = $(".form-status", form) || form.appendChild(Object.assign(document.createElement("p"), { className: "form-status error" }));
      status.textContent = detail ? `${r.status} ${p.title}: ${detail}` : problemText(r.status, text);
      return;
    }
    go(`analysis/${kind}/${JSON.parse(text).id}`, {});
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
      else if (action === "jobs-page") go("fleet", Object.assign({}, state.params, { cursor: el.dataset.cursor }));
      else if (action === "overrides-page") go("overrides", Object.assign({}, state.params, { cursor: el.dataset.cursor }));
      else if (action === "new-override") await loadEditor($("#override-editor"), null, null);
      else if (action === "edit-override") await loadEditor($("#override-editor"), keyOf(el), null);
      else if (action === "delete-override") {
        $(".delete-confirm", form).hidden = false;
        $("[data-action=confirm-delete]", form).focus();
      } else if (action === "confirm-delete") await deleteOverride(form);
      else if (action === "cancel-delete") $(".delete-confirm", form).hidden = true;
      else if (action === "confirm-pin") await saveOverride(form, true);
      else if (action === "cancel-pin") {
        $(".pin-check", form).hidden = true;
        formStatus(form, "Not saved.");
      } else if (action === "retry-override") await saveOverride(form, false);
      else if (action === "take-current") await takeCurrent(form);
      else if (action === "close-editor") form.parentElement.textContent = "";
      else if (action === "copy") await copy(el);
    });
  });

  // a sort or phase chosen applies at once
  document.addEventListener("change", (ev) => {
    const el = ev.target;
    if (el.tagName === "SELECT" && el.form && el.form.id === "job-filter") el.form.requestSubmit();
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
        go("fleet", formValues(form, FILTERS.fleet.filter((f) => f !== "cursor")));
      } else if (form.id === "trend-filter") {
        go("trends", formValues(form, FILTERS.trends));
      } else if (form.id === "override-filter") {
        go("overrides", formValues(form, FILTERS.overrides.filter((f) => f !== "cursor")));
      } else if (form.classList.contains("override-form")) {
        await saveOverride(form, false);
      } else if (form.id === "backtest-form") {
        const v = formValues(form, ["org", "runs", "buffer", "cpu_percentile"]);
        const body = { runs: list(v.runs, true), buffer: list(v.buffer, true), cpu_percentile: list(v.cpu_percentile) };
        if (v.org) body.org = v.org;
        await startAnalysis(form, "backtest", body);
      } else if (form.id === "simulation-form") {
        const v = formValues(form, ["days", "builds_per_day", "cpu", "memory", "price"]);
        await startAnalysis(form, "simulation", {
          synthetic: { days: Number(v.days), builds_per_day: Number(v.builds_per_day) },
          pool: { shapes: [{ name: "node", cpu: v.cpu, memory: v.memory, price_per_hour: Number(v.price) }] },
        });
      }
    });
  });

  $("#forget").addEventListener("click", () => forget(""));
  $("#status-close").addEventListener("click", () => say(""));
  window.addEventListener("hashchange", () => {
    if (token !== null) route();
  });

  if (token === null) forget("");
  else guarded(signIn);
})();
