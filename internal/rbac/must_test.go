package rbac_test

// must returns v, and panics — failing the test — when err is not nil: for
// constructors used inline, whose errors these tests do not expect.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
