// Refreshes the dashboard's live parts: the server renders them, this only swaps them in.
(function () {
  "use strict";
  const status = () => document.getElementById("status");
  async function refresh() {
    try {
      const answer = await fetch("/dashboard/parts", { credentials: "same-origin", cache: "no-store" });
      if (!answer.ok) throw new Error("the daemon answered " + answer.status);
      const parts = await answer.json();
      for (const [id, html] of Object.entries(parts)) {
        const element = document.getElementById(id);
        if (element && element.innerHTML !== html) element.innerHTML = html;
      }
      document.body.classList.remove("stale");
    } catch (err) {
      document.body.classList.add("stale");
      const where = status();
      if (where) where.title = "not updated: " + err.message;
    }
  }
  setInterval(refresh, REFRESH_MS);
})();
