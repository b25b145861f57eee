package skewclock_test

import (
	"time"

	"github.com/leasehold/leasehold/internal/skewclock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A worker whose clock is two days behind: every audit entry it writes
// through cli says a time 48 hours earlier than it is.
func ExampleWrap() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
	if err != nil {
		return
	}
	defer cli.Close()
	skewclock.Wrap(cli, "/leasehold/audit/", -48*time.Hour)
}
