package fence_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/leasehold/leasehold/fence"
)

// A worker whose lease expired comes back with its old token after a new
// holder has written; the guard refuses it.
func Example() {
	ctx := context.Background()
	g := fence.NewMemoryGuard()
	store := map[string]string{}

	write := func(header, value string) error {
		t, err := fence.ParseToken(header)
		if err != nil {
			return err
		}
		return g.Do(ctx, t, func(context.Context) error {
			store[t.Resource] = value
			return nil
		})
	}

	old := fence.Token{Resource: "reports/q1", Epoch: 7}
	next := fence.Token{Resource: "reports/q1", Epoch: 8}

	fmt.Println(write(old.String(), "draft from the old holder"))
	fmt.Println(write(next.String(), "final from the new holder"))
	err := write(old.String(), "late write from the old holder")
	fmt.Println(errors.Is(err, fence.ErrFenced))
	fmt.Println(err)
	fmt.Println(store["reports/q1"])
	// Output:
	// <nil>
	// <nil>
	// true
	// fenced: resource "reports/q1": epoch 7 is below the current epoch 8
	// final from the new holder
}

func ExampleParseToken() {
	t, err := fence.ParseToken("42:orders%3Aeu-west")
	fmt.Println(t.Resource, t.Epoch, err)

	_, err = fence.ParseToken("42:orders:eu-west")
	fmt.Println(errors.Is(err, fence.ErrMalformedToken))
	// Output:
	// orders:eu-west 42 <nil>
	// true
}

func ExampleToken_String() {
	t := fence.Token{Resource: "jobs/nightly report", Epoch: 3}
	fmt.Println(t)
	// Output: 3:jobs/nightly%20report
}

// The same holder retrying the same effect (its first reply was lost) sends
// the same idempotency key, so the downstream can answer the retry without
// charging twice; another effect, or a new holder, gets a different key.
func ExampleIdempotencyKey() {
	holder := fence.Token{Resource: "orders/1001", Epoch: 42}
	first := fence.IdempotencyKey(holder, "charge")
	retry := fence.IdempotencyKey(holder, "charge")
	refund := fence.IdempotencyKey(holder, "refund")
	next := fence.IdempotencyKey(fence.Token{Resource: "orders/1001", Epoch: 43}, "charge")

	fmt.Println(len(first), "hex characters")
	fmt.Println("retry reuses the key:", retry == first)
	fmt.Println("other effect, same key:", refund == first)
	fmt.Println("new holder, same key:", next == first)

	// With the key in the context as well as the token, fencehttp's
	// transport (and fencegrpc's client interceptors) send both with every
	// attempt.
	ctx := fence.WithIdempotencyKey(fence.WithToken(context.Background(), holder), first)
	key, _ := fence.IdempotencyKeyFrom(ctx)
	fmt.Println("in the context:", key == first)
	// Output:
	// 64 hex characters
	// retry reuses the key: true
	// other effect, same key: false
	// new holder, same key: false
	// in the context: true
}
