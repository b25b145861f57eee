package retry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/retry"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

var errLost = errors.New("lost")

// TestIdempotentStops: the tries, a compacted revision, a control's Once
// and the context's end each stop the sends, and the error returned is
// the last one.
func TestIdempotentStops(t *testing.T) {
	p := retry.Idempotent{Tries: 3, Attempt: time.Second, Backoff: time.Millisecond}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name  string
		p     retry.Idempotent
		ctx   context.Context
		fail  []error // the errors of the sends, in turn; then success
		sends int
		want  error
	}{
		{"success at once", p, context.Background(), nil, 1, nil},
		{"success at the third", p, context.Background(), []error{errLost, errLost}, 3, nil},
		{"tries spent", p, context.Background(), []error{errLost, errLost, errLost, errLost}, 3, errLost},
		{"compacted", p, context.Background(), []error{rpctypes.ErrCompacted, errLost}, 1, rpctypes.ErrCompacted},
		{"once", retry.Idempotent{Tries: 3, Attempt: time.Second, Once: func() bool { return true }}, context.Background(), []error{errLost}, 1, errLost},
		{"context ended", p, cancelled, []error{errLost, errLost}, 1, errLost},
	} {
		sends := 0
		err := c.p.Do(c.ctx, func(actx context.Context) error {
			if _, ok := actx.Deadline(); !ok {
				t.Errorf("%s: an attempt without a deadline", c.name)
			}
			sends++
			if sends <= len(c.fail) {
				return c.fail[sends-1]
			}
			return nil
		})
		if sends != c.sends || !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s: %d sends, %v; want %d, %v", c.name, sends, err, c.sends, c.want)
		}
	}
}

func ExampleIdempotent() {
	sends := 0
	err := retry.Idempotent{Tries: 3, Attempt: time.Second, Backoff: time.Millisecond}.Do(context.Background(), func(ctx context.Context) error {
		sends++
		if sends < 2 {
			return errLost // a reply lost: the read is sent again
		}
		return nil
	})
	fmt.Println(sends, err)
	// Output: 2 <nil>
}
