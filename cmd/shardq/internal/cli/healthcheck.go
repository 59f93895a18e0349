// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/spf13/cobra"

	"github.com/shardq/shardq"
)

// healthcheckCmd is `healthcheck`: a container's own probe of serve, for
// images without a shell or curl.
func (a *app) healthcheckCmd() *cobra.Command {
	var target string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "healthcheck [--url URL] [--timeout D]",
		Short: "Exit 0 when a serve's probe answers 2xx (an image's HEALTHCHECK)",
		Long: "GETs --url (serve's /readyz by default: the database reachable and migrated) and exits 0 on a 2xx answer,\n" +
			"1 otherwise, printing why; redirects are not followed. Only http and https URLs of a host are accepted\n" +
			"(another is a usage error, exit 2).",
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			u, err := url.Parse(target)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return &shardq.ValidationError{Field: "--url", Rule: fmt.Sprintf("%q: want an http or https URL with a host", target)}
			}
			if timeout <= 0 {
				return &shardq.ValidationError{Field: "--timeout", Rule: "must be positive"}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
			if err != nil {
				return err
			}
			// A probe answers itself: a redirect is not followed.
			client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			res, err := client.Do(req)
			if err != nil {
				return fmt.Errorf("healthcheck %s: %w", u.Redacted(), err)
			}
			defer res.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(res.Body, 512)) //nolint:errcheck // what the probe said, if anything
			if res.StatusCode/100 != 2 {
				return fmt.Errorf("healthcheck %s: %s %s", u.Redacted(), res.Status, body)
			}
			fmt.Fprintf(a.env.Stdout, "%s %s\n", res.Status, body)
			return nil
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&target, "url", "http://127.0.0.1:8080/readyz", "the probe to GET")
	fl.DurationVar(&timeout, "timeout", 3*time.Second, "how long to wait for the answer")
	return cmd
}
