// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// healthcheck passes on a 2xx answer only: not on an error status, not
// through a redirect (a probe answers itself), and a URL that is not
// http(s) of a host is a usage error.
func TestHealthcheck(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			w.Write([]byte(`{"status":"ok"}`)) //nolint:errcheck
		case "/moved":
			http.Redirect(w, r, "/readyz", http.StatusFound)
		default:
			http.Error(w, "not ready", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	for _, c := range []struct {
		path string
		code int
		out  string
	}{{"/readyz", 0, "200 OK"}, {"/down", 1, "503"}, {"/moved", 1, "302"}} {
		r := runCLI(t, nil, "", "healthcheck", "--url", srv.URL+c.path)
		if r.code != c.code || !strings.Contains(r.stdout+r.stderr, c.out) {
			t.Errorf("healthcheck %s: %+v; want exit %d with %q", c.path, r, c.code, c.out)
		}
	}
	for _, u := range []string{"file:///etc/passwd", "http://", "127.0.0.1:8080/readyz"} {
		if r := runCLI(t, nil, "", "healthcheck", "--url", u); r.code != 2 || !strings.Contains(r.stderr, "--url") {
			t.Errorf("healthcheck --url %s: %+v; want a usage error", u, r)
		}
	}
}
