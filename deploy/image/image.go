// SPDX-License-Identifier: Apache-2.0

// Package image builds shardq's container image without a container
// engine: one layer over an empty base (scratch) holding the static
// binary, a data directory owned by the non-root user it runs as, and CA
// certificates; its command is `shardq serve` and its health check
// `shardq healthcheck`. The result is a tarball that `docker load` and
// `podman load` read, as ko and other daemonless builders make.
package image

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's layout and identity.
const (
	Binary  = "/shardq"
	DataDir = "/data"
	// UID and GID are distroless's "nonroot".
	UID, GID = 65532, 65532
	Port     = 8080
)

// Options name what goes into the image.
type Options struct {
	Binary  string // a static linux binary of shardq (CGO_ENABLED=0)
	Arch    string // its GOARCH [read from the binary]
	Version string // the org.opencontainers.image.version label
	// CACerts is a PEM bundle copied to /etc/ssl/certs (for TLS to the
	// database or an OTLP collector); empty: none.
	CACerts string
}

// epoch dates every file and the image itself, so that the same inputs
// make the same image.
var epoch = time.Unix(0, 0).UTC()

// Build makes the image.
func Build(o Options) (v1.Image, error) {
	arch, err := staticLinux(o.Binary)
	if err != nil {
		return nil, err
	}
	if o.Arch == "" {
		o.Arch = arch
	} else if o.Arch != arch {
		return nil, fmt.Errorf("image: the binary is for %s, not %s", arch, o.Arch)
	}
	bin, err := os.ReadFile(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("image: read the binary: %w", err)
	}
	var certs []byte
	if o.CACerts != "" {
		if certs, err = os.ReadFile(o.CACerts); err != nil {
			return nil, fmt.Errorf("image: read the CA certificates: %w", err)
		}
	}
	layerTar, err := rootfs(bin, certs)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	img, err := mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), layer)
	if err != nil {
		return nil, fmt.Errorf("image: append the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image: config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", o.Arch, v1.Time{Time: epoch}
	cf.Config = v1.Config{
		User:       fmt.Sprintf("%d:%d", UID, GID),
		Entrypoint: []string{Binary},
		// Listens on every interface of the container; the database is
		// SQLite in the data directory unless SHARDQ_DSN says otherwise.
		Cmd:          []string{"serve", "--addr", fmt.Sprintf(":%d", Port)},
		WorkingDir:   DataDir,
		Env:          []string{"SHARDQ_DSN=sqlite://" + DataDir + "/shardq.db", "SSL_CERT_DIR=/etc/ssl/certs"},
		ExposedPorts: map[string]struct{}{fmt.Sprintf("%d/tcp", Port): {}},
		Volumes:      map[string]struct{}{DataDir: {}},
		// Alive, not ready: a database outage is not the container's to
		// fix by restarting.
		Healthcheck: &v1.HealthConfig{
			Test:     []string{"CMD", Binary, "healthcheck", "--url", fmt.Sprintf("http://127.0.0.1:%d/healthz", Port), "--timeout", "3s"},
			Interval: 10 * time.Second, Timeout: 5 * time.Second, StartPeriod: 10 * time.Second, Retries: 3,
		},
		Labels: map[string]string{
			"org.opencontainers.image.title":    "shardq",
			"org.opencontainers.image.version":  o.Version,
			"org.opencontainers.image.source":   "https://github.com/shardq/shardq",
			"org.opencontainers.image.licenses": "Apache-2.0",
		},
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image: set the config: %w", err)
	}
	return img, nil
}

// staticLinux returns a linux ELF binary's GOARCH, and refuses one that
// needs a dynamic loader (a cgo build): scratch has none.
func staticLinux(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("image: %s is not a linux binary: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("image: %s is linked dynamically; build it with CGO_ENABLED=0", path)
		}
	}
	arch, ok := map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64", elf.EM_386: "386", elf.EM_ARM: "arm",
		elf.EM_PPC64: "ppc64le", elf.EM_S390: "s390x", elf.EM_RISCV: "riscv64"}[f.Machine]
	if !ok {
		return "", fmt.Errorf("image: %s is for machine %v, which this builder does not name", path, f.Machine)
	}
	return arch, nil
}

// Write writes img as a tarball tagged tag (repository:tag).
func Write(img v1.Image, tag, path string) error {
	t, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("image: tag %q: %w", tag, err)
	}
	if err := tarball.WriteToFile(path, t, img); err != nil {
		return fmt.Errorf("image: write %s: %w", path, err)
	}
	return nil
}

// rootfs is the layer: the binary, the data directory, /tmp, the user's
// passwd and group entries and the CA certificates.
func rootfs(bin, certs []byte) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	add := func(h *tar.Header, body []byte) error {
		h.ModTime, h.Format = epoch, tar.FormatPAX
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(body)
		return err
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:%s:/sbin/nologin\n", UID, GID, DataDir)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", GID)
	type entry struct {
		h    tar.Header
		body []byte
	}
	entries := []entry{
		{tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}, nil},
		{tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}, []byte(passwd)},
		{tar.Header{Name: "etc/group", Typeflag: tar.TypeReg, Mode: 0o644}, []byte(group)},
		{tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777}, nil},
		{tar.Header{Name: DataDir[1:] + "/", Typeflag: tar.TypeDir, Mode: 0o700, Uid: UID, Gid: GID}, nil},
		{tar.Header{Name: Binary[1:], Typeflag: tar.TypeReg, Mode: 0o755}, bin},
	}
	if certs != nil {
		entries = append(entries,
			entry{tar.Header{Name: "etc/ssl/", Typeflag: tar.TypeDir, Mode: 0o755}, nil},
			entry{tar.Header{Name: "etc/ssl/certs/", Typeflag: tar.TypeDir, Mode: 0o755}, nil},
			entry{tar.Header{Name: "etc/ssl/certs/ca-certificates.crt", Typeflag: tar.TypeReg, Mode: 0o644}, certs})
	}
	for _, e := range entries {
		if err := add(&e.h, e.body); err != nil {
			return nil, fmt.Errorf("image: layer entry %s: %w", e.h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	return b.Bytes(), nil
}
