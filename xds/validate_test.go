package xds

import (
	"errors"
	"strings"
	"testing"

	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/types/known/anypb"
)

// ValidateAll passes an empty HttpConnectionManager inside a listener's
// filter chain; ValidateDeep does not.
func TestValidateDeepLooksInsideTypedConfig(t *testing.T) {
	good := Listener(echo, tcp("grpc", 8080))
	if err := ValidateDeep(good); err != nil {
		t.Fatalf("a listener Nave builds: %v", err)
	}
	empty := &listener.Listener{
		Name:    "in",
		Address: socketAddress("0.0.0.0", 15443),
		FilterChains: []*listener.FilterChain{{Filters: []*listener.Filter{{
			Name:       wellknown.HTTPConnectionManager,
			ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(&hcm.HttpConnectionManager{})},
		}}}},
	}
	if err := Validate(empty); err != nil {
		t.Fatalf("ValidateAll was expected to pass this (it does not look inside typed_config): %v", err)
	}
	err := ValidateDeep(empty)
	if !errors.Is(err, ErrInvalidResource) || !strings.Contains(err.Error(), "HttpConnectionManager") {
		t.Errorf("ValidateDeep(empty HCM in a filter chain) = %v, want an invalid HttpConnectionManager", err)
	}
	unknown := &listener.Listener{
		Name:    "in",
		Address: socketAddress("0.0.0.0", 15443),
		FilterChains: []*listener.FilterChain{{Filters: []*listener.Filter{{
			Name:       "mystery",
			ConfigType: &listener.Filter_TypedConfig{TypedConfig: &anypb.Any{TypeUrl: "type.googleapis.com/no.such.Type"}},
		}}}},
	}
	if err := ValidateDeep(unknown); !errors.Is(err, ErrInvalidResource) {
		t.Errorf("ValidateDeep(unknown typed_config) = %v, want ErrInvalidResource", err)
	}
}
