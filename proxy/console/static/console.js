// The sandgate console's only script: served by the gateway, no build step, no library.
// Data from the gateway is put in the page with textContent only, never as HTML.
"use strict";

(function () {
  const PREFIX = "/console";

  function watchInbox() {
    // Reload when the set of open requests changes, unless the operator is typing.
    const inbox = document.getElementById("inbox");
    if (!inbox) return;
    const shown = inbox.dataset.ids || "";
    setInterval(async function () {
      const active = document.activeElement;
      if (active && active.tagName === "INPUT") return;
      try {
        const answer = await fetch(PREFIX + "/requests.json", { credentials: "same-origin" });
        if (answer.status === 401) { window.location.assign(PREFIX + "/login"); return; }
        if (!answer.ok) return;
        const ids = (await answer.json()).ids.join(",");
        if (ids !== shown) window.location.reload();
      } catch (e) { /* the gateway restarts: try again at the next tick */ }
    }, 1000);
  }

  const COLUMNS = [
    (r) => r.time,
    (r) => r.decision,
    (r) => r.reason,
    (r) => r.tenant,
    (r) => r.sandbox,
    (r) => r.method,
    (r) => (r.dest && (r.dest.host || r.dest.ip)),
    (r) => r.path,
  ];
  const MAX_ROWS = 500;
  const MAX_HELD = 1000;

  function row(record) {
    const tr = document.createElement("tr");
    tr.className = "decision-row " + String(record.decision || "");
    tr.tabIndex = 0;
    for (const column of COLUMNS) {
      const td = document.createElement("td");
      const value = column(record);
      td.textContent = value === undefined || value === null ? "" : String(value);
      tr.appendChild(td);
    }
    const open = function () {
      document.getElementById("record").textContent = JSON.stringify(record, null, 2);
      explain(record);
    };
    tr.addEventListener("click", open);
    tr.addEventListener("keydown", function (e) { if (e.key === "Enter") open(); });
    return tr;
  }

  // What `policy explain` says for the record's request, against the policy in force.
  let explaining = 0;
  async function explain(record) {
    const out = document.getElementById("explain");
    if (!out) return;
    const mine = ++explaining;
    out.textContent = "explaining…";
    const dest = record.dest || {};
    const fields = {
      tenant: record.tenant, sandbox: record.sandbox, phase: record.phase, method: record.method,
      host: dest.host || dest.ip, port: dest.port, path: record.path, sni: dest.sni,
    };
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(fields)) {
      if (value !== undefined && value !== null) params.set(name, String(value));
    }
    let text;
    try {
      const answer = await fetch(PREFIX + "/explain.json?" + params.toString(), { credentials: "same-origin" });
      const body = await answer.json();
      text = answer.ok ? explainText(body) : "cannot explain: " + String(body.error);
    } catch (e) {
      text = "cannot explain: the gateway did not answer";
    }
    if (mine === explaining) out.textContent = text;
  }

  function explainText(x) {
    const lines = [x.decision + ": " + x.reason, "  request  " + x.request,
      "  who      tenant " + x.tenant + ", sandbox " + x.sandbox,
      "  policy   version " + x.policy_version + ", mode " + x.mode];
    if (x.rule_id) lines.push("  rule     " + x.rule_id);
    if (x.detail) lines.push("  detail   " + x.detail);
    lines.push("steps");
    for (const s of x.steps) {
      const where = s.rule_id ? " [" + s.rule_id + (s.origin ? " at " + s.origin : "") + "]" : "";
      lines.push("  " + s.step + " " + s.name.padEnd(13) + " " + s.outcome.padEnd(11) + " " + s.detail + where);
    }
    if (x.rego) lines.push("rego     " + (x.rego.verdict.allow ? "allow" : "deny") + ": " + x.rego.verdict.reason);
    return lines.join("\n");
  }

  function copyButtons() {
    // Copy a block's text (never markup) with the Clipboard API.
    for (const button of document.querySelectorAll("button[data-copy]")) {
      const state = document.getElementById("copy-state");
      button.addEventListener("click", async function () {
        const text = document.getElementById(button.dataset.copy).textContent;
        try {
          await navigator.clipboard.writeText(text);
          if (state) state.textContent = "Copied.";
        } catch (e) {
          if (state) state.textContent = "The browser refused the clipboard: select the text and copy it.";
        }
      });
    }
  }

  function watchDecisions() {
    const rows = document.getElementById("decision-rows");
    const form = document.getElementById("filters");
    if (!rows || !form) return;
    const state = document.getElementById("stream-state");
    const pause = document.getElementById("pause");
    const heldCount = document.getElementById("held-count");
    const held = [];
    let paused = false;
    const params = new URLSearchParams();
    for (const input of form.querySelectorAll("input")) {
      if (input.value) params.set(input.name, input.value);
    }
    function show(record) {
      rows.insertBefore(row(record), rows.firstChild);
      while (rows.childElementCount > MAX_ROWS) rows.removeChild(rows.lastChild);
    }
    const source = new EventSource(PREFIX + "/decisions/stream?" + params.toString());
    source.addEventListener("open", function () { state.textContent = "live"; });
    source.addEventListener("error", function () { state.textContent = "reconnecting"; });
    source.addEventListener("decision", function (event) {
      const record = JSON.parse(event.data);
      if (paused) {
        if (held.length < MAX_HELD) held.push(record);
        heldCount.textContent = held.length + " new while paused";
        return;
      }
      show(record);
    });
    pause.addEventListener("click", function () {
      paused = !paused;
      pause.textContent = paused ? "Resume" : "Pause";
      pause.setAttribute("aria-pressed", String(paused));
      state.textContent = paused ? "paused" : "live";
      if (!paused) {
        for (const record of held.splice(0)) show(record);
        heldCount.textContent = "";
      }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    watchInbox();
    watchDecisions();
    copyButtons();
  });
})();
