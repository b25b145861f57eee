package model_test

import (
	"fmt"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/model"
)

// etcd grants whole seconds: the run's sessions renew on what it grants.
func ExampleGrantedTTL() {
	fmt.Println(model.GrantedTTL(1500 * time.Millisecond))
	// Output: 2s
}
