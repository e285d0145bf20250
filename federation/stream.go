package federation

import "context"

// receive runs recv in a goroutine of its own, so a session loop can select on
// messages next to its other inputs. The goroutine ends at the first error
// (sent on errc) or when ctx ends.
func receive[T any](ctx context.Context, recv func() (T, error)) (msgs <-chan T, errc <-chan error) {
	out := make(chan T)
	errs := make(chan error, 1)
	go func() {
		for {
			m, err := recv()
			if err != nil {
				errs <- err
				return
			}
			select {
			case out <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, errs
}
