package watch

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

const debounce = 50 * time.Millisecond

func newWatcher(t *testing.T, path string) *Watcher {
	t.Helper()
	w, err := New(path, Options{Debounce: debounce})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return w
}

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// replace writes text to a temporary file and renames it over path, as
// vim (with backupcopy=no), sed -i and most deployment tools do.
func replace(t *testing.T, path, text string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".swp")
	write(t, tmp, text)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func expect(t *testing.T, w *Watcher, want string) Change {
	t.Helper()
	select {
	case c, ok := <-w.Changes():
		if !ok {
			t.Fatal("Changes closed")
		}
		if c.Err != nil || !c.Exists || string(c.Data) != want || c.SHA256 != sha256.Sum256([]byte(want)) || c.Path != w.path {
			t.Fatalf("change: exists=%v err=%v data %q, want %q", c.Exists, c.Err, c.Data, want)
		}
		return c
	case <-time.After(5 * time.Second):
		t.Fatalf("no change within 5s (want %q)", want)
	}
	return Change{}
}

func expectGone(t *testing.T, w *Watcher) {
	t.Helper()
	select {
	case c := <-w.Changes():
		if c.Exists || c.Data != nil || c.Err != nil {
			t.Fatalf("want the file gone, got exists=%v err=%v data %q", c.Exists, c.Err, c.Data)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no change within 5s (want the file gone)")
	}
}

func expectNone(t *testing.T, w *Watcher) {
	t.Helper()
	select {
	case c := <-w.Changes():
		t.Fatalf("unexpected change: exists=%v err=%v data %q", c.Exists, c.Err, c.Data)
	case <-time.After(6 * debounce):
	}
}

func TestWriteInPlace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	write(t, path, "a")
	w := newWatcher(t, path)
	expectNone(t, w)
	write(t, path, "b")
	expect(t, w, "b")
	expectNone(t, w)
	// Appending, truncating: each is a change.
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("c")
	f.Close()
	expect(t, w, "bc")
	write(t, path, "")
	expect(t, w, "")
}

func TestDebounce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	write(t, path, "v0")
	w := newWatcher(t, path)
	// A burst of saves closer together than the debounce is one change,
	// with the last content, no sooner than the debounce after the last.
	var last time.Time
	for i := 1; i <= 10; i++ {
		write(t, path, fmt.Sprintf("v%d", i))
		last = time.Now()
		time.Sleep(debounce / 5)
	}
	expect(t, w, "v10")
	if d := time.Since(last); d < debounce {
		t.Errorf("change %v after the last write, before the debounce of %v", d, debounce)
	}
	expectNone(t, w)
}

func TestDefaultDebounce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	w, err := New(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.opts.Debounce != DefaultDebounce || DefaultDebounce != 250*time.Millisecond {
		t.Errorf("default debounce %v", w.opts.Debounce)
	}
	t0 := time.Now()
	write(t, path, "x")
	expect(t, w, "x")
	if d := time.Since(t0); d < DefaultDebounce {
		t.Errorf("change after %v, before the default debounce", d)
	}
}

func TestRenameOver(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	write(t, path, "one")
	w := newWatcher(t, path)
	replace(t, path, "two")
	expect(t, w, "two")
	// The watch survives the replacement: in-place writes to the new file
	// and further replacements are seen.
	write(t, path, "three")
	expect(t, w, "three")
	replace(t, path, "four")
	expect(t, w, "four")
}

func TestDeleteAndRecreate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	write(t, path, "one")
	w := newWatcher(t, path)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	expectGone(t, w)
	expectNone(t, w)
	write(t, path, "one") // the same content as before the deletion is still news
	expect(t, w, "one")
	// Renamed away is gone too.
	if err := os.Rename(path, path+".bak"); err != nil {
		t.Fatal(err)
	}
	expectGone(t, w)
	if err := os.Rename(path+".bak", path); err != nil {
		t.Fatal(err)
	}
	expect(t, w, "one")
}

func TestFileMissingAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	w := newWatcher(t, path)
	expectNone(t, w)
	write(t, path, "new")
	expect(t, w, "new")
}

func TestNoChangeNoEvent(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	write(t, path, "same")
	w := newWatcher(t, path)
	now := time.Now().Add(time.Minute)
	if err := os.Chtimes(path, now, now); err != nil { // touch
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	write(t, path, "same")                          // a save without edits
	replace(t, path, "same")                        // the same, by rename
	write(t, filepath.Join(dir, "other.yaml"), "x") // another file
	write(t, filepath.Join(dir, "rules.yaml~"), "backup")
	expectNone(t, w)
}

// TestConfigMapSymlinks follows a Kubernetes ConfigMap volume: rules.yaml
// -> ..data/rules.yaml, ..data -> ..<timestamp>; an update writes a new
// timestamped directory and swaps ..data by rename.
func TestConfigMapSymlinks(t *testing.T) {
	dir := t.TempDir()
	version := func(name, text string) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, name, "rules.yaml"), text)
		if err := os.Symlink(name, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..2024_01", "v1")
	path := filepath.Join(dir, "rules.yaml")
	if err := os.Symlink("..data/rules.yaml", path); err != nil {
		t.Fatal(err)
	}
	w := newWatcher(t, path)
	version("..2024_02", "v2")
	expect(t, w, "v2")
	if err := os.RemoveAll(filepath.Join(dir, "..2024_01")); err != nil {
		t.Fatal(err)
	}
	expectNone(t, w)
	version("..2024_03", "v3")
	expect(t, w, "v3")
}

// TestSymlinkElsewhere: the rules file is a symlink into another directory,
// whose file is edited in place.
func TestSymlinkElsewhere(t *testing.T) {
	etc, srv := t.TempDir(), t.TempDir()
	target := filepath.Join(srv, "rules.yaml")
	write(t, target, "a")
	path := filepath.Join(etc, "rules.yaml")
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	w := newWatcher(t, path)
	write(t, target, "b")
	expect(t, w, "b")
	replace(t, target, "c")
	expect(t, w, "c")
	// Re-pointing the link to another file is a change too.
	other := filepath.Join(t.TempDir(), "other.yaml")
	write(t, other, "d")
	if err := os.Symlink(other, path+".new"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	expect(t, w, "d")
	write(t, other, "e") // now the new target's directory is watched
	expect(t, w, "e")
	write(t, target, "not watched any more")
	expectNone(t, w)
}

func TestDirectoryRemovedAndRecreated(t *testing.T) {
	old := retryInterval
	retryInterval = 20 * time.Millisecond
	t.Cleanup(func() { retryInterval = old })
	dir := filepath.Join(t.TempDir(), "etc")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "rules.yaml")
	write(t, path, "a")
	w := newWatcher(t, path)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	expectGone(t, w)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, path, "b")
	expect(t, w, "b")
	write(t, path, "c") // and the directory is watched again
	expect(t, w, "c")
}

func TestUnreadableAndTooLarge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	write(t, path, "ok")
	w, err := New(path, Options{Debounce: debounce, MaxSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	write(t, path, "more than eight bytes")
	select {
	case c := <-w.Changes():
		if !c.Exists || c.Err == nil || c.Data != nil {
			t.Fatalf("too large: %+v", c)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no change for a file over MaxSize")
	}
	write(t, path, "fine")
	expect(t, w, "fine")
}

func TestSlowReceiverGetsTheLatest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	w := newWatcher(t, path)
	for _, v := range []string{"1", "2", "3"} {
		write(t, path, v)
		time.Sleep(4 * debounce) // each one a Change nobody receives yet
	}
	expect(t, w, "3")
	expectNone(t, w)
}

func TestCloseClosesChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	w, err := New(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, ok := <-w.Changes(); ok {
		t.Error("Changes not closed")
	}
}

func TestNewNeedsTheDirectory(t *testing.T) {
	if _, err := New(filepath.Join(t.TempDir(), "missing", "rules.yaml"), Options{}); err == nil {
		t.Error("New in a missing directory succeeded")
	}
}
