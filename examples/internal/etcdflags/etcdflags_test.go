package etcdflags

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
)

func TestConnPassword(t *testing.T) {
	t.Setenv("LEASEHOLD_PASSWORD", "")
	if _, err := (Flags{User: "example"}).Conn(); err == nil {
		t.Fatal("a user without a password accepted")
	}
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("secret\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (Flags{User: "example", Password: "x", PasswordFile: pw}).Conn(); err == nil {
		t.Fatal("-password and -password-file together accepted")
	}
	c, err := Flags{User: "example", PasswordFile: pw}.Conn()
	if err != nil || c.password != "secret" {
		t.Fatalf("password from file: %q, %v", c.password, err)
	}
	t.Setenv("LEASEHOLD_PASSWORD", "from-env")
	if c, err := (Flags{User: "example"}).Conn(); err != nil || c.password != "from-env" {
		t.Fatalf("password from the environment: %q, %v", c.password, err)
	}
}

func TestProxyTarget(t *testing.T) {
	plain, err := Flags{Endpoints: "127.0.0.1:2379,127.0.0.1:2380"}.Conn()
	if err != nil {
		t.Fatal(err)
	}
	if len(plain.Endpoints) != 2 {
		t.Fatalf("endpoints %v", plain.Endpoints)
	}
	for _, c := range []struct{ in, want string }{
		{"127.0.0.1:2379", "http://127.0.0.1:2379"},
		{"https://127.0.0.1:2379", "https://127.0.0.1:2379"},
	} {
		if got := plain.ProxyTarget(c.in); got != c.want {
			t.Errorf("ProxyTarget(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if got := (Conn{TLS: &tls.Config{}}).ProxyTarget("127.0.0.1:2379"); got != "https://127.0.0.1:2379" {
		t.Errorf("with TLS: ProxyTarget = %q", got)
	}
}
