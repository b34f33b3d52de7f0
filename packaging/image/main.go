// Command image writes xlimit's OCI image archive (make image) without a
// container daemon: one layer with the static binary and the mount points
// the DaemonSet uses, on an empty base, as an OCI image layout in a tar
// (loadable with `ctr images import`, `podman load` or `skopeo copy
// oci-archive:`). Its own module keeps go-containerregistry out of
// xlimit's go.mod.
//
//	go run . -binary BIN -version V -ref ghcr.io/xlimit/xlimit:TAG -out dist/xlimit-V.tar
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Capabilities the daemon needs, as the DaemonSet grants them (and
// deploy/systemd/xlimit.service); the image records them as a label, and
// the image test checks the DaemonSet against it.
const capabilities = "CAP_BPF,CAP_NET_ADMIN,CAP_PERFMON,CAP_SYS_RESOURCE"

func main() {
	bin := flag.String("binary", "", "the static xlimit binary")
	version := flag.String("version", "", "the version (as the binary says it)")
	ref := flag.String("ref", "", "the image reference, e.g. ghcr.io/xlimit/xlimit:0.1.0")
	revision := flag.String("revision", "", "the source commit")
	out := flag.String("out", "", "the OCI archive to write")
	flag.Parse()
	if *bin == "" || *version == "" || *ref == "" || *out == "" {
		flag.Usage()
		os.Exit(2)
	}
	if err := build(*bin, *version, *ref, *revision, *out); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func epoch() time.Time {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return time.Unix(n, 0).UTC()
		}
	}
	return time.Unix(0, 0).UTC()
}

// layerTar is the image's only layer: the binary and the (empty) mount
// points of the DaemonSet's volumes, so that a read-only root file system
// needs no directory created at run time.
func layerTar(bin string, mtime time.Time) ([]byte, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := []string{"etc/", "etc/xlimit/", "run/", "run/xlimit/", "sys/", "sys/fs/", "sys/fs/bpf/", "tmp/",
		"usr/", "usr/bin/", "var/", "var/lib/", "var/lib/xlimit/"}
	for _, d := range dirs {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "usr/bin/xlimit", Mode: 0o755, Size: int64(len(data)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func build(bin, version, ref, revision, out string) error {
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("parse reference %s: %w", ref, err)
	}
	mtime := epoch()
	lt, err := layerTar(bin, mtime)
	if err != nil {
		return fmt.Errorf("build layer: %w", err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(lt)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return fmt.Errorf("build layer: %w", err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: mtime}, CreatedBy: "make image (packaging/image)",
	}})
	if err != nil {
		return fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: mtime}
	cf.Config.Entrypoint = []string{"/usr/bin/xlimit"}
	cf.Config.Cmd = []string{"run", "--config=/etc/xlimit/rules.yaml"}
	cf.Config.WorkingDir = "/"
	cf.Config.User = "0:0"
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":       "xlimit",
		"org.opencontainers.image.description": "eBPF/XDP rate limiter for a host's ports (deploy/kubernetes)",
		"org.opencontainers.image.source":      "https://github.com/xlimit/xlimit",
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.revision":    revision,
		"org.opencontainers.image.created":     mtime.Format(time.RFC3339),
		// What the pod must grant (deploy/kubernetes/daemonset.yaml):
		// exactly these capabilities, and nothing is written to the image.
		"io.xlimit.capabilities":     capabilities,
		"io.xlimit.read-only-rootfs": "true",
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return err
	}

	dir, err := os.MkdirTemp(filepath.Dir(out), ".image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("write layout: %w", err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag.TagStr(),
		"io.containerd.image.name":          tag.Name(),
	})); err != nil {
		return fmt.Errorf("write image: %w", err)
	}
	return tarDir(dir, out, mtime)
}

// tarDir writes dir's files into out, sorted, with fixed owners and times.
func tarDir(dir, out string, mtime time.Time) error {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(files)
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	for _, p := range files {
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(p, dir+string(filepath.Separator)))
		h := &tar.Header{Name: rel, ModTime: mtime, Mode: 0o644, Format: tar.FormatPAX}
		if st.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, rel+"/", 0o755
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			continue
		}
		h.Typeflag, h.Size = tar.TypeReg, st.Size()
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		_, err = io.Copy(tw, src)
		src.Close()
		if err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}
