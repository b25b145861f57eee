package fencegrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fencegrpc"
	"github.com/leasehold/leasehold/fence/fencehttp"
)

// A downstream gRPC service fences its calls with the server interceptors;
// lease holders send their token with the client interceptor. After the
// holder of epoch 8 has called, the superseded holder of epoch 7 is refused
// with FailedPrecondition, which Refusal turns back into the guard's error.
// (The standard health service stands in for a service that writes.)
func Example() {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(fencegrpc.UnaryServerInterceptor(fence.NewMemoryGuard())))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(fencegrpc.UnaryClientInterceptor()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	call := func(t fence.Token) error {
		_, err := client.Check(fence.WithToken(context.Background(), t), &healthpb.HealthCheckRequest{})
		return err
	}

	fmt.Println("epoch 8:", call(fence.Token{Resource: "invoices/42", Epoch: 8}))
	err = call(fence.Token{Resource: "invoices/42", Epoch: 7})
	fmt.Println("epoch 7:", status.Code(err))
	if refusal := fencegrpc.Refusal(err); errors.Is(refusal, fence.ErrFenced) {
		fmt.Println("client sees:", refusal)
	}
	// Output:
	// epoch 8: <nil>
	// epoch 7: FailedPrecondition
	// client sees: fenced: resource "invoices/42": epoch 7 is below the current epoch 8
}

func TestMetadataKeys(t *testing.T) {
	if fencegrpc.MetadataKey != "fencing-token" || fencegrpc.MetadataKey != strings.ToLower(fencehttp.Header) {
		t.Errorf("MetadataKey = %q", fencegrpc.MetadataKey)
	}
	if fencegrpc.IdempotencyMetadataKey != "idempotency-key" || fencegrpc.IdempotencyMetadataKey != strings.ToLower(fencehttp.IdempotencyHeader) {
		t.Errorf("IdempotencyMetadataKey = %q", fencegrpc.IdempotencyMetadataKey)
	}
}
