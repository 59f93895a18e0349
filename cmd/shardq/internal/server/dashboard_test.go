// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"context"
	"image/png"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/testdb"
)

// browser starts a headless Debian Chromium for one test. Without it the
// test fails in CI (scripts/test installs it) and is skipped elsewhere.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("chromium is not installed (scripts/test installs Debian's package): %v", err)
		}
		t.Skipf("chromium is not installed (apt-get install chromium; scripts/test does): %v", err)
	}
	// The flags keep Chromium off the network this machine does not have.
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()), chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.WindowSize(1280, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(func() { cancelBrowser(); cancelAlloc() })
	// The first run starts the browser, which lives as long as ctx: the
	// bound on each step comes from a context derived after it.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(cancelTimeout)
	return ctx
}

// load runs trigger (a navigation, a click on a link or a form's button)
// and waits for the page it loads.
func load(ctx context.Context, trigger chromedp.Action[chromedp.Void]) error {
	_, err := chromedp.Run(ctx, chromedp.WaitEvent(page.LoadEventFired, nil, trigger))
	return err
}

// The dashboard in a real browser: sign-in, the tenant page, the topic
// page with live offsets, members, leases, dead letters, the lag chart and
// the message browser; requeue and pause from the page.
func TestDashboardInBrowser(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{maxAttempts: 1})
		admin, _ := h.token(RoleAdmin, 0, "acme", "beta")
		publisher, _ := h.token(RolePublish, 0, "acme")
		ctx := context.Background()
		h.must(200, "POST", topicPath+"/messages", admin, `{"messages":[{"key":"k","id":"m1","payload":"one"},{"key":"k","id":"m2","payload":"two"},{"key":"k","id":"m3","payload":"three"},{"key":"j","id":"n1","payload":"four"}]}`)
		got := received(h.must(200, "POST", groupPath+"/receive", admin, `{"key":"k","max":1}`))
		h.must(200, "POST", groupPath+"/nack", admin, map[string]any{"receipts": receipts(got), "reason": "boom"}) // its one attempt: dead-lettered
		got = received(h.must(200, "POST", groupPath+"/receive", admin, `{"key":"k","max":1}`))
		h.must(200, "POST", groupPath+"/ack", admin, map[string]any{"receipts": receipts(got)})
		received(h.must(200, "POST", groupPath+"/receive", admin, `{"key":"j","max":1,"visibility":600}`)) // in flight: j's lease
		if err := drv.Heartbeat(ctx, driver.GroupScope{Tenants: []string{"acme"}, Topic: "orders", ConsumerGroup: "billing"}, "worker-1#a", h.clock.Now()); err != nil {
			t.Fatal(err)
		}
		half := &driver.HalfMessage{InsertMessage: driver.InsertMessage{Tenant: "acme", Topic: "orders", PartitionKey: "k", ID: "half-1", Payload: []byte("h"),
			CreatedAt: h.clock.Now()}, ProducerGroup: "checkout", NextCheckAt: h.clock.Now().Add(time.Minute)}
		if err := drv.InsertHalf(ctx, half); err != nil {
			t.Fatal(err)
		}

		b := browser(t)
		text := func(sel string) string {
			t.Helper()
			ctx, cancel := context.WithTimeout(b, 10*time.Second)
			defer cancel()
			s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
			if err != nil {
				loc, _ := chromedp.Run(b, chromedp.Location())
				body, _ := chromedp.Run(b, chromedp.Text(chromedp.CSS("body")))
				t.Fatalf("read %s: %v (page %s: %.500s)", sel, err, loc, body)
			}
			return s
		}
		contains := func(sel string, want ...string) {
			t.Helper()
			s := text(sel)
			for _, w := range want {
				if !strings.Contains(s, w) {
					t.Fatalf("%s does not show %q:\n%s", sel, w, s)
				}
			}
		}
		signIn := func(tok string) error {
			if err := load(b, chromedp.Navigate(h.http.URL+"/")); err != nil {
				return err
			}
			if err := chromedp.Do(b, chromedp.SendKeys(chromedp.CSS("#tenant"), "acme"), chromedp.SendKeys(chromedp.CSS("#token"), tok)); err != nil {
				return err
			}
			return load(b, chromedp.Click(chromedp.CSS("#signin")))
		}
		screenshot := func(name string) {
			t.Helper()
			shot, err := chromedp.Run(b, chromedp.FullScreenshot(100))
			if err != nil {
				t.Fatal(err)
			}
			checkScreenshot(t, name, shot)
		}

		// A publish token is refused; an admin token signs in.
		if err := signIn(publisher); err != nil {
			t.Fatal(err)
		}
		contains("#error", "the dashboard needs an admin token")
		if err := signIn(admin); err != nil {
			t.Fatal(err)
		}
		contains("#topics", "orders")
		contains("#groups", "billing", "1 (1)") // one member, live
		contains("#halves", "half-1", "checkout")
		screenshot("tenant")

		// The topic page: offsets and lag per partition, members, leases,
		// dead letters, messages, and the chart once it has sampled.
		if err := load(b, chromedp.Click(chromedp.CSS(`#topics a`))); err != nil {
			t.Fatal(err)
		}
		contains("#offsets", "k", "j", "billing")
		contains("#members", "worker-1#a")
		contains("#leases", "test#") // the receive in flight holds j
		contains("#dead-letters", "m1", "boom")
		contains("#messages", "m1", "m2", "m3", "n1")
		// The chart's script fetched /offsets with the session.
		if err := chromedp.Do(b, chromedp.WaitVisible(chromedp.CSS("#lag-legend span"))); err != nil {
			t.Fatal(err)
		}
		contains("#lag-legend", "billing: 2")
		screenshot("topic")

		// Requeue the dead letter from the page: it is delivered again.
		if err := load(b, chromedp.Click(chromedp.CSS(`#dead-letters button.requeue`))); err != nil {
			t.Fatal(err)
		}
		contains("#notice", "requeued m1")
		contains("#dead-letters", "None.")
		h.must(200, "POST", groupPath+"/ack", admin, map[string]any{"receipts": receipts(received(h.must(200, "POST", groupPath+"/receive", admin, `{"key":"k","max":1}`)))}) // m3
		if again := received(h.must(200, "POST", groupPath+"/receive", admin, `{"key":"k"}`)); len(again) != 1 || again[0]["id"] != "m1" {
			t.Fatalf("after the dashboard's requeue: %v, want m1", again)
		}

		// Pause the group from the page.
		if err := load(b, chromedp.Click(chromedp.CSS(`#groups button`))); err != nil {
			t.Fatal(err)
		}
		contains("#notice", "paused billing")
		contains("#groups", "paused")

		// The header opens another tenant of the token; a tenant the
		// token does not have sends back to the sign-in.
		if err := chromedp.Do(b, chromedp.SendKeys(chromedp.CSS("#switch-tenant"), "beta")); err != nil {
			t.Fatal(err)
		}
		if err := load(b, chromedp.Click(chromedp.CSS("#switch"))); err != nil {
			t.Fatal(err)
		}
		contains("h1", "Tenant beta")
		contains("#topics", "No topics yet.")
		if err := chromedp.Do(b, chromedp.SendKeys(chromedp.CSS("#switch-tenant"), "gamma")); err != nil {
			t.Fatal(err)
		}
		if err := load(b, chromedp.Click(chromedp.CSS("#switch"))); err != nil {
			t.Fatal(err)
		}
		contains("#error", "sign in with an admin token of that tenant")
		if err := signIn(admin); err != nil {
			t.Fatal(err)
		}
		if err := load(b, chromedp.Click(chromedp.CSS(`#topics a`))); err != nil {
			t.Fatal(err)
		}

		// The message browser shows one partition.
		if err := chromedp.Do(b, chromedp.SendKeys(chromedp.CSS(`form.browse input[name="key"]`), "j")); err != nil {
			t.Fatal(err)
		}
		if err := load(b, chromedp.Submit(chromedp.CSS(`form.browse input[name="key"]`))); err != nil {
			t.Fatal(err)
		}
		if s := text("#messages"); !strings.Contains(s, "n1") || strings.Contains(s, "m2") {
			t.Fatalf("browsing key j shows:\n%s", s)
		}
	})
}

// checkScreenshot decodes a page's screenshot, checks that it is a drawn
// page (not one colour), logs where it is, and keeps it in
// $SHARDQ_SCREENSHOT_DIR when set (docs/dashboard.png comes from there).
func checkScreenshot(t *testing.T, name string, shot []byte) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatalf("%s screenshot: %v", name, err)
	}
	bounds := img.Bounds()
	first, colours := img.At(bounds.Min.X, bounds.Min.Y), 0
	for y := bounds.Min.Y; y < bounds.Max.Y && colours == 0; y += 7 {
		for x := bounds.Min.X; x < bounds.Max.X; x += 7 {
			if img.At(x, y) != first {
				colours++
				break
			}
		}
	}
	if bounds.Dx() < 600 || bounds.Dy() < 300 || colours == 0 {
		t.Fatalf("%s screenshot: %v, one colour: %v", name, bounds, colours == 0)
	}
	dir := os.Getenv("SHARDQ_SCREENSHOT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	path := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"_"+name+".png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s page screenshot: %s (%dx%d, %d bytes)", name, path, bounds.Dx(), bounds.Dy(), len(shot))
}

// With SHARDQ_TENANTS the sign-in page offers the served tenants, and the
// tenant switch refuses an invalid name before anything else.
func TestSignInPageOffersServedTenants(t *testing.T) {
	h := newHarness(t, testdb.Migrated(t, testdb.SQLite(t)), harnessOptions{tenants: []string{"acme", "beta"}})
	res, err := h.http.Client().Get(h.http.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || res.StatusCode != 200 || !strings.Contains(string(body), `<option value="acme">`) || !strings.Contains(string(body), `<option value="beta">`) {
		t.Fatalf("sign-in page: %d %v\n%s", res.StatusCode, err, body)
	}
	noRedirect := *h.http.Client()
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	res, err = noRedirect.Get(h.http.URL + "/ui/?tenant=" + url.QueryEscape("a\x00b"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if loc := res.Header.Get("Location"); res.StatusCode != http.StatusSeeOther || loc != "/?error=name" {
		t.Fatalf("switch to an invalid tenant: %d, Location %q", res.StatusCode, loc)
	}
}
