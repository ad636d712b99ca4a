// Blueque dashboard: live refresh and actions, in plain JavaScript.
//
// Live refresh: every few seconds the page fetches its own URL and swaps each element marked
// data-live for the element with the same id in the fresh copy; when the fresh copy is another
// kind of page (the task is gone, or Redis answers again after an error page) its whole <main>
// is taken. That copy is HTML rendered by the server with every Redis value escaped; DOMParser
// never runs its scripts, and no string of data is ever assigned to innerHTML. Messages are set
// with textContent.
"use strict";

(function () {
  const body = document.body;
  const refreshMs = Math.max(500, parseFloat(body.dataset.refresh || "2") * 1000);
  const status = document.getElementById("live-status");
  const message = document.getElementById("message");
  const tokenInput = document.getElementById("token");
  let inFlight = false;

  function show(text, ok) {
    message.textContent = text;
    message.className = "message " + (ok ? "ok" : "bad");
    message.hidden = false;
  }

  // A log tail (pre[data-tail]) shows its newest lines: scrolled to its end, and kept there
  // across refreshes unless the reader scrolled up to read older lines.
  function readTails() {
    const tails = {};
    for (const pre of document.querySelectorAll("pre[data-tail]")) {
      const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      tails[pre.id] = atEnd ? null : pre.scrollTop;
    }
    return tails;
  }

  function keepTails(tails) {
    for (const pre of document.querySelectorAll("pre[data-tail]")) {
      const kept = tails[pre.id];
      pre.scrollTop = (kept === undefined || kept === null) ? pre.scrollHeight : kept;
    }
  }

  // Bulk select: the ticked rows (input.select-task) outlive each refresh, by task id.
  function selectedIds() {
    return Array.from(document.querySelectorAll("input.select-task:checked"),
                      function (box) { return box.value; });
  }

  function countSelected() {
    const counter = document.getElementById("selected-count");
    if (!counter) { return; }
    const boxes = document.querySelectorAll("input.select-task");
    const ticked = selectedIds().length;
    counter.textContent = ticked ? ticked + " selected" : "none selected";
    const all = document.getElementById("select-all");
    if (all) { all.checked = boxes.length > 0 && ticked === boxes.length; }
  }

  function keepSelection(ids) {
    const kept = new Set(ids);
    for (const box of document.querySelectorAll("input.select-task")) {
      box.checked = kept.has(box.value);
    }
    countSelected();
  }

  function setStatus(text, ok) {
    status.textContent = text;
    status.className = ok ? "live" : "live down";
  }

  async function refresh() {
    if (inFlight || document.hidden) {
      return;
    }
    inFlight = true;
    try {
      const response = await fetch(window.location.href, {
        headers: { "X-Blueque-Live": "1" },
        credentials: "same-origin",
        cache: "no-store",
      });
      if (response.status === 503) {
        // Redis is away: keep what the page shows (it says so) until it answers again
        setStatus("Redis unreachable", false);
        return;
      }
      const text = await response.text();
      const fresh = new DOMParser().parseFromString(text, "text/html");
      if (fresh.body.dataset.page !== body.dataset.page) {
        // another kind of page: the task was deleted (404), or Redis is back after an error
        // page. Take the fresh page's whole content (server-rendered, escaped; never run).
        const main = fresh.querySelector("main");
        if (main) {
          document.querySelector("main").replaceWith(document.importNode(main, true));
          document.title = fresh.title;
          body.dataset.page = fresh.body.dataset.page;
        }
      }
      const tails = readTails();
      const selected = selectedIds();
      for (const old of document.querySelectorAll("[data-live]")) {
        const replacement = fresh.getElementById(old.id);
        if (replacement) {
          old.replaceWith(document.importNode(replacement, true));
        }
      }
      keepTails(tails);
      keepSelection(selected);
      if (response.ok || response.status === 404) {
        setStatus("live", true);
      } else {
        setStatus("dashboard error (HTTP " + response.status + ")", false);
      }
    } catch (error) {
      setStatus("dashboard unreachable", false);
    } finally {
      inFlight = false;
    }
  }

  if (tokenInput) {
    tokenInput.value = sessionStorage.getItem("blueque-token") || "";
    tokenInput.addEventListener("input", function () {
      sessionStorage.setItem("blueque-token", tokenInput.value);
    });
  }

  async function act(button) {
    const data = button.dataset;
    const payload = {};
    let bulk = null;
    if (data.bulk) {  // a bulk action: the ticked tasks, after a confirmation naming how many
      bulk = selectedIds();
      if (!bulk.length) {
        show("select tasks first (the boxes at the left of each row)", false);
        return;
      }
      payload.task_ids = bulk;
    }
    if (data.taskId) { payload.task_id = data.taskId; }
    if (data.queue) { payload.queue = data.queue; }
    if (data.status) { payload.status = data.status; }
    if (data.olderThan) { payload.older_than = parseFloat(data.olderThan); }
    // a button in a form[data-action-form] also sends the form's fields (purge: its age)
    const form = button.closest("form[data-action-form]");
    if (form) {
      for (const field of form.elements) {
        if (field.name) { payload[field.name] = field.value.trim(); }
      }
    }
    // "{older_than}" in a confirmation is the field's value, as text (never as HTML)
    const question = (data.confirm || "").replace(/\{(\w+)\}/g, function (whole, name) {
      if (name === "n" && bulk) { return String(bulk.length); }
      return Object.prototype.hasOwnProperty.call(payload, name) ? String(payload[name]) : whole;
    });
    if (question && !window.confirm(question)) {
      return;
    }
    const url = body.dataset.actionUrl.replace(/NAME$/, encodeURIComponent(data.bulk || data.action));
    try {
      const response = await fetch(url, {
        method: "POST",
        credentials: "same-origin",
        headers: {
          "Content-Type": "application/json",
          "X-Blueque-Token": tokenInput ? tokenInput.value : "",
        },
        body: JSON.stringify(payload),
      });
      let reply = {};
      try { reply = await response.json(); } catch (error) { reply = {}; }
      show(reply.message || ("HTTP " + response.status), response.ok && reply.ok);
      if (bulk && response.ok) { keepSelection([]); }
    } catch (error) {
      show("the dashboard could not be reached: " + error, false);
    }
    refresh();
  }

  document.addEventListener("change", function (event) {
    if (event.target.id === "select-all") {
      for (const box of document.querySelectorAll("input.select-task")) {
        box.checked = event.target.checked;
      }
    }
    if (event.target.matches("#select-all, input.select-task")) { countSelected(); }
  });

  document.addEventListener("click", function (event) {
    const button = event.target.closest("button[data-action], button[data-bulk]");
    if (button) {
      event.preventDefault();
      act(button);
    }
  });

  document.addEventListener("submit", function (event) {
    const form = event.target.closest("form[data-action-form]");
    if (form) {  // Enter in its field: the form's action, never a page load
      event.preventDefault();
      const button = form.querySelector("button[data-action]");
      if (button) { act(button); }
    }
  });

  keepTails({});
  window.setInterval(refresh, refreshMs);
  document.addEventListener("visibilitychange", refresh);
})();
