package hub

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// With --admin-token-file, everything on the admin address but the health
// checks needs the token; a new token in the file takes over without a
// restart, and a file spoiled meanwhile keeps the last good token.
func TestAdminTokenGuardsDebugAndMetrics(t *testing.T) {
	path := filepath.Join(t.TempDir(), "admin-token")
	write := func(tok string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("first-admin-token-0123")
	if _, err := newAdminToken(filepath.Join(t.TempDir(), "missing"), slog.New(slog.DiscardHandler)); err == nil {
		t.Error("a missing token file was accepted")
	}
	short := filepath.Join(t.TempDir(), "short")
	_ = os.WriteFile(short, []byte("short"), 0o600)
	if _, err := newAdminToken(short, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "shorter") {
		t.Errorf("a short token: %v, want refused", err)
	}
	tok, err := newAdminToken(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	s := startState(t)
	adm := &admin{state: s, metrics: prometheus.NewRegistry(), ready: func() error { return nil }, log: slog.New(slog.DiscardHandler), token: tok}
	srv := httptest.NewServer(adm.handler())
	defer srv.Close()
	status := func(path, token string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if got := status(p, ""); got != http.StatusOK {
			t.Errorf("%s without a token: %d, want 200 (probes)", p, got)
		}
	}
	for _, p := range []string{"/debug/clusters", "/debug/services", "/debug/networks", "/metrics"} {
		if got := status(p, ""); got != http.StatusUnauthorized {
			t.Errorf("%s without a token: %d, want 401", p, got)
		}
		if got := status(p, "wrong-token-0123456789"); got != http.StatusUnauthorized {
			t.Errorf("%s with a wrong token: %d, want 401", p, got)
		}
		if got := status(p, "first-admin-token-0123"); got != http.StatusOK {
			t.Errorf("%s with the token: %d, want 200", p, got)
		}
	}
	// Rotation: the new token is taken, the old one refused.
	write("second-admin-token-4567") // another size: seen as changed even within one mtime tick
	if got := status("/debug/clusters", "second-admin-token-4567"); got != http.StatusOK {
		t.Errorf("the rotated token: %d, want 200", got)
	}
	if got := status("/debug/clusters", "first-admin-token-0123"); got != http.StatusUnauthorized {
		t.Errorf("the old token after rotation: %d, want 401", got)
	}
	// A spoiled file: the last good token stays.
	write("")
	if got := status("/debug/clusters", "second-admin-token-4567"); got != http.StatusOK {
		t.Errorf("after the token file was emptied: %d with the last good token, want 200", got)
	}
}
