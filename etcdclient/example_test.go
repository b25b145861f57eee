package etcdclient_test

import (
	"context"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/etcdclient"
	"github.com/leasehold/leasehold/session"
)

// Example builds the recommended client for a three-member cluster, with
// every member's endpoint, and starts a session on it.
func Example() {
	cluster, err := e2e.Start("", e2e.WithMembers(3))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()

	// In production: etcdclient.WithTLS, etcdclient.WithAuth and
	// etcdclient.WithLogger(logger.Named("etcd")) too.
	cli, err := etcdclient.New(cluster.Endpoints())
	if err != nil {
		panic(err)
	}
	defer cli.Close()

	ctx := context.Background()
	s, err := session.New(ctx, cli, session.WithWorker("worker-1"), session.WithTTL(5*time.Second))
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)
	fmt.Println("endpoints:", len(cli.Endpoints()))
	fmt.Println("session live:", s.Context().Err() == nil)
	// Output:
	// endpoints: 3
	// session live: true
}

// ExampleConfig adjusts the recommended configuration for a client that
// reaches the cluster through a load balancer, whose address is not a
// member's own URL: auto-sync would replace it with the members' URLs.
func ExampleConfig() {
	cfg, err := etcdclient.Config([]string{"https://etcd.example.com:2379"}, etcdclient.WithAutoSync(0))
	if err != nil {
		panic(err)
	}
	fmt.Println("dial timeout:", cfg.DialTimeout)
	fmt.Println("keepalive:", cfg.DialKeepAliveTime, cfg.DialKeepAliveTimeout)
	fmt.Println("auto-sync:", cfg.AutoSyncInterval)
	// Output:
	// dial timeout: 5s
	// keepalive: 10s 5s
	// auto-sync: 0s
}

// ExampleWithKeepAlive shows the rule grpc-go imposes: a keepalive time
// below 10s is refused rather than silently raised.
func ExampleWithKeepAlive() {
	_, err := etcdclient.Config([]string{"127.0.0.1:2379"}, etcdclient.WithKeepAlive(2*time.Second, 6*time.Second))
	fmt.Println(err)
	// Output:
	// etcdclient: WithKeepAlive(2s, 6s): time must be at least 10s: grpc-go raises a shorter one to it
}
