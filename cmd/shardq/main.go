// SPDX-License-Identifier: Apache-2.0

// Command shardq publishes, migrates and administers a shardq queue.
// Its commands live in internal/cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/shardq/shardq/cmd/shardq/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv,
		StderrTerminal: cli.IsTerminal(os.Stderr)})
	stop()
	os.Exit(code)
}
