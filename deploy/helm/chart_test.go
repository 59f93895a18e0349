// SPDX-License-Identifier: Apache-2.0

// Package helm holds shardq's Helm chart (shardq/) and its tests.
package helm

import (
	"bytes"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// helm runs the module's helm tool (go.mod's tool directive).
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command("go", append([]string{"tool", "helm"}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String() + errb.String(), err
	}
	return out.String(), nil
}

// render is `helm template` of the chart with sets, each document decoded
// strictly into its Kubernetes type (an unknown field fails), by kind.
type rendered struct {
	deployments []appsv1.Deployment
	jobs        []batchv1.Job
	services    []corev1.Service
	secrets     []corev1.Secret
	others      []map[string]any
}

func render(t *testing.T, sets ...string) rendered {
	t.Helper()
	args := []string{"template", "rel", "./shardq"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", sets, err, out)
	}
	var r rendered
	for _, doc := range strings.Split(out, "\n---") {
		if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" {
			continue
		}
		var head struct{ APIVersion, Kind string }
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("a rendered document: %v\n%s", err, doc)
		}
		strict := func(v any) {
			if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
				t.Fatalf("%s %s: %v\n%s", head.APIVersion, head.Kind, err, doc)
			}
		}
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 Deployment":
			var d appsv1.Deployment
			strict(&d)
			r.deployments = append(r.deployments, d)
		case "batch/v1 Job":
			var j batchv1.Job
			strict(&j)
			r.jobs = append(r.jobs, j)
		case "v1 Service":
			var s corev1.Service
			strict(&s)
			r.services = append(r.services, s)
		case "v1 Secret":
			var s corev1.Secret
			strict(&s)
			r.secrets = append(r.secrets, s)
		case "monitoring.coreos.com/v1 ServiceMonitor":
			var m map[string]any
			strict(&m)
			r.others = append(r.others, m)
		default:
			t.Fatalf("an unexpected kind %s %s", head.APIVersion, head.Kind)
		}
	}
	return r
}

// The chart lints; it refuses to render without a DSN; rendered, it is
// valid Kubernetes objects (each decoded strictly into its API type): a
// Deployment of `shardq serve` as a non-root user with a read-only root,
// liveness on /healthz and readiness on /readyz, the DSN from a Secret,
// selected by its Service; the migrate Job a pre-install and pre-upgrade
// hook after the Secret it reads; a ServiceMonitor when asked.
func TestChart(t *testing.T) {
	if out, err := helm(t, "lint", "--strict", "./shardq", "--set", "dsn.value=mysql://u:p@db:3306/q"); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	if out, err := helm(t, "template", "rel", "./shardq"); err == nil || !strings.Contains(out, "dsn.existingSecret") {
		t.Fatalf("rendered without a DSN: %v\n%s", err, out)
	}

	if out, err := helm(t, "template", "rel", "./shardq", "--set", "dsn.value=sqlite:///data/q.db"); err == nil || !strings.Contains(out, "SQLite") {
		t.Fatalf("rendered with a SQLite DSN: %v\n%s", err, out)
	}

	r := render(t, "dsn.value=mysql://u:p@db:3306/q", "image.tag=v1.2.3", "serve.env.RATE=200", "serve.env.token-cache=2s")
	if len(r.deployments) != 1 || len(r.jobs) != 1 || len(r.services) != 1 || len(r.secrets) != 2 || len(r.others) != 0 {
		t.Fatalf("rendered %d deployments, %d jobs, %d services, %d secrets, %d others", len(r.deployments), len(r.jobs), len(r.services), len(r.secrets), len(r.others))
	}
	d := r.deployments[0]
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	if c.Image != "shardq:v1.2.3" || strings.Join(c.Args, " ") != "serve --addr :8080" {
		t.Fatalf("serve container %s %v", c.Image, c.Args)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Fatalf("probes %+v %+v", c.LivenessProbe, c.ReadinessProbe)
	}
	if sc := pod.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != 65532 {
		t.Fatalf("pod security %+v", pod.SecurityContext)
	}
	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Fatalf("container security %+v", c.SecurityContext)
	}
	// The release's own Secret for serve; a hook's copy, made before
	// the migrate Job and deleted once it succeeds, for the Job.
	secret, hookSecret := r.secrets[0], r.secrets[1]
	if secret.Annotations["helm.sh/hook"] != "" {
		secret, hookSecret = hookSecret, secret
	}
	dsnFromSecret := func(env []corev1.EnvVar, s corev1.Secret) bool {
		i := slices.IndexFunc(env, func(e corev1.EnvVar) bool { return e.Name == "SHARDQ_DSN" })
		return i >= 0 && env[i].ValueFrom != nil && env[i].ValueFrom.SecretKeyRef != nil &&
			env[i].ValueFrom.SecretKeyRef.Name == s.Name && env[i].ValueFrom.SecretKeyRef.Key == "dsn"
	}
	hasEnv := func(name, value string) bool {
		return slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name && e.Value == value })
	}
	if !dsnFromSecret(c.Env, secret) || !hasEnv("SHARDQ_RATE", "200") || !hasEnv("SHARDQ_TOKEN_CACHE", "2s") {
		t.Fatalf("serve env %+v", c.Env)
	}
	if secret.Annotations["helm.sh/hook"] != "" || secret.StringData["dsn"] != "mysql://u:p@db:3306/q" || hookSecret.StringData["dsn"] != "mysql://u:p@db:3306/q" {
		t.Fatalf("secrets %+v %+v", secret, hookSecret)
	}
	if d.Spec.Template.Annotations["checksum/dsn"] == "" {
		t.Fatal("no checksum of the DSN on the pods: a changed DSN would not roll them")
	}
	for k, v := range d.Spec.Selector.MatchLabels {
		if d.Spec.Template.Labels[k] != v {
			t.Fatalf("the selector's %s=%s is not on the pods", k, v)
		}
	}
	for k, v := range r.services[0].Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Fatalf("the service's selector %s=%s is not on the serve pods", k, v)
		}
	}
	job := r.jobs[0]
	jc := job.Spec.Template.Spec.Containers[0]
	if strings.Join(jc.Args, " ") != "migrate" || !dsnFromSecret(jc.Env, hookSecret) || job.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Fatalf("migrate job %+v", jc)
	}
	weight := func(a map[string]string) int {
		w, err := strconv.Atoi(a["helm.sh/hook-weight"])
		if err != nil {
			t.Fatalf("hook weight %q: %v", a["helm.sh/hook-weight"], err)
		}
		return w
	}
	if job.Annotations["helm.sh/hook"] != "pre-install,pre-upgrade" || hookSecret.Annotations["helm.sh/hook"] != "pre-install,pre-upgrade" ||
		weight(hookSecret.Annotations) >= weight(job.Annotations) || !strings.Contains(hookSecret.Annotations["helm.sh/hook-delete-policy"], "hook-succeeded") {
		t.Fatalf("hooks: job %v, secret %v; want the secret first, gone after", job.Annotations, hookSecret.Annotations)
	}
	if job.Spec.Template.Labels["app.kubernetes.io/component"] == d.Spec.Selector.MatchLabels["app.kubernetes.io/component"] {
		t.Fatal("the migrate job's pods match the deployment's selector")
	}

	r = render(t, "dsn.existingSecret=shardq-db", "serviceMonitor.enabled=true", "migrate.enabled=false",
		"bootstrapToken.existingSecret=boot", "bootstrapToken.tenants={acme,beta}")
	if len(r.secrets) != 0 || len(r.jobs) != 1 || len(r.others) != 1 {
		t.Fatalf("with an existing secret, no migrate job and a monitor: %d secrets, %d jobs, %d others", len(r.secrets), len(r.jobs), len(r.others))
	}
	env := r.deployments[0].Spec.Template.Spec.Containers[0].Env
	if i := slices.IndexFunc(env, func(e corev1.EnvVar) bool { return e.Name == "SHARDQ_DSN" }); i < 0 || env[i].ValueFrom.SecretKeyRef.Name != "shardq-db" {
		t.Fatalf("env with an existing secret %+v", env)
	}
	// The bootstrap token's Job: after install and upgrade, the token
	// from its Secret, never in the arguments.
	tj := r.jobs[0]
	tc := tj.Spec.Template.Spec.Containers[0]
	if tj.Annotations["helm.sh/hook"] != "post-install,post-upgrade" ||
		strings.Join(tc.Args, " ") != "token create --tenant acme --tenant beta --role operator --from-env SHARDQ_BOOTSTRAP_TOKEN" ||
		!slices.ContainsFunc(tc.Env, func(e corev1.EnvVar) bool {
			return e.Name == "SHARDQ_BOOTSTRAP_TOKEN" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef.Name == "boot" && e.ValueFrom.SecretKeyRef.Key == "token"
		}) {
		t.Fatalf("token job %v %+v", tj.Annotations, tc)
	}
	if out, err := helm(t, "template", "rel", "./shardq", "--set", "dsn.existingSecret=db", "--set", "bootstrapToken.existingSecret=boot"); err == nil || !strings.Contains(out, "bootstrapToken.tenants") {
		t.Fatalf("a bootstrap token without tenants: %v\n%s", err, out)
	}
	ep := r.others[0]["spec"].(map[string]any)["endpoints"].([]any)[0].(map[string]any)
	if ep["path"] != "/metrics" || ep["port"] != "http" {
		t.Fatalf("service monitor endpoint %v", ep)
	}
}
