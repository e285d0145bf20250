package federation

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

// A spoke announces the east-west gateways of its cluster's network: in the
// hello once it knows them, then whenever they change. The hub keeps the last
// set a session announced (a hello without one keeps what the hub holds, so a
// restarting spoke that has not yet found its gateways withdraws nothing).

// GatewaysToProto is the wire form of gateways.
func GatewaysToProto(gws []registry.Gateway) []*fedv1.NetworkGateway {
	if len(gws) == 0 {
		return nil
	}
	out := make([]*fedv1.NetworkGateway, len(gws))
	for i, g := range gws {
		out[i] = &fedv1.NetworkGateway{Address: g.Address, Port: uint32(g.Port)}
	}
	return out
}

// GatewaysFromProto decodes and validates gateways (see registry.NormalizeGateways).
func GatewaysFromProto(pb []*fedv1.NetworkGateway) ([]registry.Gateway, error) {
	if len(pb) > registry.MaxGateways {
		return nil, fmt.Errorf("%w: %d gateways; at most %d", registry.ErrInvalid, len(pb), registry.MaxGateways)
	}
	gws := make([]registry.Gateway, len(pb))
	for i, g := range pb {
		if g.GetPort() > 65535 {
			return nil, fmt.Errorf("%w: gateway %s: port %d is not from 1 to 65535", registry.ErrInvalid, g.GetAddress(), g.GetPort())
		}
		gws[i] = registry.Gateway{Address: g.GetAddress(), Port: int32(g.GetPort())}
	}
	return registry.NormalizeGateways(gws)
}

// SetGateways tells the publisher the gateways the cluster announces for its
// network (none is a valid answer: the cluster announces none). Safe from any
// goroutine; the last set wins. Until the first call the hello says nothing
// about gateways and the hub keeps what it holds. Invalid gateways are
// refused with an error and change nothing.
func (p *Publisher) SetGateways(gws []registry.Gateway) error {
	gws, err := registry.NormalizeGateways(gws)
	if err != nil {
		return err
	}
	p.gwMu.Lock()
	p.gws, p.gwKnown = gws, true
	p.gwMu.Unlock()
	select {
	case p.gwChanged <- struct{}{}:
	default:
	}
	return nil
}

func (p *Publisher) gateways() ([]registry.Gateway, bool) {
	p.gwMu.Lock()
	defer p.gwMu.Unlock()
	return p.gws, p.gwKnown
}

// CapabilityGateways is the hub capability (in its welcome) of taking
// NetworkGateways messages after the hello.
const CapabilityGateways = "gateways"

// sendGateways sends the gateways when they differ from what the session
// last announced, to a hub that takes them.
func (s *spokeSession) sendGateways() error {
	gws, known := s.p.gateways()
	if !known || (s.gwSent && slices.Equal(gws, s.gwLast)) || !s.gwTaken {
		return nil
	}
	err := s.stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Gateways{
		Gateways: &fedv1.NetworkGateways{Gateways: GatewaysToProto(gws)}}})
	if err != nil {
		return fmt.Errorf("send gateways: %w", err)
	}
	s.gwLast, s.gwSent = gws, true
	return nil
}

// sessionGateways reads the hello's gateways into sess. Invalid ones are
// refused: the session goes on, and the hub keeps what it held.
func (h *HubServer) sessionGateways(sess *Session, hello *fedv1.Hello) {
	if hello.GetGateways() == nil {
		return
	}
	gws, err := GatewaysFromProto(hello.GetGateways().GetGateways())
	if err != nil {
		h.refusals.Warn(refusedGateways, "spoke announced invalid gateways; keeping the ones held", "cluster", sess.Cluster, "err", err)
		return
	}
	sess.Gateways, sess.GatewaysKnown = gws, true
}

// gateways applies a session's new gateway announcement.
func (s *hubSession) gateways(ctx context.Context, m *fedv1.NetworkGateways) error {
	gws, err := GatewaysFromProto(m.GetGateways())
	if err != nil {
		s.h.refusals.Warn(refusedGateways, "spoke announced invalid gateways; keeping the ones held", "cluster", s.cluster, "epoch", s.epoch, "err", err)
		return nil
	}
	err = s.h.store.SetGateways(ctx, s.cluster, s.epoch, gws)
	if errors.Is(err, ErrSuperseded) {
		return status.Error(codes.Aborted, err.Error())
	}
	if err != nil {
		s.log.Warn("record gateways", "err", err)
		return nil
	}
	s.log.Info("spoke announced gateways", "gateways", gws)
	return nil
}
