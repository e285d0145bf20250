package hub

import (
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/navemesh/nave/federation"
)

// minAdminTokenLen is the shortest admin token accepted (as for federation tokens).
const minAdminTokenLen = 16

// adminToken is the bearer token the admin API's /debug/* and /metrics
// require (--admin-token-file). It is read again when its file changes, so
// it rotates without a restart; a file that no longer holds a valid token
// is reported and the last good token stays.
type adminToken struct {
	path string
	log  *slog.Logger

	mu    sync.Mutex
	token string
	// stamp is the file's modification time and size when token was read.
	stamp fileStamp
}

type fileStamp struct {
	mod  time.Time
	size int64
}

func newAdminToken(path string, log *slog.Logger) (*adminToken, error) {
	a := &adminToken{path: path, log: log}
	tok, stamp, err := readAdminToken(path)
	if err != nil {
		return nil, fmt.Errorf("--admin-token-file: %w", err)
	}
	a.token, a.stamp = tok, stamp
	return a, nil
}

func readAdminToken(path string) (string, fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fileStamp{}, err
	}
	tok, err := federation.LoadToken(path)
	if err != nil {
		return "", fileStamp{}, err
	}
	if len(tok) < minAdminTokenLen {
		return "", fileStamp{}, fmt.Errorf("the admin token in %s is shorter than %d characters", path, minAdminTokenLen)
	}
	return tok, fileStamp{mod: fi.ModTime(), size: fi.Size()}, nil
}

// current returns the token, reading the file again when it changed.
func (a *adminToken) current() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if fi, err := os.Stat(a.path); err == nil && (fileStamp{mod: fi.ModTime(), size: fi.Size()}) != a.stamp {
		tok, stamp, err := readAdminToken(a.path)
		if err != nil {
			a.log.Error("the admin token file changed but holds no valid token; keeping the last good one", "file", a.path, "err", err)
			a.stamp = fileStamp{mod: fi.ModTime(), size: fi.Size()} // reported once per change
		} else {
			a.token, a.stamp = tok, stamp
			a.log.Info("admin token reloaded", "file", a.path)
		}
	}
	return a.token
}

// guarded reports whether the admin API requires the token for path:
// everything but the health checks, which probes must reach.
func guarded(path string) bool {
	return path != "/healthz" && path != "/readyz"
}

// require answers 401 to a request for a guarded path without the token.
func (a *adminToken) require(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if guarded(r.URL.Path) {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(a.current())) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="nave-hub"`)
				http.Error(w, "the admin API needs the admin token: Authorization: Bearer <token> (navectl --token-file)", http.StatusUnauthorized)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
