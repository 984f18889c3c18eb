// The chat page of cactus-gguf serve registers no service worker. This one is served at /sw.js
// for a browser that still holds the one of llama-server's web UI from this address (after
// llama-server was replaced by this server): when the browser checks that worker for an
// update, it gets this one, which clears the old UI's caches, unregisters itself and reloads
// the open pages, so they show this server's page.
self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => {
  event.waitUntil((async () => {
    const names = await caches.keys();
    await Promise.all(names.map((name) => caches.delete(name)));
    await self.registration.unregister();
    const pages = await self.clients.matchAll({ type: "window" });
    pages.forEach((page) => page.navigate(page.url));
  })());
});
