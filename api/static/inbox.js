// Refresh the list when a request changes elsewhere; the forms work without this.
// A file, not an inline script: the Content-Security-Policy allows script from 'self' only.
(() => {
  const list = () => document.getElementById("requests");
  if (!list()) return;
  let timer = null;
  const refresh = async () => {
    const page = await fetch("/", { credentials: "same-origin" });
    if (!page.ok) return;
    const doc = new DOMParser().parseFromString(await page.text(), "text/html");
    const fresh = doc.getElementById("requests");
    if (fresh) list().replaceWith(fresh);
  };
  // The inbox's own stream: the API's /api/events takes a bearer token, never the cookie.
  new EventSource("/events").addEventListener("request", () => {
    clearTimeout(timer);
    timer = setTimeout(refresh, 150);
  });
})();
