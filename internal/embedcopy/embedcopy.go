// Package embedcopy puts files that are embedded in the meshmark binary on disk, for
// code that reads them from there: Helm loads a chart, and resolves its file://
// dependencies, from a directory. The copy is named by a digest of the files, so a copy
// on disk is never another version's or a modified one's, and it is written once.
package embedcopy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// Digest is a SHA-256 over every file's path and contents.
func Digest(files fs.FS) string {
	h := sha256.New()
	var paths []string
	_ = fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			paths = append(paths, p)
		}
		return err
	})
	sort.Strings(paths)
	for _, p := range paths {
		b, _ := fs.ReadFile(files, p)
		fmt.Fprintf(h, "%s\x00%d\x00", p, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Dir returns a directory holding a copy of files, written under the user's cache
// directory (the temporary directory when there is none) the first time, as
// meshmark/NAME-DIGEST. marker is a file of the copy whose presence means the copy is
// complete.
func Dir(files fs.FS, name, marker string) (string, error) {
	base, err := os.UserCacheDir()
	if err != nil || os.MkdirAll(base, 0o755) != nil {
		base = os.TempDir()
	}
	dir := filepath.Join(base, "meshmark", name+"-"+Digest(files)[:12])
	if _, err := os.Stat(filepath.Join(dir, marker)); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	// Written beside and renamed into place, so that a concurrent or interrupted
	// extraction never leaves a half-written copy under the final name.
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+name+"-")
	if err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	defer os.RemoveAll(tmp)
	err = fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dst := filepath.Join(tmp, filepath.FromSlash(p))
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := fs.ReadFile(files, p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, marker)); serr == nil {
			return dir, nil // another process put it there first
		}
		return "", fmt.Errorf("%s: %w", name, err)
	}
	return dir, nil
}
