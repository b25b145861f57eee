package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestAcquireRefusedIsNotUnknown: a claim etcd refuses whole — here the
// user may write lease keys but not audit entries — applied nothing, and
// TryAcquire and TryAcquireMany must say so (outcome.ErrRefused), never
// "unknown"; a lost reply must say unknown.
func TestAcquireRefusedIsNotUnknown(t *testing.T) {
	ctx := context.Background()
	c := e2e.NewCluster(t, e2e.WithAuth("root-pw"))
	root := c.ClientAs(t, e2e.RootUser, "root-pw")
	if _, err := root.RoleAdd(ctx, "no-audit"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		from, to string
		perm     clientv3.PermissionType
	}{
		{"/leasehold/lease/", "/leasehold/lease0", clientv3.PermissionType(clientv3.PermReadWrite)},
		{"/leasehold/done/", "/leasehold/done0", clientv3.PermissionType(clientv3.PermRead)},
	} {
		if _, err := root.RoleGrantPermission(ctx, "no-audit", p.from, p.to, p.perm); err != nil {
			t.Fatal(err)
		}
	}
	c.AddUser(t, "half", "half-pw", "no-audit")
	cli := c.ClientAs(t, "half", "half-pw")
	s, err := session.New(ctx, cli, session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })

	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, outcome.ErrRefused) || errors.Is(err, outcome.ErrUnknown) || !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("%s: %v; want refused (not unknown), wrapping permission denied", what, err)
		}
	}
	_, err = reg.TryAcquire(ctx, s, "t")
	refused("TryAcquire", err)
	_, err = reg.TryAcquireMany(ctx, s, []string{"a", "b"})
	refused("TryAcquireMany", err)
	// The session's marker, put with its first claim, is the session's,
	// not the claims': it goes with the session's etcd lease.
	resp, err := root.Get(ctx, "/leasehold/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if string(kv.Key) != keys.MustNew(keys.DefaultNamespace).Session(int64(s.LeaseID())) {
			t.Errorf("key written by refused claims: %s", kv.Key)
		}
	}
}

// TestAcquireLostReplyIsUnknown is the other half: a claim whose reply is
// lost may have been applied (it was) and must match outcome.ErrUnknown.
func TestAcquireLostReplyIsUnknown(t *testing.T) {
	f := newFixture(t)
	p, reg, s := f.proxied("w1")
	p.BlackholeReplies()
	t.Cleanup(p.Heal) // before the session's Close, which runs later
	for name, call := range map[string]func(ctx context.Context) error{
		"TryAcquire":     func(ctx context.Context) error { _, err := reg.TryAcquire(ctx, s, "one"); return err },
		"TryAcquireMany": func(ctx context.Context) error { _, err := reg.TryAcquireMany(ctx, s, []string{"a", "b"}); return err },
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err := call(ctx)
		cancel()
		if !errors.Is(err, outcome.ErrUnknown) || errors.Is(err, outcome.ErrRefused) {
			t.Errorf("%s with the reply lost: %v; want unknown", name, err)
		}
	}
}
