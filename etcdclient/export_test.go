package etcdclient

// MinKeepAliveTime is the shortest time WithKeepAlive accepts, for the
// tests in package etcdclient_test.
const MinKeepAliveTime = minKeepAliveTime
