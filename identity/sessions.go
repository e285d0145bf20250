package identity

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/navemesh/nave/internal/streams"
)

// ErrNoLongerHolds ends a session whose credential no longer holds; the
// reason follows it.
var ErrNoLongerHolds = errors.New("identity: the session's credential no longer holds")

// ErrReconnect, in a check's error, says the credential holds but what it
// was granted changed: the session ends with Unavailable, and its client
// reconnects to be served under the new grant.
var ErrReconnect = errors.New("identity: reconnect")

// Sessions are the streams open under a credential. Each holds while its
// check passes and its certificate is valid: Recheck (after credentials
// change) and the passing of time end those that no longer do, with a
// status saying why. Healthy sessions are never touched.
type Sessions struct {
	log   *slog.Logger
	conns *Conns // nil: connections are not closed

	mu   sync.Mutex // guards held
	held map[*held]struct{}
}

type held struct {
	what   string            // who, for the log
	leaf   *x509.Certificate // nil: a token's session
	check  func() error
	cancel context.CancelCauseFunc
}

// NewSessions returns an empty set of sessions; Run ends them on time.
// A session ended for its certificate closes the connections conns (nil:
// none) knows were opened with it.
func NewSessions(log *slog.Logger, conns *Conns) *Sessions {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sessions{log: log, conns: conns, held: map[*held]struct{}{}}
}

// Hold records a session of what (an identity, for the log) opened with
// the client certificate leaf (nil: none; the session then never
// expires) that holds while check passes (nil: always). A check that
// fails already refuses the session, with the reason, and closes the
// connection. The returned context ends with the session; call release
// when the session ends on its own.
func (s *Sessions) Hold(ctx context.Context, what string, leaf *x509.Certificate, check func() error) (context.Context, func(), error) {
	if leaf != nil && !time.Now().Before(leaf.NotAfter) {
		s.closeConns(leaf)
		return nil, nil, status.Error(codes.Unauthenticated, ErrExpired.Error())
	}
	ctx, cancel := context.WithCancelCause(ctx)
	h := &held{what: what, leaf: leaf, check: check, cancel: cancel}
	release := func() {
		s.mu.Lock()
		delete(s.held, h)
		s.mu.Unlock()
		cancel(nil)
	}
	// Held before it is checked: a Recheck from now on sees it, so a
	// credential withdrawn while it is checked cannot slip through.
	s.mu.Lock()
	s.held[h] = struct{}{}
	s.mu.Unlock()
	if check != nil {
		if err := check(); err != nil {
			release()
			if errors.Is(err, ErrReconnect) {
				return nil, nil, status.Error(codes.Unavailable, err.Error())
			}
			s.closeConns(leaf)
			return nil, nil, status.Error(codes.Unauthenticated, err.Error())
		}
	}
	return ctx, release, nil
}

func (s *Sessions) closeConns(leaf *x509.Certificate) {
	if leaf != nil && s.conns != nil {
		s.conns.Close(leaf)
	}
}

// Len is how many sessions are held.
func (s *Sessions) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held)
}

// Recheck ends every session whose credential no longer holds.
func (s *Sessions) Recheck() { s.sweep(time.Now(), true) }

// Run ends sessions as their certificates expire, until ctx ends.
func (s *Sessions) Run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.sweep(now, false)
		}
	}
}

func (s *Sessions) sweep(now time.Time, check bool) {
	s.mu.Lock()
	all := make([]*held, 0, len(s.held))
	for h := range s.held {
		all = append(all, h)
	}
	s.mu.Unlock()
	reconnects := 0
	for _, h := range all {
		var err error
		switch {
		case h.leaf != nil && now.After(h.leaf.NotAfter):
			err = ErrExpired
		case check && h.check != nil:
			err = h.check()
		}
		if err == nil {
			continue
		}
		s.mu.Lock()
		delete(s.held, h)
		s.mu.Unlock()
		if errors.Is(err, ErrReconnect) {
			reconnects++
			h.cancel(err)
			continue
		}
		s.log.Warn("ending a session whose credential no longer holds", "peer", h.what, "err", err)
		h.cancel(errors.Join(ErrNoLongerHolds, err))
		// After the stream's status had a moment to leave: the client
		// reconnects, with a new handshake.
		time.AfterFunc(100*time.Millisecond, func() { s.closeConns(h.leaf) })
	}
	if reconnects > 0 {
		s.log.Info("ended sessions whose grant changed; their clients reconnect", "sessions", reconnects)
	}
}

// Ended turns the error a stream handler returned into the status a
// client should see: when the session ended because its credential no
// longer holds, Unauthenticated with the reason; because its grant
// changed, Unavailable (reconnect); otherwise err.
func Ended(ctx context.Context, err error) error {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, ErrNoLongerHolds):
		return status.Error(codes.Unauthenticated, cause.Error())
	case errors.Is(cause, ErrReconnect):
		return status.Error(codes.Unavailable, cause.Error())
	}
	return err
}

// Stream runs handler on a stream whose context is ctx (from Hold), and
// returns what the client should see (see Ended).
func Stream(ctx context.Context, srv any, stream grpc.ServerStream, handler grpc.StreamHandler) error {
	return Ended(ctx, handler(srv, streams.WithContext(stream, ctx)))
}

// A Grant decides, when a stream starts, what else its session rests on
// than its certificate: it returns the stream's context, carrying what it
// decided, and a check that fails (wrapping ErrReconnect) once that changed.
type Grant func(ctx context.Context) (context.Context, func() error)

// StreamInterceptor holds, in s, every stream whose peer presented a
// client certificate, checked against store: it ends when the certificate
// expires, is revoked or is no longer trusted, or when one of grants
// changed.
func (s *Sessions) StreamInterceptor(store *Store, trustDomain string, grants ...Grant) grpc.StreamServerInterceptor {
	return func(srv any, stream grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		chain := PeerChain(stream.Context())
		if len(chain) == 0 || store == nil {
			return handler(srv, stream)
		}
		who := chain[0].Subject.String()
		if id, err := Of(chain[0]); err == nil {
			who = id.String()
		}
		checks := []func() error{func() error {
			_, err := store.Material().Verify(chain, x509.ExtKeyUsageClientAuth, trustDomain, time.Now())
			return err
		}}
		ctx := stream.Context()
		for _, g := range grants {
			var check func() error
			ctx, check = g(ctx)
			checks = append(checks, check)
		}
		ctx, release, err := s.Hold(ctx, who, chain[0], func() error {
			for _, check := range checks {
				if err := check(); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		defer release()
		return Stream(ctx, srv, stream, handler)
	}
}
