package testbed

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// netnsDir is where iproute2 keeps named network namespaces; using it makes our
// namespaces visible to `ip netns` and usable with `ip netns exec`.
const netnsDir = "/run/netns"

var hostNetNS struct {
	once sync.Once
	fd   int
	err  error
}

// hostNetNSFD returns a descriptor of the network namespace the process started in.
// Every thread we move into a pod's namespace is moved back to this one.
func hostNetNSFD() (int, error) {
	hostNetNS.once.Do(func() {
		done := make(chan struct{})
		// A fresh locked thread that never called setns is certainly in the process's
		// original namespace, unlike the thread that happens to run the caller.
		go func() {
			defer close(done)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			hostNetNS.fd, hostNetNS.err = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		}()
		<-done
	})
	return hostNetNS.fd, hostNetNS.err
}

var netnsDirOnce struct {
	once sync.Once
	err  error
}

// ensureNetnsDir prepares /run/netns the way `ip netns add` does: a shared mount, so
// that bind mounts of namespaces propagate into the mount namespaces `ip netns exec`
// creates.
func ensureNetnsDir() error {
	netnsDirOnce.once.Do(func() {
		if err := os.MkdirAll(netnsDir, 0o755); err != nil {
			netnsDirOnce.err = err
			return
		}
		err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if errors.Is(err, unix.EINVAL) {
			if err = unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
				err = unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
			}
		}
		if err != nil {
			netnsDirOnce.err = fmt.Errorf("prepare %s: %w", netnsDir, err)
		}
	})
	return netnsDirOnce.err
}

// inNetNS runs fn on an OS thread that has entered the namespace nsFD. If the thread
// cannot be moved back, it stays locked so that the Go runtime discards it when the
// goroutine ends, and no other goroutine ever runs in the wrong namespace.
func inNetNS(nsFD int, fn func() error) error {
	host, err := hostNetNSFD()
	if err != nil {
		return fmt.Errorf("open host network namespace: %w", err)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(nsFD, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		ferr := fn()
		if err := unix.Setns(host, unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("return to host network namespace: %w", err))
			return // thread stays locked and dies with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// createNamedNetNS creates a network namespace, pins it at /run/netns/name and returns
// an open descriptor for it.
func createNamedNetNS(name string) (*os.File, error) {
	if err := ensureNetnsDir(); err != nil {
		return nil, err
	}
	host, err := hostNetNSFD()
	if err != nil {
		return nil, fmt.Errorf("open host network namespace: %w", err)
	}
	path := filepath.Join(netnsDir, name)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	unix.Close(fd)

	type result struct {
		file *os.File
		err  error
	}
	resc := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			resc <- result{err: fmt.Errorf("unshare network namespace: %w", err)}
			return
		}
		var res result
		if err := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, ""); err != nil {
			res.err = fmt.Errorf("bind network namespace to %s: %w", path, err)
		} else {
			res.file, res.err = os.Open("/proc/thread-self/ns/net")
		}
		if err := unix.Setns(host, unix.CLONE_NEWNET); err != nil {
			res.err = errors.Join(res.err, fmt.Errorf("return to host network namespace: %w", err))
			resc <- res
			return // thread stays locked and dies with this goroutine
		}
		runtime.UnlockOSThread()
		resc <- res
	}()
	res := <-resc
	if res.err != nil {
		if res.file != nil {
			res.file.Close()
		}
		removeNamedNetNS(name)
		return nil, res.err
	}
	return res.file, nil
}

// removeNamedNetNS unpins a named namespace; the kernel destroys it once no process
// or descriptor refers to it. A namespace that is already gone is not an error.
func removeNamedNetNS(name string) error {
	path := filepath.Join(netnsDir, name)
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// startInNetNS starts cmd with the calling thread inside nsFD, so the child is born in
// that namespace without the fork/exec of `ip netns exec`. The child does not get the
// /etc/netns bind mounts; use it only for tools that do not resolve names.
func startInNetNS(nsFD int, cmd *exec.Cmd) error {
	return inNetNS(nsFD, cmd.Start)
}

// writeSysctl sets a sysctl of the network namespace nsFD; /proc/sys/net resolves to
// the namespace of the thread that opens it.
func writeSysctl(nsFD int, values map[string]string) error {
	return inNetNS(nsFD, func() error {
		for key, value := range values {
			path := "/proc/sys/" + filepathFromSysctl(key)
			if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
				return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
			}
		}
		return nil
	})
}

func filepathFromSysctl(key string) string {
	b := []byte(key)
	for i, c := range b {
		if c == '.' {
			b[i] = '/'
		}
	}
	return string(b)
}
