// Package dashboard is the hub's web dashboard: a page, served at /ui on the
// admin address, that polls the admin API's JSON (/debug/*) of the replica
// it comes from and shows replicas, clusters, topology, conflicts, services
// with routes, xDS clients and recent convergence. It is plain HTML, CSS and JavaScript
// embedded in the binary: no build step, nothing fetched from elsewhere.
package dashboard

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed ui
var files embed.FS

// contentSecurityPolicy lets the page load and fetch only from its own
// origin, and keeps it out of other sites' frames.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the dashboard at /ui and its assets under /ui/. The page
// holds no data: everything it shows it fetches from /debug/*, sending the
// admin token (Authorization: Bearer) when it was given one.
func Handler() http.Handler {
	ui, err := fs.Sub(files, "ui")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	assets := http.StripPrefix("/ui/", http.FileServerFS(ui))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		if r.URL.Path == "/ui" || r.URL.Path == "/ui/" {
			http.ServeFileFS(w, r, ui, "index.html")
			return
		}
		assets.ServeHTTP(w, r)
	})
}
