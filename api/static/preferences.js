// The preference page: reads and saves the person's choices through /v1/preferences?token=.
// Only cells the person changed are sent, so untouched defaults stay defaults.
"use strict";
(function () {
  const CHANNELS = ["email", "sms", "push"];
  const token = new URLSearchParams(window.location.search).get("token") || "";
  const endpoint = "/v1/preferences?token=" + encodeURIComponent(token);
  const rows = document.getElementById("rows");
  const status = document.getElementById("status");
  const form = document.getElementById("preferences");
  let initial = {};

  function say(text, isError) {
    status.textContent = text;
    status.className = isError ? "error" : "";
  }

  function label(name) {
    return name === "*" ? "Everything else" : name.replace(/[_-]+/g, " ");
  }

  function render(data) {
    const required = new Set(data.categories.filter((c) => c.required).map((c) => c.name));
    initial = {};
    rows.replaceChildren();
    for (const [category, channels] of Object.entries(data.effective)) {
      const tr = document.createElement("tr");
      const th = document.createElement("th");
      th.scope = "row";
      th.textContent = label(category) + (required.has(category) ? " (required)" : "");
      tr.appendChild(th);
      for (const channel of CHANNELS) {
        const td = document.createElement("td");
        const box = document.createElement("input");
        box.type = "checkbox";
        box.name = channel + ":" + category;
        box.id = "pref-" + category + "-" + channel;
        box.checked = Boolean(channels[channel]);
        box.disabled = required.has(category);
        box.setAttribute("aria-label", label(category) + " by " + channel);
        initial[box.name] = box.checked;
        td.appendChild(box);
        tr.appendChild(td);
      }
      rows.appendChild(tr);
    }
  }

  async function load() {
    const response = await fetch(endpoint, { headers: { Accept: "application/json" } });
    if (!response.ok) {
      // The API's own words: an expired link (403) is not a busy moment (429, try again).
      let message = "This link is invalid or has expired.";
      try { message = (await response.json()).error.message || message; } catch (e) { /* keep the default */ }
      rows.replaceChildren();
      say(message, true);
      return;
    }
    render(await response.json());
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const changes = [];
    for (const box of form.querySelectorAll("input[type=checkbox]")) {
      if (!box.disabled && box.checked !== initial[box.name]) {
        const [channel, ...rest] = box.name.split(":");
        changes.push({ channel: channel, category: rest.join(":"), opted_in: box.checked });
      }
    }
    if (changes.length === 0) {
      say("Nothing to save.", false);
      return;
    }
    say("Saving…", false);
    const response = await fetch(endpoint, {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify({ preferences: changes }),
    });
    if (!response.ok) {
      let message = "Could not save your choices.";
      try { message = (await response.json()).error.message || message; } catch (e) { /* keep the default */ }
      say(message, true);
      return;
    }
    render(await response.json());
    say("Saved", false);
  });

  load().catch(() => say("Could not load your preferences.", true));
})();
