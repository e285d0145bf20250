package federation

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	fedv1 "github.com/navemesh/nave/federation/v1"
)

// Receive reads ahead of a busy loop, up to its byte budget, and reports the
// stream's end only after every message before it.
func TestReceiveReadsAheadWithinABudget(t *testing.T) {
	big := &fedv1.ImportUpdate{Nonce: string(make([]byte, maxQueuedBytes/4))} // a quarter of the budget each
	reads := make(chan int, 100)
	n := 0
	end := errors.New("end of stream")
	recv := func() (*fedv1.ImportUpdate, error) {
		if n == 10 {
			return nil, end
		}
		n++
		reads <- n
		return big, nil
	}
	msgs, errc := Receive(t.Context(), recv)
	// Nothing is taken: reading goes on until the budget is passed, then pauses.
	deadline := time.After(10 * time.Second)
	for read := 0; read < 5; {
		select {
		case read = <-reads:
		case <-deadline:
			t.Fatalf("read %d messages ahead of a busy loop, want 5 (the budget, passed by one)", read)
		}
	}
	select {
	case r := <-reads:
		t.Fatalf("read message %d past the budget before the loop took any", r)
	case <-time.After(100 * time.Millisecond): // an observation window: nothing may happen
	}
	for i := range 10 {
		select {
		case <-msgs:
		case err := <-errc:
			t.Fatalf("the error came before message %d: %v", i+1, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("message %d never came", i+1)
		}
	}
	if err := <-errc; !errors.Is(err, end) {
		t.Errorf("errc = %v, want the stream's end", err)
	}
}

// Empty messages count too: a flood of them queues at most the budget's
// worth of queuedMessageBytes each (an empty digest is 2 bytes on the wire
// and about 160 in memory; counted by wire size, 80 times the budget of
// them would have queued).
func TestReceiveBoundsEmptyMessages(t *testing.T) {
	empty := &fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Digest{Digest: &fedv1.Digest{}}}
	bound := maxQueuedBytes/messageSize(empty) + 2 // the budget, passed by one, and the one waiting to be taken
	// What the queue holds must stay within the budget: an empty digest
	// holds about 160 bytes.
	held := maxQueuedBytes/160 + 2
	var n atomic.Int64
	over := make(chan struct{})
	recv := func() (*fedv1.SpokeMessage, error) {
		if n.Add(1) == int64(held+1) {
			close(over)
		}
		return empty, nil
	}
	_, _ = Receive(t.Context(), recv)
	// Nothing is taken: reading reaches the bound, then pauses.
	for deadline := time.Now().Add(time.Minute); n.Load() < int64(bound); time.Sleep(time.Millisecond) {
		select {
		case <-over:
			t.Fatalf("queued more than %d empty messages (%d bytes held, the budget is %d) before the loop took any", held, held*160, maxQueuedBytes)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("read %d empty messages ahead of a busy loop, want %d", n.Load(), bound)
		}
	}
	select {
	case <-over:
		t.Fatalf("queued more than %d empty messages (%d bytes held, the budget is %d) before the loop took any", held, held*160, maxQueuedBytes)
	case <-time.After(100 * time.Millisecond): // an observation window: nothing may happen
	}
}
