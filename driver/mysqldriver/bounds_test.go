// SPDX-License-Identifier: Apache-2.0

package mysqldriver

import (
	"testing"
	"time"
)

// A DSN's session bounds as LockBounds reports them: the shortest one set,
// quoted or not; all of them 0 is none (-1); anything else unknown (0);
// none named is the default.
func TestParamSeconds(t *testing.T) {
	const idle, wait = "idle_transaction_timeout", "wait_timeout"
	for _, c := range []struct {
		params map[string]string
		want   time.Duration
	}{
		{nil, 10 * time.Second},
		{map[string]string{idle: "2"}, 2 * time.Second},
		{map[string]string{idle: "'7'"}, 7 * time.Second},
		{map[string]string{idle: ` "7" `}, 7 * time.Second},
		{map[string]string{idle: "30", wait: "5"}, 5 * time.Second},
		{map[string]string{idle: "0", wait: "5"}, 5 * time.Second},
		{map[string]string{idle: "0"}, -1},
		{map[string]string{idle: "-3"}, 0},
		{map[string]string{idle: "1.5"}, 0},
		{map[string]string{idle: "99999999999999999999"}, 0},
		{map[string]string{idle: "9999999999"}, (1 << 31) * time.Second},
	} {
		if got := paramSeconds(c.params, 10, idle, wait); got != c.want {
			t.Errorf("paramSeconds(%v) = %s, want %s", c.params, got, c.want)
		}
	}
}

func FuzzParamSeconds(f *testing.F) {
	for _, s := range []string{"5", "'5'", "0", "-1", "x", "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		got := paramSeconds(map[string]string{"innodb_lock_wait_timeout": v}, 5, "innodb_lock_wait_timeout")
		if got < -1 || (got > 0 && got%time.Second != 0) || got > (1<<31)*time.Second {
			t.Fatalf("paramSeconds(%q) = %s", v, got)
		}
	})
}
