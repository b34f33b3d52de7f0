package api

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestSavedRulesPrecedence(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	config := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(config, []byte("file"), 0o600); err != nil {
		t.Fatal(err)
	}
	at := func(path string, tm time.Time) {
		t.Helper()
		if err := os.Chtimes(path, tm, tm); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now().Add(-time.Hour)
	at(config, t0)

	if text, _, err := SavedRules(state, config); text != nil || err != nil {
		t.Fatalf("nothing saved: %q %v", text, err)
	}
	if err := SaveRules(state, []byte("from the api")); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{state: os.ModeDir | 0o700, filepath.Join(state, StateFile): 0o600} {
		if fi, err := os.Stat(p); err != nil || fi.Mode() != want {
			t.Errorf("%s: %v %v, want %v", p, fi.Mode(), err, want)
		}
	}
	at(filepath.Join(state, StateFile), t0.Add(time.Minute))
	text, saved, err := SavedRules(state, config)
	if string(text) != "from the api" || err != nil || !saved.Equal(t0.Add(time.Minute)) {
		t.Errorf("API rules newer than the file: %q %v %v", text, saved, err)
	}
	// The rules file edited after: it wins.
	at(config, t0.Add(2*time.Minute))
	if text, _, err := SavedRules(state, config); text != nil || err != nil {
		t.Errorf("file newer than the API rules: %q %v", text, err)
	}
	// No rules file at all: the API rules win.
	if err := os.Remove(config); err != nil {
		t.Fatal(err)
	}
	if text, _, err := SavedRules(state, config); string(text) != "from the api" || err != nil {
		t.Errorf("no rules file: %q %v", text, err)
	}
	// Saving again replaces; forgetting removes (twice is fine).
	if err := SaveRules(state, []byte("v2")); err != nil {
		t.Fatal(err)
	}
	if text, _, _ := SavedRules(state, config); string(text) != "v2" {
		t.Errorf("after a second save: %q", text)
	}
	if ents, _ := os.ReadDir(state); len(ents) != 1 {
		t.Errorf("temporary files left: %v", ents)
	}
	if err := ForgetRules(state); err != nil {
		t.Fatal(err)
	}
	if err := ForgetRules(state); err != nil {
		t.Errorf("second forget: %v", err)
	}
	if text, _, err := SavedRules(state, config); text != nil || err != nil {
		t.Errorf("after forget: %q %v", text, err)
	}
}
