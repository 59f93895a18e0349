// SPDX-License-Identifier: Apache-2.0

package image

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image, built from a static binary, read back as a container engine
// would load it: an OCI image for linux whose user is not root, whose
// command is `shardq serve` on every interface and whose health check is
// `shardq healthcheck`; its layer holds the binary and a data directory
// owned by that user; the same inputs give the same digest. The binary
// taken out of the layer runs: it migrates a database, serves, and its
// own health check passes against it and fails once it stops. No
// container engine runs on this machine, so the container itself is not
// started.
func TestImage(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "shardq")
	// The command as the repository builds it: in its workspace (go.work
	// at the root), not this module's.
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/shardq")
	build.Dir = filepath.Join("..", "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOWORK=")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the binary: %v\n%s", err, out)
	}
	if _, err := Build(Options{Binary: "/bin/ls"}); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Fatalf("a dynamically linked binary: %v", err)
	}
	o := Options{Binary: bin, Version: "v0.0.0-test"}
	img, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "shardq.tar")
	if err := Write(img, "shardq:test", path); err != nil {
		t.Fatal(err)
	}
	again, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	d1, err1 := img.Digest()
	d2, err2 := again.Digest()
	if err1 != nil || err2 != nil || d1 != d2 {
		t.Fatalf("the same inputs made %v and %v (%v, %v)", d1, d2, err1, err2)
	}

	tag, err := name.NewTag("shardq:test")
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := tarball.ImageFromPath(path, &tag)
	if err != nil {
		t.Fatalf("load the tarball: %v", err)
	}
	// The tarball keeps the config and the layer (its manifest is the
	// docker load format's).
	c1, err1 := img.ConfigName()
	c2, err2 := loaded.ConfigName()
	if err1 != nil || err2 != nil || c1 != c2 {
		t.Fatalf("loaded config %v (%v); want %v (%v)", c2, err2, c1, err1)
	}
	if mt, err := img.MediaType(); err != nil || mt != types.OCIManifestSchema1 {
		t.Fatalf("manifest media type %v (%v)", mt, err)
	}
	cf, err := loaded.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if cf.OS != "linux" || cf.Architecture != "amd64" || c.User != "65532:65532" || strings.HasPrefix(c.User, "0") ||
		strings.Join(c.Entrypoint, " ") != "/shardq" || strings.Join(c.Cmd, " ") != "serve --addr :8080" ||
		c.WorkingDir != "/data" || c.Healthcheck == nil || strings.Join(c.Healthcheck.Test, " ") != "CMD /shardq healthcheck --url http://127.0.0.1:8080/healthz --timeout 3s" {
		t.Fatalf("config %+v %+v", cf, c.Healthcheck)
	}

	layers, err := loaded.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v); want 1 over scratch", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]*tar.Header{}
	extracted := filepath.Join(dir, "from-image")
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
		if h.Name == "shardq" {
			f, err := os.OpenFile(extracted, os.O_CREATE|os.O_WRONLY, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
	if h := got["shardq"]; h == nil || h.Mode != 0o755 || h.Uid != 0 {
		t.Fatalf("the binary's entry: %+v", h)
	}
	if h := got["data/"]; h == nil || h.Uid != UID || h.Gid != GID || h.Mode != 0o700 {
		t.Fatalf("the data directory's entry: %+v", h)
	}
	if got["etc/passwd"] == nil || got["tmp/"] == nil {
		t.Fatalf("entries %v", got)
	}

	run := func(args ...string) (string, error) {
		out, err := exec.Command(extracted, args...).CombinedOutput()
		return string(out), err
	}
	if out, err := run("version"); err != nil || !strings.HasPrefix(out, "shardq") {
		t.Fatalf("version: %v %s", err, out)
	}
	dsn := "sqlite://" + filepath.Join(dir, "shardq.db")
	if out, err := run("--dsn", dsn, "migrate"); err != nil {
		t.Fatalf("migrate: %v %s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	serve := exec.CommandContext(ctx, extracted, "--dsn", dsn, "serve", "--addr", "127.0.0.1:0")
	stderr, err := serve.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer serve.Process.Kill() //nolint:errcheck // stopped below unless the test failed first
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if _, a, ok := strings.Cut(sc.Text(), "listening on "); ok {
				addr <- a
			}
		}
		close(addr)
	}()
	var base string
	select {
	case base = <-addr:
	case <-ctx.Done():
		t.Fatal("serve did not say where it listens")
	}
	if base == "" {
		t.Fatal("serve ended before it listened")
	}
	if out, err := run("healthcheck", "--url", base+"/readyz"); err != nil || !strings.HasPrefix(out, "200") {
		t.Fatalf("healthcheck against serve: %v %s", err, out)
	}
	if out, err := run("healthcheck", "--url", "file:///etc/passwd"); err == nil || !strings.Contains(out, "--url") {
		t.Fatalf("healthcheck of a file URL: %v %s", err, out)
	}
	if err := serve.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := serve.Wait(); err != nil {
		t.Fatalf("serve after SIGTERM: %v", err)
	}
	if out, err := run("healthcheck", "--url", base+"/readyz", "--timeout", "2s"); err == nil {
		t.Fatalf("healthcheck against a stopped serve passed: %s", out)
	}
}
