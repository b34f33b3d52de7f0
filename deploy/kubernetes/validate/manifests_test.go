// Package validate checks xlimit's Kubernetes manifests (deploy/kubernetes)
// against the real Kubernetes API types, decoded strictly (an unknown or
// misspelt field is an error), and checks what matters for xlimit: host
// networking, exactly the four capabilities, the node's bpffs and state
// directory mounted where the daemon's flags point, rules that pass
// config.Parse, and arguments that `xlimit run` accepts.
//
// It is its own Go module so that k8s.io/api stays out of xlimit's.
package validate

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/rulesource"
)

const dir = ".."

type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
}

type manifests struct {
	files     []string
	ds        *appsv1.DaemonSet
	cm        *corev1.ConfigMap
	svc       *corev1.Service
	sa        *corev1.ServiceAccount
	namespace *corev1.Namespace
}

// load decodes every resource of kustomization.yaml strictly into its type.
func load(t *testing.T) *manifests {
	t.Helper()
	var k kustomization
	decodeFile(t, filepath.Join(dir, "kustomization.yaml"), &k)
	if k.Kind != "Kustomization" || len(k.Resources) == 0 {
		t.Fatalf("kustomization.yaml: kind %q, %d resources", k.Kind, len(k.Resources))
	}
	m := &manifests{files: k.Resources}
	for _, f := range k.Resources {
		path := filepath.Join(dir, f)
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		data := readFile(t, path)
		if err := yaml.Unmarshal(data, &meta); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 DaemonSet":
			m.ds = &appsv1.DaemonSet{}
			decodeFile(t, path, m.ds)
		case "v1 ConfigMap":
			m.cm = &corev1.ConfigMap{}
			decodeFile(t, path, m.cm)
		case "v1 Service":
			m.svc = &corev1.Service{}
			decodeFile(t, path, m.svc)
		case "v1 ServiceAccount":
			m.sa = &corev1.ServiceAccount{}
			decodeFile(t, path, m.sa)
		case "v1 Namespace":
			m.namespace = &corev1.Namespace{}
			decodeFile(t, path, m.namespace)
		default:
			t.Fatalf("%s: unexpected %s %s", path, meta.APIVersion, meta.Kind)
		}
	}
	if m.ds == nil || m.cm == nil || m.svc == nil || m.sa == nil || m.namespace == nil {
		t.Fatalf("want a DaemonSet, a ConfigMap, a Service, a ServiceAccount and a Namespace in %v", k.Resources)
	}
	return m
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte("\n---")) {
		t.Fatalf("%s: one object per file, please", path)
	}
	return data
}

func decodeFile(t *testing.T, path string, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(readFile(t, path), into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestStrictDecoding: the decoder used here rejects what a typo would
// produce, so the other tests can trust a clean decode.
func TestStrictDecoding(t *testing.T) {
	var ds appsv1.DaemonSet
	err := yaml.UnmarshalStrict([]byte("apiVersion: apps/v1\nkind: DaemonSet\nspec:\n  template:\n    spec:\n      hostNetwrok: true\n"), &ds)
	if err == nil || !strings.Contains(err.Error(), "hostNetwrok") {
		t.Fatalf("a misspelt field decoded: %v", err)
	}
}

func TestManifests(t *testing.T) {
	m := load(t)
	ns := m.namespace.Name
	for _, o := range []struct{ kind, namespace string }{
		{"DaemonSet", m.ds.Namespace}, {"ConfigMap", m.cm.Namespace}, {"Service", m.svc.Namespace}, {"ServiceAccount", m.sa.Namespace},
	} {
		if o.namespace != ns {
			t.Errorf("%s in namespace %q, want %q", o.kind, o.namespace, ns)
		}
	}

	spec := m.ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("the DaemonSet must use the host's network: xlimit attaches to the node's interface")
	}
	if spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("dnsPolicy %q with hostNetwork, want ClusterFirstWithHostNet", spec.DNSPolicy)
	}
	if spec.ServiceAccountName != m.sa.Name {
		t.Errorf("serviceAccountName %q, want %q", spec.ServiceAccountName, m.sa.Name)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the daemon never calls the Kubernetes API: no service account token")
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool { return tl.Operator == corev1.TolerationOpExists && tl.Key == "" }) {
		t.Error("the DaemonSet must tolerate every taint: every node needs protection")
	}
	sel := m.ds.Spec.Selector.MatchLabels
	for k, v := range sel {
		if m.ds.Spec.Template.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the pod template's labels %v", k, v, m.ds.Spec.Template.Labels)
		}
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("want one container, got %d", len(spec.Containers))
	}
	c := spec.Containers[0]

	// Security: exactly the four capabilities, nothing privileged.
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("no securityContext.capabilities")
	}
	var add []string
	for _, capName := range sc.Capabilities.Add {
		add = append(add, string(capName))
	}
	slices.Sort(add)
	if want := []string{"BPF", "NET_ADMIN", "PERFMON", "SYS_RESOURCE"}; !slices.Equal(add, want) {
		t.Errorf("capabilities added %v, want exactly %v (as deploy/systemd/xlimit.service)", add, want)
	}
	if len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("capabilities dropped %v, want [ALL]", sc.Capabilities.Drop)
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Error("privileged: the four capabilities are enough")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation must be false")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("readOnlyRootFilesystem must be true")
	}

	// Arguments: expand $(VAR) from the env as the kubelet does, then let
	// the real binary parse them.
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.Value != "":
			env[e.Name] = e.Value
		case e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			v, ok := m.cm.Data[ref.Key]
			if ref.Name != m.cm.Name || !ok {
				t.Errorf("env %s: ConfigMap %s has no key %q (an unresolved $(%s) stays literal)", e.Name, ref.Name, ref.Key, e.Name)
			}
			if ref.Optional != nil && *ref.Optional {
				t.Errorf("env %s: optional, so $(%s) could stay literal in the arguments", e.Name, e.Name)
			}
			env[e.Name] = v
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			// The rules source's password: the daemon reads it from its
			// environment; it must never reach the arguments.
			ref := e.ValueFrom.SecretKeyRef
			if e.Name != rulesource.PasswordEnv || ref.Optional == nil || !*ref.Optional {
				t.Errorf("env %s: from Secret %s: only an optional %s may come from a Secret", e.Name, ref.Name, rulesource.PasswordEnv)
			}
			for _, a := range c.Args {
				if strings.Contains(a, "$("+e.Name+")") {
					t.Errorf("argument %q holds the secret %s: the command line is readable by every user of the node", a, e.Name)
				}
			}
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			env[e.Name] = "192.0.2.10"
		default:
			t.Errorf("env %s: unexpected source", e.Name)
		}
	}
	if len(c.Command) != 0 {
		t.Errorf("command %v: the image's entrypoint is xlimit; give args only", c.Command)
	}
	args := expand(t, c.Args, env)
	if len(args) == 0 || args[0] != "run" {
		t.Fatalf("args %v: want xlimit run", args)
	}
	flags := flagValues(args[1:])
	checkArgs(t, args)
	// With a rules source too, as an operator would set it.
	env["XLIMIT_RULES_SOURCE"] = "redis://redis.xlimit.svc:6379/0?key=xlimit:rules&resync=30s"
	checkArgs(t, expand(t, c.Args, env))
	if src := m.cm.Data["rules-source"]; src != "" {
		if _, err := rulesource.ParseURL(src); err != nil {
			t.Errorf("ConfigMap rules-source: %v", err)
		}
	}
	if m.cm.Data["iface"] == "" {
		t.Error("ConfigMap iface is empty: --iface= would name no interface")
	}

	// Mounts: the flags' paths are the node's.
	mounts := map[string]corev1.VolumeMount{}
	for _, vm := range c.VolumeMounts {
		mounts[vm.MountPath] = vm
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	hostPathAt := func(flag, hostPath string) {
		t.Helper()
		vm, ok := mounts[flags[flag]]
		if !ok {
			t.Errorf("--%s=%s is not a volume mount", flag, flags[flag])
			return
		}
		v := volumes[vm.Name]
		if v.HostPath == nil || v.HostPath.Path != hostPath {
			t.Errorf("--%s=%s: volume %s is not hostPath %s", flag, flags[flag], vm.Name, hostPath)
		}
		if vm.ReadOnly {
			t.Errorf("--%s=%s is mounted read-only", flag, flags[flag])
		}
	}
	hostPathAt("bpffs", "/sys/fs/bpf") // pins outlive the pod
	hostPathAt("state-dir", "/var/lib/xlimit")
	if v := volumes[mounts["/sys/fs/bpf"].Name]; v.HostPath == nil || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectory {
		t.Error("the bpffs hostPath must be type Directory: the node mounts it; creating an empty directory would hide a missing bpffs")
	}
	if dir := filepath.Dir(flags["api-socket"]); mounts[dir].Name == "" || volumes[mounts[dir].Name].EmptyDir == nil {
		t.Errorf("--api-socket=%s: its directory is not a writable emptyDir", flags["api-socket"])
	}

	// The rules file is the ConfigMap's rules.yaml.
	vm, ok := mounts[filepath.Dir(flags["config"])]
	if !ok || volumes[vm.Name].ConfigMap == nil || volumes[vm.Name].ConfigMap.Name != m.cm.Name {
		t.Fatalf("--config=%s is not in the ConfigMap %s's volume", flags["config"], m.cm.Name)
	}
	key := filepath.Base(flags["config"])
	if items := volumes[vm.Name].ConfigMap.Items; len(items) > 0 {
		key = ""
		for _, it := range items {
			if it.Path == filepath.Base(flags["config"]) {
				key = it.Key
			}
		}
	}
	rules, ok := m.cm.Data[key]
	if !ok {
		t.Fatalf("--config=%s: the ConfigMap has no key %q", flags["config"], key)
	}
	cfg, err := config.Parse("configmap.yaml:"+key, []byte(rules))
	if err != nil {
		t.Errorf("the ConfigMap's rules do not validate:\n%v", err)
	} else if len(cfg.Rules) == 0 {
		t.Error("the ConfigMap's rules have no rule")
	}

	// Metrics: on the node's address, probed and scraped on that port.
	_, port, ok := strings.Cut(flags["metrics-addr"], ":")
	if !ok || strings.HasPrefix(flags["metrics-addr"], "127.") {
		t.Fatalf("--metrics-addr=%s: must listen on the pod's (node's) address for probes and Prometheus", flags["metrics-addr"])
	}
	portNum, _ := strconv.Atoi(port)
	if len(c.Ports) != 1 || int(c.Ports[0].ContainerPort) != portNum || c.Ports[0].Name != "metrics" {
		t.Errorf("container ports %+v, want metrics on %d", c.Ports, portNum)
	}
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/metrics" || p.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s probe: want httpGet /metrics on the metrics port, got %+v", name, p)
		}
	}
	for what, ann := range map[string]map[string]string{"pod": m.ds.Spec.Template.Annotations, "service": m.svc.Annotations} {
		if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != port || ann["prometheus.io/path"] != "/metrics" {
			t.Errorf("%s annotations %v: want prometheus.io/scrape, port %s, path /metrics", what, ann, port)
		}
	}
	if m.svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("the metrics Service should be headless (one endpoint per node), clusterIP %q", m.svc.Spec.ClusterIP)
	}
	for k, v := range m.svc.Spec.Selector {
		if m.ds.Spec.Template.Labels[k] != v {
			t.Errorf("the Service's selector %s=%s does not select the daemon's pods", k, v)
		}
	}
	if len(m.svc.Spec.Ports) != 1 || int(m.svc.Spec.Ports[0].Port) != portNum || m.svc.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("service ports %+v, want %d -> metrics", m.svc.Spec.Ports, portNum)
	}
}

var varRE = regexp.MustCompile(`\$\((\w+)\)`)

// expand replaces $(VAR) as the kubelet does; every VAR must be defined.
func expand(t *testing.T, args []string, env map[string]string) []string {
	t.Helper()
	var out []string
	for _, a := range args {
		out = append(out, varRE.ReplaceAllStringFunc(a, func(ref string) string {
			name := varRE.FindStringSubmatch(ref)[1]
			v, ok := env[name]
			if !ok {
				t.Errorf("argument %q: $(%s) is not in the container's env", a, name)
			}
			return v
		}))
	}
	return out
}

// flagValues maps --name=value arguments.
func flagValues(args []string) map[string]string {
	m := map[string]string{}
	for _, a := range args {
		if name, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok {
			m[name] = v
		}
	}
	return m
}

// checkArgs runs `xlimit ARGS --help`: pflag parses every flag before
// --help, so the exit status is 0 only when each one exists and its value
// parses (2 otherwise).
func checkArgs(t *testing.T, args []string) {
	t.Helper()
	out, err := exec.Command(xlimitBinary(t), append(slices.Clone(args), "--help")...).CombinedOutput()
	if err != nil {
		t.Errorf("xlimit %s: not valid flags: %v\n%s", strings.Join(args, " "), err, out)
	}
}

var builtBin string

// xlimitBinary is $XLIMIT_BIN, or xlimit built from this checkout.
func xlimitBinary(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("XLIMIT_BIN"); b != "" {
		return b
	}
	if builtBin != "" {
		return builtBin
	}
	bin := filepath.Join(t.TempDir(), "xlimit")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/xlimit")
	cmd.Dir = filepath.Join(dir, "..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build xlimit: %v\n%s", err, out)
	}
	builtBin = bin
	return bin
}

// TestKustomize renders the kustomization with kustomize's own Go API
// (sigs.k8s.io/kustomize/api, the library `kubectl kustomize` runs), so it
// needs no kubectl and runs everywhere.
func TestKustomize(t *testing.T) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", abs, err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatalf("kustomize build %s: render: %v", abs, err)
	}
	for _, kind := range []string{"Namespace", "ServiceAccount", "ConfigMap", "DaemonSet", "Service"} {
		if !bytes.Contains(out, []byte("\nkind: "+kind+"\n")) {
			t.Errorf("kustomize output has no %s:\n%s", kind, out)
		}
	}
}
