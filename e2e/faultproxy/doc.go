// Package faultproxy is a TCP fault proxy to put between etcd clients and
// one etcd member, for tests and demos that need the network to misbehave:
// a partition (Blackhole), replies lost after their requests were applied
// (BlackholeReplies), and latency (Delay). Heal undoes them all.
//
// It is built on etcd's pkg/proxy, which needs only etcd's client/pkg and
// zap: it does not link etcd's server, so a program or test that only
// needs the proxy stays small. Package e2e, which runs embedded etcd
// clusters, re-exports it as e2e.Proxy.
//
// A test points a client at the proxy instead of the member, then cuts it
// off:
//
//	p := faultproxy.New(t, "http://127.0.0.1:2379") // closed at test cleanup
//	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Endpoint()}})
//	...
//	p.Blackhole() // no request or keep-alive of cli reaches the member
//	...
//	p.Heal() // the bytes held meanwhile are delivered
//
// The proxy forwards bytes and does not look at them, so it serves any TCP
// protocol, and clients of an https member speak TLS through it, end to end
// with the member.
package faultproxy
