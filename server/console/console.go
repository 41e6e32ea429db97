// Package console is berthd's web console (docs/console.md): a page that
// logs in with a bearer token, lists the caller's sandboxes, creates and
// deletes them, opens a terminal in one (xterm.js over the WebSocket
// terminal, server/wsgate), browses its files with upload and download,
// and lists its execs with their exit codes.
//
// Its files are embedded into berthd: the page's own (static/*.html, .js,
// .css) and xterm.js with its fit addon, copied from npm by
// scripts/console-assets.sh into static/vendor. Nothing is loaded from
// anywhere else: the page calls berthd's API (Connect JSON) and WebSocket
// endpoints on its own origin, with the token in an Authorization header
// or the WebSocket's first message, never in a URL or a cookie.
package console

import (
	"embed"
	"io/fs"
	"net/http"
)

// Path is where the console is served.
const Path = "/console/"

//go:embed static
var static embed.FS

// Handler serves the console under Path; "/console" redirects there.
// Every answer forbids loading anything from another origin (its
// Content-Security-Policy), framing, and sniffing.
func Handler() http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree always has static/
	}
	files := http.StripPrefix(Path, http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/console" {
			http.Redirect(w, r, Path, http.StatusMovedPermanently)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "the console's files are read with GET", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' blob: data:; connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
