// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/shardq/shardq"
)

// Flag values that refuse negatives while the command line is parsed,
// before any command body runs: cobra reports the flag, the value and the
// rule (exit 2).

var errNegative = errors.New("must not be negative")

// nonNegative is a flag value of type T that refuses negatives.
type nonNegative[T int | time.Duration] struct {
	p        *T
	typeName string
	parse    func(string) (T, error)
}

func (v nonNegative[T]) String() string {
	if v.p == nil || *v.p == 0 {
		return "0" // what pflag takes for "no default" in help
	}
	if d, ok := any(*v.p).(time.Duration); ok {
		return d.String()
	}
	return strconv.Itoa(int(*v.p))
}

func (v nonNegative[T]) Type() string { return v.typeName }

func (v nonNegative[T]) Set(s string) error {
	n, err := v.parse(s)
	if err != nil {
		return err
	}
	if n < 0 {
		return errNegative
	}
	*v.p = n
	return nil
}

// durationFlag is DurationVar for a duration that may not be negative.
func durationFlag(fl *pflag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fl.Var(nonNegative[time.Duration]{p, "duration", parseDuration}, name, usage)
}

// parseDuration reads a flag's duration, saying what it wants.
func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errors.New("want a duration such as 1.5s or 2m")
	}
	return d, nil
}

// countFlag is IntVar for a count that may not be negative.
func countFlag(fl *pflag.FlagSet, p *int, name string, def int, usage string) {
	*p = def
	fl.Var(nonNegative[int]{p, "int", func(s string) (int, error) {
		n, err := strconv.Atoi(s)
		if err != nil {
			return 0, errors.New("want a whole number")
		}
		return n, nil
	}}, name, usage)
}

// startFlag is --start: earliest (the default) or latest.
type startFlag shardq.StartPosition

func (f *startFlag) String() string { return shardq.StartPosition(*f).String() }
func (f *startFlag) Type() string   { return "earliest|latest" }
func (f *startFlag) Set(s string) error {
	p, err := shardq.ParseStartPosition(s)
	*f = startFlag(p)
	return err
}

// oneOf accepts exactly one argument among choices, and says which they
// are when it gets another count or value (cobra's own message, "accepts 1
// arg(s), received 0", names none).
func oneOf(what string, choices ...string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		list := strings.Join(choices, ", ")
		switch {
		case len(args) != 1:
			return usagef("want one %s (%s), got %d arguments", what, list, len(args))
		case !slices.Contains(choices, args[0]):
			return usagef("%s %q: want one of %s", what, args[0], list)
		}
		return nil
	}
}

// positiveDurationFlag is durationFlag for a setting whose zero would only
// mean "the default": a 0 given on the command line is refused instead of
// silently becoming the default.
func positiveDurationFlag(fl *pflag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fl.Var(positive{nonNegative[time.Duration]{p, "duration", parseDuration}, def}, name, usage)
}

// positive refuses 0 as well as negatives; def is named in the error.
type positive struct {
	nonNegative[time.Duration]
	def time.Duration
}

func (v positive) Set(s string) error {
	if err := v.nonNegative.Set(s); err != nil {
		return err
	}
	if *v.p == 0 {
		return fmt.Errorf("must be positive (omit the flag for the default, %s)", v.def)
	}
	return nil
}

// A flag that takes one value, given twice, is a usage error: pflag would
// keep the last value silently (`--role publish --role consume` was one
// role). Repeatable flags (pflag.SliceValue: StringArray, StringSlice)
// stay repeatable.

// givenTwiceError is what a single-valued flag's second Set returns.
type givenTwiceError struct{ flag string }

func (e *givenTwiceError) Error() string {
	return fmt.Sprintf("--%s given twice (it takes one value)", e.flag)
}

// onceValue lets its flag be set once per command line.
type onceValue struct {
	pflag.Value
	flag string
	set  bool
}

func (v *onceValue) Set(s string) error {
	if v.set {
		return &givenTwiceError{v.flag}
	}
	v.set = true
	return v.Value.Set(s)
}

// singleValued makes every single-valued flag of cmd and its subcommands
// (persistent ones included) refuse a second value. Run it once the
// command tree is built, before parsing; flags are shared by pointer, so
// a persistent flag is wrapped once, where it is defined.
func singleValued(cmd *cobra.Command) {
	wrap := func(f *pflag.Flag) {
		switch f.Value.(type) {
		case pflag.SliceValue, *onceValue:
			return
		}
		if f.DefValue == "0s" {
			// pflag's help leaves a zero default out only for its own
			// duration type; keep it out for the wrapped one too.
			f.DefValue = "0"
		}
		f.Value = &onceValue{Value: f.Value, flag: f.Name}
	}
	cmd.Flags().VisitAll(wrap)
	cmd.PersistentFlags().VisitAll(wrap)
	for _, sub := range cmd.Commands() {
		singleValued(sub)
	}
}

// flagError makes cobra's parse errors usage errors (exit 2), saying a
// repeated flag in so many words rather than as pflag's "invalid
// argument".
func flagError(_ *cobra.Command, err error) error {
	var twice *givenTwiceError
	if errors.As(err, &twice) {
		return usageError{twice}
	}
	return usageError{err}
}

// Every flag also takes its value from the environment, as SHARDQ_ and
// its name in upper case with underscores (--idle-exit: SHARDQ_IDLE_EXIT),
// for containers and service managers; the command line wins. --help
// names each variable. A value the flag refuses is a usage error naming
// the variable.
//
// Except the flags marked commandLineOnly: those that make a command
// act instead of preview, delete, overwrite a file, pass a safety check
// or widen a command to every tenant or message. A variable exported for
// one command stays set for the next, so one stray export would turn
// every preview into an execution; such a variable is ignored with a
// warning instead (refusing the command would break a script over a
// variable it never meant to use).

// commandLineOnly is the flag annotation that keeps a flag's variable
// from setting it (withEnv).
const commandLineOnly = "shardq_command_line_only"

// cmdLineOnly marks flags of fl, which must exist, as commandLineOnly.
func cmdLineOnly(fl *pflag.FlagSet, names ...string) {
	for _, n := range names {
		if err := fl.SetAnnotation(n, commandLineOnly, []string{"true"}); err != nil {
			panic(fmt.Sprintf("cmdLineOnly: %v", err)) // a typo in the command tree
		}
	}
}

// isCmdLineOnly reports whether f is marked commandLineOnly.
func isCmdLineOnly(f *pflag.Flag) bool {
	_, ok := f.Annotations[commandLineOnly]
	return ok
}

// readsEnv names the flags that read their variable themselves, to name
// it in their errors and keep a password out of --help, and --tenants (of
// bench and chaos), whose variable SHARDQ_TENANTS is the served tenant
// list of every command instead.
var readsEnv = map[string]bool{"dsn": true, "feed-dsn": true, "tenants": true}

// envName is the environment variable of flag name.
func envName(name string) string {
	return "SHARDQ_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// envFlags names the variable in every flag's help. Run it once the
// command tree is built.
func envFlags(cmd *cobra.Command) {
	note := func(f *pflag.Flag) {
		switch {
		case f.Name == "help", readsEnv[f.Name], strings.Contains(f.Usage, "$"+envName(f.Name)), strings.HasSuffix(f.Usage, cmdLineOnlyNote):
		case isCmdLineOnly(f):
			f.Usage += cmdLineOnlyNote
		default:
			f.Usage += " [$" + envName(f.Name) + "]"
		}
	}
	cmd.LocalNonPersistentFlags().VisitAll(note)
	cmd.PersistentFlags().VisitAll(note)
	for _, sub := range cmd.Commands() {
		envFlags(sub)
	}
}

// cmdLineOnlyNote ends the help of a commandLineOnly flag.
const cmdLineOnlyNote = " [command line only]"

// envArgs is what withEnv made of the environment.
type envArgs struct {
	args []string // the command line with the variables' flags added
	// set names the flags a variable set; ignored the commandLineOnly
	// flags whose variable is set (and so ignored).
	set, ignored []string
}

// withEnv is args with --flag=value added for each flag of the command
// args name that they do not give and whose variable is set: before
// parsing, so that a required flag is satisfied and a flag given on the
// command line wins. A commandLineOnly flag's variable is never read into
// a flag; when it is set, it is listed to be warned about.
func withEnv(root *cobra.Command, args []string, getenv func(string) string) envArgs {
	cmd, _, err := root.Find(args)
	if err != nil {
		return envArgs{args: args} // cobra reports the unknown command
	}
	given := map[string]bool{}
	for _, a := range args {
		if a == "--" {
			break
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case strings.HasPrefix(a, "--"):
			given[name] = true
		case strings.HasPrefix(a, "-") && len(a) > 1:
			for _, short := range strings.TrimPrefix(a, "-") {
				if f := cmd.Flags().ShorthandLookup(string(short)); f != nil {
					given[f.Name] = true
				}
			}
		}
	}
	var extra []string
	var e envArgs
	visit := func(f *pflag.Flag) {
		if f.Name == "help" || readsEnv[f.Name] {
			return
		}
		v := getenv(envName(f.Name))
		switch {
		case v == "":
		case isCmdLineOnly(f):
			// Warned about even when the command line gives the flag: the
			// variable does nothing anywhere, and should go.
			if !slices.Contains(e.ignored, f.Name) {
				e.ignored = append(e.ignored, f.Name)
			}
		case !given[f.Name]:
			given[f.Name] = true
			extra = append(extra, "--"+f.Name+"="+v)
			e.set = append(e.set, f.Name)
		}
	}
	cmd.Flags().VisitAll(visit)
	cmd.InheritedFlags().VisitAll(visit)
	e.args = args
	if len(extra) == 0 {
		return e
	}
	out := slices.Clone(args)
	for i, a := range args {
		if a == "--" { // positional arguments follow: flags go before them
			e.args = slices.Concat(out[:i], extra, out[i:])
			return e
		}
	}
	e.args = append(out, extra...)
	return e
}

// fromEnv says which variable set a flag an error names, when one did.
func fromEnv(err error, names []string) error {
	for _, n := range names {
		if strings.Contains(err.Error(), `"--`+n+`"`) || strings.Contains(err.Error(), "--"+n+" ") {
			return fmt.Errorf("%w (the value of $%s)", err, envName(n))
		}
	}
	return err
}
