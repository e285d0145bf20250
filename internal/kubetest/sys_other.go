//go:build !linux

package kubetest

import (
	"errors"
	"syscall"
)

// dieWithParent has no portable equivalent of Linux's parent-death signal.
func dieWithParent() *syscall.SysProcAttr { return nil }

// inNetns needs Linux network namespaces.
func inNetns(string, func() error) error {
	return errors.New("network namespaces need Linux")
}
