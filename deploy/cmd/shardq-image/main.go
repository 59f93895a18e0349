// SPDX-License-Identifier: Apache-2.0

// Command shardq-image writes shardq's container image as a tarball for
// `docker load` or `podman load`, without a container engine:
//
//	CGO_ENABLED=0 GOOS=linux go build -trimpath -o shardq ./cmd/shardq
//	(cd deploy && GOWORK=off go run ./cmd/shardq-image --binary ../shardq --out ../shardq.tar --tag shardq:dev)
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/shardq/shardq/deploy/image"
)

func main() {
	var o image.Options
	var out, tag string
	flag.StringVar(&o.Binary, "binary", "", "a static linux shardq binary (CGO_ENABLED=0; required)")
	flag.StringVar(&o.Arch, "arch", "", "the binary's GOARCH (default: read from the binary)")
	flag.StringVar(&o.Version, "version", "dev", "the image's version label")
	flag.StringVar(&o.CACerts, "ca-certs", "/etc/ssl/certs/ca-certificates.crt", "a PEM bundle to include (empty: none)")
	flag.StringVar(&out, "out", "shardq.tar", "the tarball to write")
	flag.StringVar(&tag, "tag", "shardq:dev", "the image's repository:tag in the tarball")
	flag.Parse()
	if o.Binary == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: shardq-image --binary FILE [--arch A] [--version V] [--ca-certs FILE] [--out FILE] [--tag REPO:TAG]")
		os.Exit(2)
	}
	img, err := image.Build(o)
	if err == nil {
		err = image.Write(img, tag, out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	d, err := img.Digest()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("wrote %s: %s %s\n", out, tag, d)
}
