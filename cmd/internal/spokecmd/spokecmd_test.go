package spokecmd

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/navemesh/nave/spoke"
)

// Flags that cannot work are refused with a message naming them, before
// anything starts.
func TestRunRefusesFlagsThatCannotWork(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	base := []string{"--cluster-id=east", "--hub=127.0.0.1:1"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--source=kube", "--kubeconfig=/dev/null", "--renew-deadline=20s"}, "LeaseDuration 15s is not longer than RenewDeadline 20s"},
		{[]string{"--source=kube", "--kubeconfig=/dev/null", "--retry-period=10s"}, "RenewDeadline 10s is not longer than RetryPeriod 10s"},
		{[]string{"--source=kube", "--kubeconfig=/dev/null", "--retry-period=0s"}, "--retry-period < --renew-deadline < --lease-duration: RetryPeriod 0s is not positive"},
		{[]string{"--source=dir:/nonexistent", "--poll=1ms"}, "--poll must be at least 10ms"},
		{nil, "--source is required outside a pod"},
		{[]string{"--source=dir:/x", "--export=some"}, `--export "some"`},
		{[]string{"--source=dir:/x", "--network-gateway=1.2.3.4:15443"}, "--network-gateway needs --network"},
	} {
		err := Run(t.Context(), append(append([]string{}, base...), tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("nave spoke %s: %v, want an error with %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}

// Spokes started without --spoke-id must not all be named for the machine.
func TestDefaultSpokeIDIsPerProcess(t *testing.T) {
	t.Setenv("POD_NAME", "nave-spoke-5c9d-x2k4q")
	if got := spoke.DefaultConfig().Federation.SpokeID; got != "nave-spoke-5c9d-x2k4q" {
		t.Errorf("in a pod: spoke ID %q, want the pod's name", got)
	}
	t.Setenv("POD_NAME", "")
	host, _ := os.Hostname()
	got := spoke.DefaultConfig().Federation.SpokeID
	if got == host || !strings.HasSuffix(got, fmt.Sprintf("-%d", os.Getpid())) {
		t.Errorf("outside a pod: spoke ID %q, want the host name %q and this process's ID", got, host)
	}
}
