package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocumentSizeLimit: a document over MaxDocumentBytes is refused with
// a clear error, by Parse (the API, the rules source) and by ReadFile
// (run, reload, check) before the file is read whole.
func TestDocumentSizeLimit(t *testing.T) {
	big := make([]byte, MaxDocumentBytes+1)
	for i := range big {
		big[i] = '#'
	}
	if _, err := Parse("api", big); err == nil || !strings.Contains(err.Error(), "more than the limit of 16777216 bytes") {
		t.Errorf("Parse of %d bytes: %v", len(big), err)
	}
	dir := t.TempDir()
	sparse := filepath.Join(dir, "huge.yaml")
	f, err := os.Create(sparse)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 40); err != nil { // 1 TiB, sparse
		t.Fatal(err)
	}
	f.Close()
	if _, err := Load(sparse); err == nil || !strings.Contains(err.Error(), "document of 1099511627776 bytes") {
		t.Errorf("Load of a 1 TiB file: %v", err)
	}
	if _, err := ReadFile("/dev/zero"); err == nil || !strings.Contains(err.Error(), "more than the limit") {
		t.Errorf("ReadFile of /dev/zero: %v", err)
	}
	ok := filepath.Join(dir, "ok.yaml")
	if err := os.WriteFile(ok, []byte("interfaces: [eth0]\nrules: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(ok); err != nil {
		t.Errorf("Load of a small file: %v", err)
	}
}
