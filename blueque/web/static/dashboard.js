// Blueque dashboard: live refresh and actions, in plain JavaScript.
//
// Live refresh: every few seconds the page fetches its own URL and swaps each element marked
// data-live for the element with the same id in the fresh copy. That copy is HTML rendered by
// the server with every Redis value escaped; DOMParser never runs its scripts, and no string of
// data is ever assigned to innerHTML. Messages are set with textContent.
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
      const text = await response.text();
      const fresh = new DOMParser().parseFromString(text, "text/html");
      for (const old of document.querySelectorAll("[data-live]")) {
        const replacement = fresh.getElementById(old.id);
        if (replacement) {
          old.replaceWith(document.importNode(replacement, true));
        }
      }
      status.textContent = response.ok ? "live" : "Redis unreachable";
      status.className = response.ok ? "live" : "live down";
    } catch (error) {
      status.textContent = "dashboard unreachable";
      status.className = "live down";
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
    if (data.confirm && !window.confirm(data.confirm)) {
      return;
    }
    const payload = {};
    if (data.taskId) { payload.task_id = data.taskId; }
    if (data.queue) { payload.queue = data.queue; }
    if (data.status) { payload.status = data.status; }
    if (data.olderThan) { payload.older_than = parseFloat(data.olderThan); }
    const url = body.dataset.actionUrl.replace(/NAME$/, encodeURIComponent(data.action));
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
    } catch (error) {
      show("the dashboard could not be reached: " + error, false);
    }
    refresh();
  }

  document.addEventListener("click", function (event) {
    const button = event.target.closest("button[data-action]");
    if (button) {
      event.preventDefault();
      act(button);
    }
  });

  window.setInterval(refresh, refreshMs);
  document.addEventListener("visibilitychange", refresh);
})();
