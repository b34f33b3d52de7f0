package main

import (
	"archive/tar"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"go.yaml.in/yaml/v3"
)

// TestImage checks the archive `make image` wrote (XLIMIT_IMAGE) against
// the DaemonSet that runs it: the DaemonSet names the archive's image; the
// pod grants exactly the four capabilities the image's label lists, drops
// the rest, and mounts the root file system read-only; and the image's
// binary runs and says the version its label says.
func TestImage(t *testing.T) {
	archive := os.Getenv("XLIMIT_IMAGE")
	if archive == "" {
		t.Skip("XLIMIT_IMAGE (the archive make image writes) is not set: run make image")
	}
	dir := t.TempDir()
	untar(t, archive, dir)
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatalf("%s is not an OCI image layout: %v", archive, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("%d manifests in the index, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	ref := desc.Annotations["io.containerd.image.name"]
	if ref == "" || desc.Annotations["org.opencontainers.image.ref.name"] == "" {
		t.Fatalf("the image has no reference annotations: %v", desc.Annotations)
	}
	img, err := p.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform %s/%s, want linux/amd64", cf.OS, cf.Architecture)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/usr/bin/xlimit"}) {
		t.Errorf("entrypoint %q, want /usr/bin/xlimit", cf.Config.Entrypoint)
	}
	labels := cf.Config.Labels
	wantCaps := strings.Split(labels["io.xlimit.capabilities"], ",")
	if !slices.Equal(wantCaps, []string{"CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON", "CAP_SYS_RESOURCE"}) {
		t.Errorf("image label io.xlimit.capabilities = %q, want the four", labels["io.xlimit.capabilities"])
	}
	if labels["io.xlimit.read-only-rootfs"] != "true" {
		t.Errorf("image label io.xlimit.read-only-rootfs = %q", labels["io.xlimit.read-only-rootfs"])
	}

	// The binary of the layer runs and is the version of the label.
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v; want one", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "xlimit")
	var names []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Name == "usr/bin/xlimit" {
			if h.Mode&0o111 == 0 {
				t.Errorf("usr/bin/xlimit is not executable (mode %o)", h.Mode)
			}
			f, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
	rc.Close()
	for _, mp := range []string{"etc/xlimit/", "var/lib/xlimit/", "run/xlimit/", "sys/fs/bpf/"} {
		if !slices.Contains(names, mp) {
			t.Errorf("the layer lacks the mount point %s (a read-only root cannot create it)", mp)
		}
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("the image's xlimit version: %v: %s", err, out)
	}
	if got, want := strings.TrimSpace(string(out)), "xlimit "+labels["org.opencontainers.image.version"]; got != want {
		t.Errorf("the image's binary says %q, its label %q", got, want)
	}

	// The DaemonSet names this image and runs it with the capabilities of
	// the label, nothing else, and a read-only root file system.
	ds := readDaemonSet(t)
	if len(ds.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("%d containers in the DaemonSet, want 1", len(ds.Spec.Template.Spec.Containers))
	}
	c := ds.Spec.Template.Spec.Containers[0]
	if c.Image != ref {
		t.Errorf("the DaemonSet runs image %q, make image built %q", c.Image, ref)
	}
	sc := c.SecurityContext
	var add []string
	for _, cap := range wantCaps {
		add = append(add, strings.TrimPrefix(cap, "CAP_"))
	}
	if !slices.Equal(sc.Capabilities.Add, add) {
		t.Errorf("the DaemonSet adds capabilities %q, want %q (the image's label)", sc.Capabilities.Add, add)
	}
	if !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) {
		t.Errorf("the DaemonSet drops %q, want [ALL]", sc.Capabilities.Drop)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("the DaemonSet does not set readOnlyRootFilesystem: true")
	}
	if sc.Privileged == nil || *sc.Privileged {
		t.Error("the DaemonSet does not set privileged: false")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("the DaemonSet does not set allowPrivilegeEscalation: false")
	}
	t.Logf("image %s (%s, version %s): DaemonSet grants %v, drops %v, read-only root", ref, desc.Digest, labels["org.opencontainers.image.version"], sc.Capabilities.Add, sc.Capabilities.Drop)
}

type daemonSet struct {
	Spec struct {
		Template struct {
			Spec struct {
				Containers []struct {
					Image           string `yaml:"image"`
					SecurityContext struct {
						Privileged               *bool `yaml:"privileged"`
						AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
						ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
						Capabilities             struct {
							Add  []string `yaml:"add"`
							Drop []string `yaml:"drop"`
						} `yaml:"capabilities"`
					} `yaml:"securityContext"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

func readDaemonSet(t *testing.T) daemonSet {
	t.Helper()
	data, err := os.ReadFile("../../deploy/kubernetes/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds daemonSet
	if err := yaml.Unmarshal(data, &ds); err != nil {
		t.Fatalf("daemonset.yaml: %v", err)
	}
	return ds
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			t.Fatalf("%s: entry %q leaves the directory", archive, h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			w, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(w, tr); err != nil {
				t.Fatal(err)
			}
			w.Close()
		}
	}
}
