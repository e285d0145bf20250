package hub

import (
	"testing"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/syncstatus"
)

// The admin API shows the hub's data in its own types (syncstatus, xds,
// convergence and federation use adminapi's), so only the client states,
// constants of both packages, can differ.
func TestAdminClientStates(t *testing.T) {
	if adminapi.Nacked != syncstatus.Nacked || adminapi.Stale != syncstatus.Stale || adminapi.Synced != syncstatus.Synced {
		t.Error("adminapi's client states are not syncstatus's")
	}
}
