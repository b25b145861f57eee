package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
)

// TestPrefixClaimRequiresTheTaskKey: a Prefix task offered from a page
// read before its key was deleted (its completion, or its owner) is not
// claimed: the claim's condition requires the key, in the claim's own
// transaction, and a task whose key exists is claimed as usual.
func TestPrefixClaimRequiresTheTaskKey(t *testing.T) {
	cli := e2e.NewCluster(t).Client(t)
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
	s, err := session.New(context.Background(), cli, session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	src := Prefix(cli, "/jobs/").(*prefixSource)
	if _, err := cli.Put(t.Context(), "/jobs/here", "{}"); err != nil {
		t.Fatal(err)
	}
	claim := func(name string) (*lease.Lease, error) {
		return reg.TryAcquire(protocol.WithCondition(t.Context(), src.claimCondition(name)...), s, name)
	}
	if _, err := claim("gone"); !errors.Is(err, protocol.ErrConditionFailed) {
		t.Fatalf("claim of a task whose key is gone: %v, want ErrConditionFailed", err)
	}
	if _, err := reg.Holder(t.Context(), "gone"); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("gone: %v, want never claimed", err)
	}
	if l, err := claim("here"); err != nil || l == nil {
		t.Fatalf("claim of a task whose key exists: %v", err)
	}
}
