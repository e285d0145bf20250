package kubetest

import (
	"fmt"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// dieWithParent makes the kernel kill a child process when the thread that
// started it exits, so API servers do not outlive a test binary that panicked
// or was killed.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// inNetns runs fn on an OS thread switched into the network namespace at
// path (sockets it creates stay there). The thread is dedicated to fn: should
// switching back fail, it stays locked and dies with its goroutine instead of
// running other code in the wrong namespace.
func inNetns(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		restored := true
		defer func() {
			if restored {
				runtime.UnlockOSThread()
			}
		}()
		errc <- func() error {
			self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
			if err != nil {
				return fmt.Errorf("open own network namespace: %w", err)
			}
			defer self.Close()
			target, err := os.Open(path)
			if err != nil {
				return fmt.Errorf("open network namespace: %w", err)
			}
			defer target.Close()
			if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("enter network namespace %s: %w", path, err)
			}
			fnErr := fn()
			if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
				restored = false
				return fmt.Errorf("leave network namespace %s: %w", path, err)
			}
			return fnErr
		}()
	}()
	return <-errc
}
