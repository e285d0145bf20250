package hub_test

import (
	"strings"
	"testing"

	"github.com/navemesh/nave/hub"
)

// A caller's nested bounds are checked with the flags: a zero message bound
// or hello timeout would refuse every spoke, and a negative rate means nothing.
func TestValidateChecksNestedBounds(t *testing.T) {
	cfg := hub.DefaultConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the default configuration: %v", err)
	}
	cfg.Federation.MaxMessageBytes = 0
	cfg.Federation.UpdateBurst = -1
	err := cfg.Validate()
	for _, want := range []string{"Federation.MaxMessageBytes, MaxFullStateBytes and HelloTimeout must be positive (0,", "burst -1"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
}
