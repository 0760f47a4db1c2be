// Keep a page current when requests change elsewhere; every page works without this.
// A file, not an inline script: the Content-Security-Policy allows script from 'self' only.
(() => {
  const live = () => document.querySelector("[data-live]");
  const page = document.querySelector("[data-request-id][data-status]");
  if (!live() && !page) return;
  let timer = null;
  // The user's work in progress (a ticked box, a half-typed reason) is never thrown away:
  // then the page says it changed, and the user reloads when ready.
  const busy = () =>
    document.querySelector("input[type=checkbox]:checked") !== null ||
    [...document.querySelectorAll("input[type=text], textarea")].some(
      (field) => field.value !== field.defaultValue,
    );
  const notice = () => {
    if (document.getElementById("changed")) return;
    const note = document.createElement("p");
    note.id = "changed";
    note.className = "flash";
    note.setAttribute("role", "status");
    note.textContent = "Requests changed since this page was loaded. ";
    const link = document.createElement("a");
    link.href = location.href;
    link.textContent = "Reload";
    note.append(link);
    document.body.prepend(note);
  };
  const refresh = async () => {
    if (page || busy()) return notice();
    const fresh = await fetch(location.href, { credentials: "same-origin" });
    if (!fresh.ok) return;
    const doc = new DOMParser().parseFromString(await fresh.text(), "text/html");
    const list = doc.querySelector("[data-live]");
    if (busy()) return notice(); // the user started something while the page was fetched
    if (list) live().replaceWith(list);
  };
  // The inbox's own stream: the API's /api/events takes a bearer token, never the cookie.
  new EventSource("/events").addEventListener("request", (event) => {
    if (page && !event.data.includes(page.dataset.requestId)) return;
    clearTimeout(timer);
    timer = setTimeout(refresh, 150);
  });
})();
