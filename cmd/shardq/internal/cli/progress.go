// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/term"
)

// IsTerminal reports whether f is a terminal. A character device is not
// enough: /dev/null is one.
func IsTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

// progress reports long work on a terminal: one line on stderr, rewritten
// at most every progressEvery, and a summary when the work ends. Where
// stderr is not a terminal (a pipe, a log file, a test) or the output is
// JSON, it says nothing.
type progress struct {
	w     io.Writer // nil: quiet
	what  string
	start time.Time
	last  time.Time
	n     int64
}

const progressEvery = 200 * time.Millisecond

func (a *app) progress(what string, asJSON bool) *progress {
	p := &progress{what: what, start: time.Now()}
	if a.env.StderrTerminal && !asJSON {
		p.w = a.env.Stderr
	}
	return p
}

// add counts n more done, redrawing the line when it is due.
func (p *progress) add(n int64) {
	p.n += n
	if p.w == nil {
		return
	}
	if now := time.Now(); now.Sub(p.last) >= progressEvery {
		p.last = now
		fmt.Fprintf(p.w, "\r%s: %d (%.0f/s)\x1b[K", p.what, p.n, float64(p.n)/now.Sub(p.start).Seconds())
	}
}

// done ends the progress line with a summary: what was done, in how long.
func (p *progress) done(summary string) {
	if p.w == nil {
		return
	}
	el := time.Since(p.start)
	rate := ""
	if p.n > 0 && el > 0 {
		rate = fmt.Sprintf(", %.0f/s", float64(p.n)/el.Seconds())
	}
	fmt.Fprintf(p.w, "\r%s in %s%s\x1b[K\n", summary, el.Round(time.Millisecond), rate)
}
