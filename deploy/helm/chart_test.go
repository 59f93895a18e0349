// SPDX-License-Identifier: Apache-2.0

// Package helm holds shardq's Helm chart (shardq/) and its tests.
package helm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

// helmPath is the module's helm tool (go.mod's tool directive), built
// once: `go tool helm` costs the go command's start (most of a second)
// at every call.
var helmPath = sync.OnceValues(func() (string, error) {
	out, err := exec.Command("go", "tool", "-n", "helm").Output()
	return strings.TrimSpace(string(out)), err
})

// helm runs the module's helm tool.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	path, err := helmPath()
	if err != nil {
		t.Fatalf("go tool -n helm: %v", err)
	}
	var out, errb bytes.Buffer
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String() + errb.String(), err
	}
	return out.String(), nil
}

// render is `helm template` of the chart with sets, each document decoded
// strictly into its Kubernetes type (an unknown field fails), by kind.
type rendered struct {
	deployments     []appsv1.Deployment
	jobs            []batchv1.Job
	services        []corev1.Service
	secrets         []corev1.Secret
	serviceAccounts []corev1.ServiceAccount
	pods            []corev1.Pod // helm test's
	pdbs            []policyv1.PodDisruptionBudget
	ingresses       []networkingv1.Ingress
	others          []map[string]any
}

func render(t *testing.T, sets ...string) rendered {
	t.Helper()
	return renderArgs(t, setArgs(sets...)...)
}

func setArgs(sets ...string) []string {
	var args []string
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return args
}

// renderArgs is render with helm's own arguments (--set, -f FILE).
func renderArgs(t *testing.T, extra ...string) rendered {
	t.Helper()
	args := append([]string{"template", "rel", "./shardq"}, extra...)
	out, err := helm(t, args...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", extra, err, out)
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
		case "v1 ServiceAccount":
			var a corev1.ServiceAccount
			strict(&a)
			r.serviceAccounts = append(r.serviceAccounts, a)
		case "v1 Pod":
			var p corev1.Pod
			strict(&p)
			r.pods = append(r.pods, p)
		case "policy/v1 PodDisruptionBudget":
			var p policyv1.PodDisruptionBudget
			strict(&p)
			r.pdbs = append(r.pdbs, p)
		case "networking.k8s.io/v1 Ingress":
			var i networkingv1.Ingress
			strict(&i)
			r.ingresses = append(r.ingresses, i)
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

// service is the rendered Service named name.
func (r rendered) service(t *testing.T, name string) corev1.Service {
	t.Helper()
	i := slices.IndexFunc(r.services, func(s corev1.Service) bool { return s.Name == name })
	if i < 0 {
		t.Fatalf("no service %s among %d", name, len(r.services))
	}
	return r.services[i]
}

// The chart lints; it refuses to render without a DSN; rendered, it is
// valid Kubernetes objects (each decoded strictly into its API type): a
// Deployment of `shardq serve` as a non-root user with a read-only root,
// liveness on /healthz and readiness on /readyz, the DSN from a Secret,
// selected by its Service; the migrate Job a pre-install and pre-upgrade
// hook after the Secret it reads; a ServiceMonitor when asked; by default
// also a PodDisruptionBudget and helm test's Pod (the tests below).
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

	r := renderArgs(t, "--set", "dsn.value=mysql://u:p@db:3306/q", "--set", "image.tag=v1.2.3", "--set-string", "serve.env.RATE=200", "--set", "serve.env.token-cache=2s")
	if len(r.deployments) != 1 || len(r.jobs) != 1 || len(r.services) != 2 || len(r.secrets) != 2 || len(r.others) != 0 ||
		len(r.pdbs) != 1 || len(r.pods) != 1 || len(r.ingresses) != 0 || len(r.serviceAccounts) != 0 {
		t.Fatalf("rendered %d deployments, %d jobs, %d services, %d secrets, %d others, %d pdbs, %d pods, %d ingresses, %d service accounts",
			len(r.deployments), len(r.jobs), len(r.services), len(r.secrets), len(r.others), len(r.pdbs), len(r.pods), len(r.ingresses), len(r.serviceAccounts))
	}
	d := r.deployments[0]
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	if c.Image != "shardq:v1.2.3" || strings.Join(c.Args, " ") != "serve --addr :8080 --metrics-addr :9464" {
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
	for _, svc := range r.services {
		for k, v := range svc.Spec.Selector {
			if d.Spec.Template.Labels[k] != v {
				t.Fatalf("service %s's selector %s=%s is not on the serve pods", svc.Name, k, v)
			}
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
	if ep["path"] != "/metrics" || ep["port"] != "metrics" {
		t.Fatalf("service monitor endpoint %v", ep)
	}
}

const dsnSet = "dsn.value=mysql://u:p@db:3306/q"

// valuesFile writes a values file for -f.
func valuesFile(t *testing.T, yamlText string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(path, []byte(yamlText), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// values.schema.json (issue 62): helm lint --strict and helm template
// (install and upgrade validate the same way) refuse a value the chart
// does not know, at any level, including inside the Kubernetes objects
// values pass through, and a value of the wrong type, naming it; the
// same commands pass with values the chart knows.
func TestChartRefusesNonsense(t *testing.T) {
	lint := []string{"lint", "--strict", "./shardq"}
	if out, err := helm(t, append(lint, setArgs(dsnSet, "ingress.enabled=true", "replicaCount=3", "podLabels.team=q",
		"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=zone",
		"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists")...)...); err != nil {
		t.Fatalf("helm lint of values the chart knows: %v\n%s", err, out)
	}
	for _, c := range []struct{ set, want string }{
		{"nonsense=1", "additional properties 'nonsense' not allowed"},
		{"ingress.bogus=1", "at '/ingress': additional properties 'bogus' not allowed"},
		{"replicaCount=abc", "at '/replicaCount': got string, want integer"},
		{"podDisruptionBudget.enabeld=true", "at '/podDisruptionBudget': additional properties 'enabeld' not allowed"},
		{"serviceAccount.create=yes", "at '/serviceAccount/create': got string, want boolean"},
		{"serve.logLevel=loud", "at '/serve/logLevel'"},
		{"livenessProbe.path=/other", "at '/livenessProbe': additional properties 'path' not allowed"},
		{"podDisruptionBudget.maxUnavailable=most", "at '/podDisruptionBudget/maxUnavailable'"},
		{"resources.limits.memory=lots", "at '/resources/limits/memory'"},
		{"securityContext.readOnlyRootFilesytem=true", "additional properties 'readOnlyRootFilesytem' not allowed"},
		{"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpresions[0].key=zone",
			"additional properties 'matchExpresions' not allowed"},
		{`podLabels.app\.kubernetes\.io/component=other`, "invalid propertyName 'app.kubernetes.io/component'"},
	} {
		for _, cmd := range [][]string{lint, {"template", "rel", "./shardq"}} {
			out, err := helm(t, append(cmd, setArgs(dsnSet, c.set)...)...)
			if err == nil || !strings.Contains(out, c.want) {
				t.Errorf("helm %s --set %s: %v, want an error naming %q\n%s", cmd[0], c.set, err, c.want, out)
			}
		}
	}
}

// The optional objects: a PodDisruptionBudget by default (at most one
// serve pod down in a drain; minAvailable replaces it), an Ingress and a
// ServiceAccount when asked, each pointing at the serve pods or their
// Service; no pod mounts a service account token.
func TestChartOptionalObjects(t *testing.T) {
	r := render(t, dsnSet)
	d := r.deployments[0]
	if len(r.ingresses) != 0 || len(r.serviceAccounts) != 0 || len(r.pdbs) != 1 {
		t.Fatalf("by default: %d ingresses, %d service accounts, %d pdbs", len(r.ingresses), len(r.serviceAccounts), len(r.pdbs))
	}
	pdb := r.pdbs[0]
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.String() != "1" || pdb.Spec.MinAvailable != nil {
		t.Fatalf("default pdb %+v", pdb.Spec)
	}
	if pdb.Spec.Selector == nil || !maps.Equal(pdb.Spec.Selector.MatchLabels, d.Spec.Selector.MatchLabels) {
		t.Fatalf("the pdb selects %v, the deployment %v", pdb.Spec.Selector, d.Spec.Selector.MatchLabels)
	}
	if job := r.jobs[0].Spec.Template; selects(pdb.Spec.Selector.MatchLabels, job.Labels) {
		t.Fatalf("the pdb selects the migrate job's pods %v", job.Labels)
	}
	pod := d.Spec.Template.Spec
	if pod.ServiceAccountName != "" || pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Fatalf("default pod: service account %q, automount %v", pod.ServiceAccountName, pod.AutomountServiceAccountToken)
	}
	for _, j := range r.jobs {
		if a := j.Spec.Template.Spec.AutomountServiceAccountToken; a == nil || *a {
			t.Fatalf("job %s mounts a service account token", j.Name)
		}
	}

	r = renderArgs(t, "--set", dsnSet, "-f", valuesFile(t, `
ingress:
  enabled: true
  className: nginx
  annotations:
    nginx.ingress.kubernetes.io/proxy-read-timeout: "60"
  hosts:
    - host: q.example.com
      paths:
        - {path: /, pathType: Prefix}
    - paths:
        - {path: /v1, pathType: Exact}
  tls:
    - {secretName: q-tls, hosts: [q.example.com]}
serviceAccount:
  create: true
  annotations:
    eks.amazonaws.com/role-arn: arn:aws:iam::1:role/q
podDisruptionBudget:
  minAvailable: 50%
`))
	d, svc := r.deployments[0], r.service(t, "rel-shardq")
	if len(r.ingresses) != 1 || len(r.serviceAccounts) != 1 || len(r.pdbs) != 1 {
		t.Fatalf("asked for: %d ingresses, %d service accounts, %d pdbs", len(r.ingresses), len(r.serviceAccounts), len(r.pdbs))
	}
	ing := r.ingresses[0]
	if ing.Spec.IngressClassName == nil || *ing.Spec.IngressClassName != "nginx" || ing.Annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"] != "60" ||
		len(ing.Spec.TLS) != 1 || ing.Spec.TLS[0].SecretName != "q-tls" || !slices.Equal(ing.Spec.TLS[0].Hosts, []string{"q.example.com"}) {
		t.Fatalf("ingress %+v", ing)
	}
	if len(ing.Spec.Rules) != 2 || ing.Spec.Rules[0].Host != "q.example.com" || ing.Spec.Rules[1].Host != "" {
		t.Fatalf("ingress rules %+v", ing.Spec.Rules)
	}
	var paths []string
	for _, rule := range ing.Spec.Rules {
		for _, p := range rule.HTTP.Paths {
			paths = append(paths, p.Path+" "+string(*p.PathType))
			if b := p.Backend.Service; b == nil || b.Name != svc.Name || b.Port.Name != svc.Spec.Ports[0].Name {
				t.Fatalf("ingress path %s goes to %+v, not the service %s port %s", p.Path, p.Backend, svc.Name, svc.Spec.Ports[0].Name)
			}
		}
	}
	if !slices.Equal(paths, []string{"/ Prefix", "/v1 Exact"}) {
		t.Fatalf("ingress paths %v", paths)
	}
	sa := r.serviceAccounts[0]
	if sa.Name != "rel-shardq" || sa.Annotations["eks.amazonaws.com/role-arn"] != "arn:aws:iam::1:role/q" ||
		sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Fatalf("service account %+v", sa)
	}
	if d.Spec.Template.Spec.ServiceAccountName != sa.Name {
		t.Fatalf("the deployment runs as %q, not the chart's service account %s", d.Spec.Template.Spec.ServiceAccountName, sa.Name)
	}
	if p := r.pdbs[0].Spec; p.MinAvailable == nil || p.MinAvailable.String() != "50%" || p.MaxUnavailable != nil {
		t.Fatalf("pdb with minAvailable %+v", p)
	}

	r = render(t, dsnSet, "serviceAccount.name=queue", "podDisruptionBudget.enabled=false", "ingress.enabled=false")
	if len(r.serviceAccounts) != 0 || len(r.pdbs) != 0 || len(r.ingresses) != 0 || r.deployments[0].Spec.Template.Spec.ServiceAccountName != "queue" {
		t.Fatalf("an existing service account and no pdb: %d service accounts, %d pdbs, runs as %q",
			len(r.serviceAccounts), len(r.pdbs), r.deployments[0].Spec.Template.Spec.ServiceAccountName)
	}
	r = render(t, dsnSet, "podDisruptionBudget.maxUnavailable=0")
	if p := r.pdbs[0].Spec; p.MaxUnavailable == nil || p.MaxUnavailable.String() != "0" {
		t.Fatalf("pdb with maxUnavailable 0 %+v", p)
	}
	if out, err := helm(t, append([]string{"template", "rel", "./shardq"}, setArgs(dsnSet, "podDisruptionBudget.maxUnavailable=")...)...); err == nil ||
		!strings.Contains(out, "podDisruptionBudget: set minAvailable or maxUnavailable") {
		t.Fatalf("a pdb with neither: %v\n%s", err, out)
	}
}

// selects reports whether a selector's labels are all among labels.
func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// The serve pod's scheduling, labels, resources and probes come from the
// values: a topology spread constraint without a labelSelector gets the
// serve pods' selector, one with its own keeps it; a probe's timings are
// overridden one by one (the rest keep their defaults, the endpoints stay
// serve's), and a probe can be turned off.
func TestChartPodSpec(t *testing.T) {
	c := render(t, dsnSet).deployments[0].Spec.Template.Spec.Containers[0]
	for _, p := range []struct {
		name                              string
		probe                             *corev1.Probe
		path                              string
		period, timeout, failure, success int32
	}{
		{"liveness", c.LivenessProbe, "/healthz", 10, 3, 3, 0},
		{"readiness", c.ReadinessProbe, "/readyz", 5, 3, 3, 1},
		{"startup", c.StartupProbe, "/healthz", 2, 1, 30, 0},
	} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "http" ||
			p.probe.PeriodSeconds != p.period || p.probe.TimeoutSeconds != p.timeout || p.probe.FailureThreshold != p.failure ||
			p.probe.SuccessThreshold != p.success || p.probe.InitialDelaySeconds != 0 {
			t.Fatalf("default %s probe %+v", p.name, p.probe)
		}
	}

	r := renderArgs(t, "--set", dsnSet, "-f", valuesFile(t, `
topologySpreadConstraints:
  - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}
  - maxSkew: 2
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: DoNotSchedule
    labelSelector: {matchLabels: {team: q}}
livenessProbe: {periodSeconds: 20, failureThreshold: 6}
readinessProbe: {enabled: false}
startupProbe: {failureThreshold: 90, initialDelaySeconds: 5}
podLabels: {team: q}
podAnnotations: {example.com/note: hi}
nodeSelector: {disk: ssd}
tolerations:
  - {key: dedicated, operator: Equal, value: queue, effect: NoSchedule}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector: {matchLabels: {app.kubernetes.io/name: shardq}}
resources:
  requests: {cpu: 250m, memory: 128Mi}
  limits: {memory: 512Mi}
`))
	d := r.deployments[0]
	pod := d.Spec.Template.Spec
	c = pod.Containers[0]
	tsc := pod.TopologySpreadConstraints
	if len(tsc) != 2 || tsc[0].TopologyKey != "topology.kubernetes.io/zone" || tsc[0].MaxSkew != 1 || tsc[0].WhenUnsatisfiable != corev1.ScheduleAnyway ||
		tsc[0].LabelSelector == nil || !maps.Equal(tsc[0].LabelSelector.MatchLabels, d.Spec.Selector.MatchLabels) ||
		tsc[1].MaxSkew != 2 || tsc[1].LabelSelector == nil || !maps.Equal(tsc[1].LabelSelector.MatchLabels, map[string]string{"team": "q"}) {
		t.Fatalf("topology spread constraints %+v", tsc)
	}
	if l := c.LivenessProbe; l == nil || l.PeriodSeconds != 20 || l.FailureThreshold != 6 || l.TimeoutSeconds != 3 || l.HTTPGet.Path != "/healthz" {
		t.Fatalf("liveness probe %+v", l)
	}
	if c.ReadinessProbe != nil {
		t.Fatalf("readiness probe turned off, rendered %+v", c.ReadinessProbe)
	}
	if s := c.StartupProbe; s == nil || s.FailureThreshold != 90 || s.InitialDelaySeconds != 5 || s.PeriodSeconds != 2 || s.HTTPGet.Path != "/healthz" {
		t.Fatalf("startup probe %+v", s)
	}
	labels := d.Spec.Template.Labels
	if labels["team"] != "q" || !selects(d.Spec.Selector.MatchLabels, labels) || d.Spec.Template.Annotations["example.com/note"] != "hi" ||
		d.Spec.Template.Annotations["checksum/dsn"] == "" {
		t.Fatalf("pod labels %v, annotations %v", labels, d.Spec.Template.Annotations)
	}
	if pod.NodeSelector["disk"] != "ssd" || len(pod.Tolerations) != 1 || pod.Tolerations[0].Value != "queue" || pod.Tolerations[0].Effect != corev1.TaintEffectNoSchedule ||
		pod.Affinity == nil || pod.Affinity.PodAntiAffinity == nil || len(pod.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Fatalf("scheduling: node selector %v, tolerations %+v, affinity %+v", pod.NodeSelector, pod.Tolerations, pod.Affinity)
	}
	if c.Resources.Requests.Cpu().String() != "250m" || c.Resources.Requests.Memory().String() != "128Mi" || c.Resources.Limits.Memory().String() != "512Mi" {
		t.Fatalf("resources %+v", c.Resources)
	}
}

// helm test's Pod: a test hook (annotated helm.sh/hook: test) that
// reaches serve through the release's Service and, with the bootstrap
// token, publishes a message and receives and acks it over the HTTP API.
// No cluster runs here, so the Pod itself is never started: the test
// checks what renders, and runs the Pod's script (busybox's sh and wget
// in the Pod; this machine's sh and wget take the same options) against
// a shardq serve of its own on SQLite, with the token the chart reads.
func TestChartTestHook(t *testing.T) {
	r := render(t, dsnSet)
	svc := r.service(t, "rel-shardq")
	url := fmt.Sprintf("http://%s:%d", svc.Name, svc.Spec.Ports[0].Port)
	if len(r.pods) != 1 {
		t.Fatalf("%d test pods", len(r.pods))
	}
	p := r.pods[0]
	c := p.Spec.Containers[0]
	env := func(c corev1.Container, name string) *corev1.EnvVar {
		if i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name }); i >= 0 {
			return &c.Env[i]
		}
		return nil
	}
	if p.Annotations["helm.sh/hook"] != "test" || p.Spec.RestartPolicy != corev1.RestartPolicyNever || c.Image != "busybox:1.37" ||
		env(c, "SHARDQ_URL") == nil || env(c, "SHARDQ_URL").Value != url || env(c, "SHARDQ_TOKEN") != nil ||
		len(c.Args) != 1 || !strings.Contains(c.Args[0], "/readyz") || strings.Contains(c.Args[0], "/messages") {
		t.Fatalf("test pod without a token: %v %+v", p.Annotations, c)
	}
	if selects(svc.Spec.Selector, p.Labels) {
		t.Fatal("the service selects the test pod")
	}
	if r := render(t, dsnSet, "tests.enabled=false"); len(r.pods) != 0 {
		t.Fatal("tests.enabled=false rendered a test pod")
	}

	r = render(t, "dsn.existingSecret=db", "bootstrapToken.existingSecret=boot", "bootstrapToken.tenants={acme,beta}")
	p = r.pods[0]
	c = p.Spec.Containers[0]
	if tok := env(c, "SHARDQ_TOKEN"); tok == nil || tok.ValueFrom == nil || tok.ValueFrom.SecretKeyRef == nil ||
		tok.ValueFrom.SecretKeyRef.Name != "boot" || tok.ValueFrom.SecretKeyRef.Key != "token" {
		t.Fatalf("the test's token: %+v", tok)
	}
	if env(c, "SHARDQ_TENANT").Value != "acme" || env(c, "SHARDQ_TOPIC").Value != "helm-test" || env(c, "SHARDQ_GROUP").Value != "helm-test" {
		t.Fatalf("test env %+v", c.Env)
	}
	for _, s := range []string{"/messages", "/receive", "/ack", "Authorization: Bearer $SHARDQ_TOKEN"} {
		if !strings.Contains(c.Args[0], s) {
			t.Fatalf("the test script has no %q:\n%s", s, c.Args[0])
		}
	}
	if r := render(t, "dsn.existingSecret=db", "bootstrapToken.existingSecret=boot", "bootstrapToken.tenants={acme,beta}", "tests.tenant=beta"); env(r.pods[0].Spec.Containers[0], "SHARDQ_TENANT").Value != "beta" {
		t.Fatal("tests.tenant is not the test's tenant")
	}

	t.Run("script", func(t *testing.T) {
		wget, err := exec.LookPath("wget")
		if err != nil {
			t.Skip("no wget here to run the test pod's script with")
		}
		base, token := serveForHook(t)
		run := func(token string) (string, error) {
			cmd := exec.Command(c.Command[0], append(c.Command[1:], c.Args...)...)
			cmd.Env = []string{"PATH=" + filepath.Dir(wget) + ":/usr/bin:/bin", "SHARDQ_URL=" + base, "SHARDQ_TOKEN=" + token}
			for _, name := range []string{"SHARDQ_TENANT", "SHARDQ_TOPIC", "SHARDQ_GROUP"} {
				cmd.Env = append(cmd.Env, name+"="+env(c, name).Value)
			}
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		out, err := run(token)
		_, id, ok := strings.Cut(out, "published, received and acked ")
		if err != nil || !ok {
			t.Fatalf("the test pod's script against serve: %v\n%s", err, out)
		}
		id, _, _ = strings.Cut(id, " ")
		// The Pod's log is kept after the run: it names the message it
		// checked (id and offset), never the receive's answer, which
		// holds the receipt (it settles the message) and the payload.
		if !strings.Contains(out, id+" (offset ") || strings.Contains(out, `"receipt"`) || strings.Contains(out, "r3.") ||
			strings.Contains(out, `"payload"`) || strings.Contains(out, `"messages"`) {
			t.Fatalf("the test pod's log holds more than the id and offset it checked:\n%s", out)
		}
		// It acked: the group's cursor in the message's partition (its
		// key) is at the head.
		req, _ := http.NewRequest(http.MethodGet, base+"/v1/tenants/acme/topics/helm-test/offsets?group=helm-test", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		type offset struct {
			Key, Group string
			Lag        int64
			NoCursor   bool `json:"no_cursor"`
		}
		var offsets struct{ Items []offset }
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if err := json.Unmarshal(body, &offsets); err != nil || res.StatusCode != 200 {
			t.Fatalf("offsets: %s %v %s", res.Status, err, body)
		}
		i := slices.IndexFunc(offsets.Items, func(o offset) bool { return o.Key == id && o.Group == "helm-test" })
		if i < 0 || offsets.Items[i].Lag != 0 || offsets.Items[i].NoCursor {
			t.Fatalf("after the test, group helm-test's cursor of %s: %s", id, body)
		}
		if out, err := run("sq_wrong.token"); err == nil || strings.Contains(out, "acked") {
			t.Fatalf("the test passed with a wrong token: %v\n%s", err, out)
		}
	})
}

// serveForHook builds the shardq command (as deploy/image's test does),
// migrates a SQLite database, stores a token for tenant acme as the
// chart's token Job does (token new, then token create --from-env), and
// serves it; it returns serve's URL and the token.
func serveForHook(t *testing.T) (string, string) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "shardq")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/shardq")
	build.Dir = filepath.Join("..", "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the binary: %v\n%s", err, out)
	}
	dsn := "sqlite://" + filepath.Join(dir, "shardq.db")
	shardq := func(env []string, args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"--dsn", dsn}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("shardq %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	shardq(nil, "migrate")
	token := shardq(nil, "token", "new")
	shardq([]string{"BOOT=" + token}, "token", "create", "--tenant", "acme", "--role", "operator", "--from-env", "BOOT")

	ctx, cancel := context.WithCancel(context.Background())
	serve := exec.CommandContext(ctx, bin, "--dsn", dsn, "serve", "--addr", "127.0.0.1:0")
	stderr, err := serve.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		serve.Wait() //nolint:errcheck // killed
	})
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
	select {
	case base := <-addr:
		if base == "" {
			t.Fatal("serve ended before it listened")
		}
		return base, token
	case <-time.After(time.Minute):
		t.Fatal("serve did not say where it listens")
	}
	return "", ""
}

// helmFails runs helm lint --strict and helm template with args and
// wants each to fail with an error that holds every one of want: what
// the schema refuses.
func helmFails(t *testing.T, args []string, want ...string) {
	t.Helper()
	commandsFail(t, [][]string{{"lint", "--strict", "./shardq"}, {"template", "rel", "./shardq"}}, args, want...)
}

// templateFails is helmFails for what a template refuses (fail): helm
// template, install and upgrade stop there, helm lint runs no fail.
func templateFails(t *testing.T, args []string, want ...string) {
	t.Helper()
	commandsFail(t, [][]string{{"template", "rel", "./shardq"}}, args, want...)
}

func commandsFail(t *testing.T, cmds [][]string, args []string, want ...string) {
	t.Helper()
	for _, cmd := range cmds {
		out, err := helm(t, append(cmd, args...)...)
		if err == nil {
			t.Errorf("helm %s %v passed, want an error naming %q\n%s", cmd[0], args, want, out)
			continue
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("helm %s %v: the error does not say %q:\n%s", cmd[0], args, w, out)
			}
		}
	}
}

// serve.env's values are strings: a YAML number would be quoted in float
// form (8388608 as "8.388608e+06", which serve's --max-body refuses at
// start) and a boolean as "true" by luck, so the schema refuses both,
// from a values file and from --set (which makes numbers of digits),
// naming the value; --set-string and a quoted value pass as written.
func TestChartServeEnvTakesStrings(t *testing.T) {
	for _, args := range [][]string{
		{"--set", dsnSet, "-f", valuesFile(t, "serve:\n  env:\n    MAX_BODY: 8388608\n")},
		{"--set", dsnSet, "--set", "serve.env.MAX_BODY=8388608"},
	} {
		helmFails(t, args, "at '/serve/env/MAX_BODY': got number, want string")
	}
	helmFails(t, []string{"--set", dsnSet, "--set", "serve.env.DEAD_LETTER_EXPIRED=true"}, "at '/serve/env/DEAD_LETTER_EXPIRED': got boolean, want string")

	for _, args := range [][]string{
		{"--set", dsnSet, "-f", valuesFile(t, "serve:\n  env:\n    MAX_BODY: \"8388608\"\n    dead-letter-expired: \"true\"\n")},
		{"--set", dsnSet, "--set-string", "serve.env.MAX_BODY=8388608,serve.env.dead-letter-expired=true"},
	} {
		env := renderArgs(t, args...).deployments[0].Spec.Template.Spec.Containers[0].Env
		for name, value := range map[string]string{"SHARDQ_MAX_BODY": "8388608", "SHARDQ_DEAD_LETTER_EXPIRED": "true"} {
			if !slices.ContainsFunc(env, func(e corev1.EnvVar) bool { return e.Name == name && e.Value == value }) {
				t.Fatalf("%v: no %s=%s in %+v", args, name, value, env)
			}
		}
	}
}

// serve.env may not name a variable the chart sets itself, however the
// key is spelt (SHARDQ_ is added, the key upper-cased, - made _): a
// second SHARDQ_DSN after the Secret's would replace the DSN with
// plaintext (the last of a name wins), a second log variable would
// override serve.logFormat or serve.logLevel, and the variable of a flag
// on serve's command line (--addr, --metrics-addr) would be ignored, the
// command line winning. The schema refuses those keys (lint, template,
// install); the template refuses two keys naming one variable (helm
// lint runs no template fail).
func TestChartServeEnvKeepsTheChartsVariables(t *testing.T) {
	for _, key := range []string{"DSN", "dsn", "Dsn", "log-format", "LOG_FORMAT", "log_level", "LOG-LEVEL", "addr", "ADDR", "metrics-addr", "METRICS_ADDR"} {
		helmFails(t, []string{"--set", dsnSet, "--set-string", "serve.env." + key + "=x"}, "at '/serve/env/"+key+"'")
	}
	templateFails(t, []string{"--set", dsnSet, "--set-string", "serve.env.rate=100,serve.env.RATE=200"}, "serve.env.RATE and serve.env.rate are both SHARDQ_RATE")

	// Other variables pass, and the DSN stays the Secret's, once.
	env := renderArgs(t, "--set", "dsn.existingSecret=db", "--set-string", "serve.env.RATE=200,serve.env.tenants=acme").deployments[0].Spec.Template.Spec.Containers[0].Env
	names := map[string]int{}
	for _, e := range env {
		names[e.Name]++
	}
	for name, n := range names {
		if n != 1 {
			t.Fatalf("%s %d times in %+v", name, n, env)
		}
	}
	if names["SHARDQ_RATE"] != 1 || names["SHARDQ_TENANTS"] != 1 || names["SHARDQ_DSN"] != 1 {
		t.Fatalf("serve env %+v", env)
	}
}

// /metrics needs no token and names every tenant's topics: it must not
// be reachable through the Ingress, whatever paths it lists, nor
// through a LoadBalancer Service. serve serves it on a port of its own
// (--metrics-addr), behind a ClusterIP Service of its own, which the
// ServiceMonitor scrapes; the Ingress and the API Service reach serve's
// API port only, where /metrics is a 404.
func TestChartMetricsStayOffTheIngress(t *testing.T) {
	r := renderArgs(t, "--set", dsnSet, "--set", "serviceMonitor.enabled=true", "--set", "service.type=LoadBalancer", "-f", valuesFile(t, `
ingress:
  enabled: true
  hosts:
    - host: q.example.com
      paths:
        - {path: /, pathType: Prefix}
        - {path: /metrics, pathType: Exact}
`))
	c := r.deployments[0].Spec.Template.Spec.Containers[0]
	if i := slices.Index(c.Args, "--metrics-addr"); i < 0 || i+1 >= len(c.Args) || c.Args[i+1] != ":9464" {
		t.Fatalf("serve's args %v: /metrics is not on a port of its own", c.Args)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] != 8080 || ports["metrics"] != 9464 || !slices.Contains(c.Args, ":8080") {
		t.Fatalf("serve's ports %v, args %v", ports, c.Args)
	}

	api, metrics := r.service(t, "rel-shardq"), r.service(t, "rel-shardq-metrics")
	if api.Spec.Type != corev1.ServiceTypeLoadBalancer || len(api.Spec.Ports) != 1 || api.Spec.Ports[0].TargetPort.String() != "http" {
		t.Fatalf("the API service %+v reaches more than serve's API port", api.Spec)
	}
	if metrics.Spec.Type != corev1.ServiceTypeClusterIP || len(metrics.Spec.Ports) != 1 || metrics.Spec.Ports[0].Name != "metrics" ||
		metrics.Spec.Ports[0].Port != 9464 || metrics.Spec.Ports[0].TargetPort.String() != "metrics" ||
		!selects(metrics.Spec.Selector, r.deployments[0].Spec.Template.Labels) {
		t.Fatalf("the metrics service %+v", metrics.Spec)
	}
	if len(r.ingresses) != 1 {
		t.Fatalf("%d ingresses", len(r.ingresses))
	}
	for _, rule := range r.ingresses[0].Spec.Rules {
		for _, p := range rule.HTTP.Paths {
			if b := p.Backend.Service; b == nil || b.Name != api.Name || b.Port.Name != "http" {
				t.Fatalf("ingress path %s goes to %+v, not the API service's http port", p.Path, p.Backend)
			}
		}
	}

	if len(r.others) != 1 {
		t.Fatalf("%d others, want the service monitor", len(r.others))
	}
	spec := r.others[0]["spec"].(map[string]any)
	sel := map[string]string{}
	for k, v := range spec["selector"].(map[string]any)["matchLabels"].(map[string]any) {
		sel[k] = v.(string)
	}
	ep := spec["endpoints"].([]any)[0].(map[string]any)
	if !selects(sel, metrics.Labels) || selects(sel, api.Labels) || ep["port"] != "metrics" || ep["path"] != "/metrics" {
		t.Fatalf("the service monitor selects %v (metrics service %v, API service %v) and scrapes %v", sel, metrics.Labels, api.Labels, ep)
	}

	if r := render(t, dsnSet, "metrics.port=9100", "serviceMonitor.enabled=true"); r.service(t, "rel-shardq-metrics").Spec.Ports[0].Port != 9100 ||
		!slices.Contains(r.deployments[0].Spec.Template.Spec.Containers[0].Args, ":9100") {
		t.Fatal("metrics.port is not serve's metrics port")
	}
	templateFails(t, setArgs(dsnSet, "metrics.port=8080"), "metrics.port: serve's metrics need a port of their own")
}

// A PodDisruptionBudget whose minAvailable is every serve pod lets no
// eviction through: every node drain (and with it cluster upgrades)
// would wait forever. The chart refuses it, counting a percentage as
// Kubernetes does (rounded up: 50% of 1 pod is 1), from --set and from a
// values file alike (helm template, install and upgrade; helm lint runs
// no template fail); a minAvailable below replicaCount renders, and so
// does one with no serve pods to keep.
func TestChartPodDisruptionBudgetLetsDrainsThrough(t *testing.T) {
	const msg = "so no node could ever be drained"
	for _, sets := range [][]string{
		{"replicaCount=1", "podDisruptionBudget.minAvailable=1"},
		{"replicaCount=1", "podDisruptionBudget.minAvailable=50%"},
		{"replicaCount=3", "podDisruptionBudget.minAvailable=3"},
		{"replicaCount=2", "podDisruptionBudget.minAvailable=5"},
		{"replicaCount=3", "podDisruptionBudget.minAvailable=70%"},
	} {
		templateFails(t, setArgs(append([]string{dsnSet}, sets...)...), "podDisruptionBudget.minAvailable", msg)
	}
	templateFails(t, []string{"--set", dsnSet, "-f", valuesFile(t, "replicaCount: 1\npodDisruptionBudget:\n  minAvailable: 1\n")}, msg)

	for _, c := range []struct {
		sets []string
		want string
	}{
		{[]string{"replicaCount=3", "podDisruptionBudget.minAvailable=2"}, "2"},
		{[]string{"replicaCount=2", "podDisruptionBudget.minAvailable=50%"}, "50%"},
		{[]string{"replicaCount=3", "podDisruptionBudget.minAvailable=60%"}, "60%"},
		{[]string{"replicaCount=0", "podDisruptionBudget.minAvailable=1"}, "1"},
	} {
		r := render(t, append([]string{dsnSet}, c.sets...)...)
		if len(r.pdbs) != 1 || r.pdbs[0].Spec.MinAvailable == nil || r.pdbs[0].Spec.MinAvailable.String() != c.want {
			t.Fatalf("%v: pdbs %+v", c.sets, r.pdbs)
		}
	}
	// replicaCount 1 with the default (maxUnavailable 1) drains.
	if r := render(t, dsnSet, "replicaCount=1"); len(r.pdbs) != 1 || r.pdbs[0].Spec.MaxUnavailable.String() != "1" {
		t.Fatalf("replicaCount 1: pdbs %+v", r.pdbs)
	}
}
