package relay

import (
	"context"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/navemesh/nave/internal/nettest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/xds"
)

// TestRelayReconnectsSoonAfterTheHubAnswersAgain: the hub goes away while
// the relay's backoff, or its connection's, is at a minute; it comes back
// on the same address, and the relay's next stream opens soon after, not
// when the backoff ends.
func TestRelayReconnectsSoonAfterTheHubAnswersAgain(t *testing.T) {
	for _, tc := range []struct {
		name string
		// failures is how many streams end with the hub away before it comes back.
		failures float64
		config   func(*setup)
	}{{
		name: "its own backoff", failures: 1,
		config: func(c *setup) { c.BackoffMin, c.BackoffMax = time.Minute, time.Minute },
	}, {
		// The relay's backoff grows toward a minute while the connection's
		// is at one from its first failed attempt (grpc's own grows to 120 s).
		name: "its connection's backoff", failures: 8,
		config: func(c *setup) {
			c.BackoffMin, c.BackoffMax = 10*time.Millisecond, time.Minute
			c.DialOptions = append(c.DialOptions, grpc.WithConnectParams(grpc.ConnectParams{
				Backoff: backoff.Config{BaseDelay: time.Minute, Multiplier: 1, MaxDelay: time.Minute}, MinConnectTimeout: 20 * time.Second,
			}))
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			addr, err := nettest.FreeAddr()
			if err != nil {
				t.Fatal(err)
			}
			h := startHub(t, addr, registry.New())
			_, reg, relayAddr := startRelay(t, addr, loc("r1", "z1"), tc.config)
			_ = openRaw(ctx, t, relayAddr, "c", resource.ListenerType, xds.ListenerName(echo, grpcPort.Port))
			waitFor(ctx, t, "the relay's stream to the hub", func() bool { return len(h.nodeIDs()) > 0 })

			h.stop()
			waitFor(ctx, t, "streams ended with the hub away", func() bool {
				return metricValue(t, reg, MetricUpstreamReconnects, "") >= tc.failures
			})

			back := startHub(t, addr, registry.New())
			returned := time.Now()
			soon, cancelSoon := context.WithTimeout(ctx, 15*time.Second)
			defer cancelSoon()
			waitFor(soon, t, "a stream to the hub back on its address within 15s", func() bool { return len(back.nodeIDs()) > 0 })
			t.Logf("reconnected %v after the hub came back", time.Since(returned).Round(time.Millisecond))
		})
	}
}
