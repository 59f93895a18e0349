// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Through vtgate the idle count is vtgate's own statement count; a page
// that is not vtgate's /debug/vars is refused by name.
func TestVtgateStatements(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/debug/vars":
			w.Write([]byte(`{"VtgateApi": {"TotalCount": 4217, "TotalTime": 9, "Histograms": {"Execute.shardq.primary": {"500000": 3}}}, "Other": 1}`))
		case "/other":
			w.Write([]byte(`{"Other": 1}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	n, err := vtgateStatements(context.Background(), srv.URL+"/debug/vars")
	if err != nil || n != 4217 {
		t.Fatalf("vtgateStatements = %d, %v; want 4217", n, err)
	}
	for path, want := range map[string]string{"/other": "has no VtgateApi", "/missing": "404"} {
		if _, err := vtgateStatements(context.Background(), srv.URL+path); err == nil || !strings.Contains(err.Error(), want) ||
			!strings.Contains(err.Error(), "--vtgate-vars") {
			t.Errorf("%s: err %v, want one naming --vtgate-vars and %q", path, err, want)
		}
	}
}
