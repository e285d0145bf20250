package dashboard

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestDashboardHandler(t *testing.T) {
	h := Handler()
	for _, tc := range []struct {
		path, wantType, wantBody string
		wantCode                 int
	}{
		{"/ui", "text/html", `<script src="/ui/app.js"`, http.StatusOK},
		{"/ui/", "text/html", `<script src="/ui/app.js"`, http.StatusOK},
		{"/ui/app.js", "text/javascript", "/debug/hub", http.StatusOK},
		{"/ui/app.js", "text/javascript", "/debug/routes", http.StatusOK},
		{"/ui/", "text/html", `<tbody id="route-rows">`, http.StatusOK},
		{"/ui/app.css", "text/css", "#status", http.StatusOK},
		{"/ui/nothing.js", "", "", http.StatusNotFound},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
		if rec.Code != tc.wantCode || !strings.HasPrefix(rec.Header().Get("Content-Type"), tc.wantType) ||
			!strings.Contains(rec.Body.String(), tc.wantBody) {
			t.Errorf("GET %s: %d %q, want %d %q containing %q", tc.path, rec.Code, rec.Header().Get("Content-Type"), tc.wantCode, tc.wantType, tc.wantBody)
		}
		if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "connect-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q", tc.path, csp)
		}
	}
}

// The page stays small: it is served on admin ports with no internet, and read by people.
func TestDashboardSize(t *testing.T) {
	total := 0
	err := fs.WalkDir(files, "ui", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(files, path)
		total += len(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if total > 40<<10 {
		t.Errorf("the dashboard is %d bytes, over 40 KiB", total)
	}
}
