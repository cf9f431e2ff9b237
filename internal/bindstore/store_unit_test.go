package bindstore

import (
	"testing"
	"time"
)

func TestStoreKeyAndValue(t *testing.T) {
	s := &Store{keyPre: "lmw:m:b:"}
	for _, tc := range []struct {
		h    uint64
		want string
	}{
		{0, "lmw:m:b:0000000000000000"},
		{1, "lmw:m:b:0000000000000001"},
		{0xabc, "lmw:m:b:0000000000000abc"},
		{^uint64(0), "lmw:m:b:ffffffffffffffff"},
	} {
		if got := s.key(tc.h); got != tc.want {
			t.Errorf("key(%x) = %q, want %q", tc.h, got, tc.want)
		}
	}
	for _, tc := range []struct {
		in   string
		want storeValue
		ok   bool
	}{
		{"5eed 10.0.0.5:8000", storeValue{replica: "10.0.0.5:8000", start: 0x5eed}, true},
		{"0 10.0.0.5:8000#3", storeValue{replica: "10.0.0.5:8000#3"}, true},
		{"10.0.0.5:8000", storeValue{}, false},
		{"zz 10.0.0.5:8000", storeValue{}, false},
		{"0 ", storeValue{}, false},
	} {
		got, ok := parseStoreValue(tc.in)
		if ok != tc.ok || got != tc.want {
			t.Errorf("parse(%q) = %+v %v, want %+v %v", tc.in, got, ok, tc.want, tc.ok)
		}
		if ok {
			if back, _ := parseStoreValue(got.String()); back != got {
				t.Errorf("round trip of %q: %+v", tc.in, back)
			}
		}
	}
	if storeHash("a") == storeHash("b") || storeHash("session") != storeHash("session") {
		t.Error("storeHash is not a function of the key")
	}
}

// TestKey: Key names the key the store writes a conversation's binding to.
func TestKey(t *testing.T) {
	s := &Store{keyPre: "lmw:m:b:"}
	if got, want := Key("lmw:", "m", "session-1"), s.key(storeHash("session-1")); got != want {
		t.Fatalf("Key = %q, want %q", got, want)
	}
}

// TestConfigResolved: placeholders are replaced and defaults filled in.
func TestConfigResolved(t *testing.T) {
	t.Setenv("LMW_TEST_REDIS_PASSWORD", "s3cret")
	c := Config{Password: "{env.LMW_TEST_REDIS_PASSWORD}"}.Resolved()
	if c.Type != "redis" || c.Password != "s3cret" || c.Address != DefaultAddress || c.Prefix != DefaultPrefix || time.Duration(c.Timeout) != DefaultTimeout {
		t.Fatalf("resolved %+v", c)
	}
	if err := c.Validate("m"); err != nil {
		t.Fatal(err)
	}
}
