package prereq

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// LocalSubstrate names the items every study on the local testbed needs, whatever its
// meshes: namespaces and veths, service VIPs, processes under their own uid.
var LocalSubstrate = []string{"ip", "iptables", "setpriv"}

// Lookup returns the item with the given name.
func Lookup(name string) (Item, bool) {
	for _, it := range Items() {
		if it.Name == name {
			return it, true
		}
	}
	return Item{}, false
}

// HowToInstall says what gets the item onto this machine: `meshmark setup`, or the
// hint for items setup cannot install by itself.
func (it Item) HowToInstall() string {
	if it.Install == "" {
		return it.Hint
	}
	if strings.HasPrefix(it.Install, "apt-get") {
		return "run `meshmark setup` to install it with apt (`meshmark doctor` shows the command)"
	}
	return fmt.Sprintf("run `meshmark setup` to install it into %s (`meshmark doctor` shows the command)", ToolsDir())
}

// Problem describes a status that is not OK in one line for an error message: the
// item, what it is for, what is wrong and how to install it. It is "" when OK.
func (s Status) Problem() string {
	if s.OK() {
		return ""
	}
	where := ""
	if s.Path != "" {
		where = " at " + s.Path
		if s.Version != "" {
			where += " (" + s.Version + ")"
		}
	}
	return fmt.Sprintf("%s (%s): %v%s; %s", s.Item.Name, s.Item.Purpose, s.Err, where, s.Item.HowToInstall())
}

// CheckNamed checks the named items (KernelPrefix names a kernel module); a name that
// is not a known item is reported as such, since a profile naming it would otherwise
// pass preflight and fail later.
func CheckNamed(ctx context.Context, names ...string) (found []Status, unknown []string) {
	for _, n := range names {
		if mod, ok := strings.CutPrefix(n, KernelPrefix); ok {
			it := Item{Name: n, Purpose: "a kernel feature a mesh profile uses",
				Hint: "load it with `modprobe " + mod + "`, or use a kernel built with it"}
			found = append(found, Status{Item: it, Err: CheckKernelModule(mod)})
			continue
		}
		it, ok := Lookup(n)
		if !ok {
			unknown = append(unknown, n)
			continue
		}
		found = append(found, Check(ctx, it))
	}
	return found, unknown
}

// KernelPrefix marks a prerequisite that is a kernel feature rather than a binary: a
// module that is loaded, built in, or installed to be loaded, e.g. "kernel:xt_TPROXY".
const KernelPrefix = "kernel:"

// CheckKernelModule reports whether the module is loaded, built in or loadable on the
// running kernel, with what is wrong otherwise.
func CheckKernelModule(name string) error {
	norm := func(s string) string { return strings.ReplaceAll(s, "-", "_") }
	want := norm(name)
	if b, err := os.ReadFile("/proc/modules"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 0 && norm(f[0]) == want {
				return nil
			}
		}
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return err
	}
	release := unix.ByteSliceToString(uts.Release[:])
	dir := filepath.Join("/lib/modules", release)
	for _, list := range []string{"modules.builtin", "modules.dep"} {
		b, err := os.ReadFile(filepath.Join(dir, list))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			path, _, _ := strings.Cut(line, ":")
			base := filepath.Base(path)
			if i := strings.Index(base, ".ko"); i > 0 && norm(base[:i]) == want {
				return nil
			}
		}
	}
	return fmt.Errorf("kernel module %s is neither loaded, built in nor installed for kernel %s (see %s)", name, release, dir)
}
