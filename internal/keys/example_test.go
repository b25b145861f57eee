package keys_test

import (
	"fmt"

	"github.com/leasehold/leasehold/internal/keys"
)

func Example() {
	s := keys.MustNew(keys.DefaultNamespace)
	fmt.Println(s.Lease("orders/42"))
	fmt.Println(s.AuditEnd("orders/42", 7))
	// Output:
	// /leasehold/lease/orders%2F42
	// /leasehold/audit/orders%2F42/end/00000000000000000007
}
