// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"errors"
	"strconv"
	"time"

	"github.com/spf13/pflag"
)

// Flag values that refuse negatives while the command line is parsed,
// before any command body runs: cobra reports the flag, the value and the
// rule (exit 2).

var errNegative = errors.New("must not be negative")

type durationValue struct{ d *time.Duration }

func (v durationValue) String() string {
	if v.d == nil || *v.d == 0 {
		return "0" // what pflag takes for "no default" in help
	}
	return v.d.String()
}
func (v durationValue) Type() string { return "duration" }
func (v durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("want a duration such as 1.5s or 2m")
	}
	if d < 0 {
		return errNegative
	}
	*v.d = d
	return nil
}

// durationFlag is DurationVar for a duration that may not be negative.
func durationFlag(fl *pflag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fl.Var(durationValue{p}, name, usage)
}

type countValue struct{ n *int }

func (v countValue) String() string {
	if v.n == nil {
		return "0"
	}
	return strconv.Itoa(*v.n)
}
func (v countValue) Type() string { return "int" }
func (v countValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("want a whole number")
	}
	if n < 0 {
		return errNegative
	}
	*v.n = n
	return nil
}

// countFlag is IntVar for a count that may not be negative.
func countFlag(fl *pflag.FlagSet, p *int, name string, def int, usage string) {
	*p = def
	fl.Var(countValue{p}, name, usage)
}
