package load

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	s, err := ParseSteps("100:1000:100:10s")
	if err != nil || s.From != 100 || s.To != 1000 || s.Step != 100 || s.Each != 10*time.Second {
		t.Fatalf("ParseSteps = %+v, %v", s, err)
	}
	r, err := ParseRamp("10:2000")
	if err != nil || r.From != 10 || r.To != 2000 {
		t.Fatalf("ParseRamp = %+v, %v", r, err)
	}
	th, err := ParseThink("1s-10s")
	if err != nil || th.Min != time.Second || th.Max != 10*time.Second || th.Exponential {
		t.Fatalf("ParseThink = %+v, %v", th, err)
	}
	th, err = ParseThink("exp:2s")
	if err != nil || th.Min != 2*time.Second || th.Max != 2*time.Second || !th.Exponential {
		t.Fatalf("ParseThink = %+v, %v", th, err)
	}
	h := http.Header{}
	if err := ParseHeader(h, "X-Test:  a b "); err != nil || h.Get("X-Test") != "a b" {
		t.Fatalf("ParseHeader = %v, %v", h, err)
	}
	for _, bad := range []string{"1:2:3", "a:2:3:1s", "1:2:3:x", "5:1:1:1s", "1:2:0:1s"} {
		if _, err := ParseSteps(bad); err == nil || !strings.Contains(err.Error(), "--steps") {
			t.Errorf("ParseSteps(%q) = %v, want an error naming --steps", bad, err)
		}
	}
	for _, bad := range []string{"", "1", "0:0", "-1:5", "1:x"} {
		if _, err := ParseRamp(bad); err == nil {
			t.Errorf("ParseRamp(%q) accepted", bad)
		}
	}
	for _, bad := range []string{"", "x", "2s-1s", "-1s", "1s-x"} {
		if _, err := ParseThink(bad); err == nil {
			t.Errorf("ParseThink(%q) accepted", bad)
		}
	}
	for _, bad := range []string{"novalue", "Bad Name: x", ": x", "X: a\r\nInjected: y"} {
		if err := ParseHeader(http.Header{}, bad); err == nil {
			t.Errorf("ParseHeader(%q) accepted", bad)
		}
	}
}

func TestCheckTarget(t *testing.T) {
	for _, ok := range []string{"http://127.0.0.1:8080/", "http://localhost/x", "http://[::1]:80/", "http://198.18.0.1/", "http://198.19.255.254:9000/a?b=c", "http://127.9.9.9"} {
		if err := CheckTarget(ok); err != nil {
			t.Errorf("CheckTarget(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"http://10.0.0.1/", "http://example.com/", "http://198.20.0.1/", "ftp://127.0.0.1/", "127.0.0.1:80", "http:///x", "http://127.0.0.1:99999/", "http://[::ffff:8.8.8.8]/"} {
		if err := CheckTarget(bad); err == nil {
			t.Errorf("CheckTarget(%q) accepted", bad)
		}
	}
}

func FuzzParseFlags(f *testing.F) {
	for _, s := range []string{"100:1000:100:10s", "1:2", "1s-10s", "exp:1s-2s", "X-A: b", "http://127.0.0.1:80/", "home:3:/", "buy:1:POST:/cart?id=2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if spec, err := ParseSteps(s); err == nil {
			if spec.Validate(0) != nil || spec.StepsLength() <= 0 {
				t.Fatalf("ParseSteps(%q) accepted an invalid spec %+v", s, spec)
			}
		}
		if spec, err := ParseRamp(s); err == nil && spec.Validate(time.Second) != nil {
			t.Fatalf("ParseRamp(%q) accepted an invalid spec %+v", s, spec)
		}
		if th, err := ParseThink(s); err == nil && (th.Min < 0 || th.Max < th.Min) {
			t.Fatalf("ParseThink(%q) = %+v", s, th)
		}
		if task, err := ParseTask(s, Request{Method: "GET", URL: "http://127.0.0.1:8080/base"}); err == nil {
			// what the parser accepts the engine must take and the client send
			cfg := Config{Request: Request{URL: "http://127.0.0.1:8080/base"}, Users: &UsersModel{Users: 1, Tasks: []Task{task}}, Duration: time.Second}
			if err := cfg.Validate(); err != nil {
				t.Fatalf("ParseTask(%q) = %+v, which the engine refuses: %v", s, task, err)
			}
			if _, err := NewHTTP1Client(ClientOptions{}).Prepare(task.Request); err != nil {
				t.Fatalf("ParseTask(%q) = %+v, not sendable: %v", s, task, err)
			}
		}
		h := http.Header{}
		if ParseHeader(h, s) == nil {
			// what the parser accepts the client must be able to put on the wire
			c := NewHTTP1Client(ClientOptions{})
			if _, err := c.Prepare(Request{URL: "http://127.0.0.1/", Header: h}); err != nil {
				t.Fatalf("header %q parsed but not sendable: %v", s, err)
			}
		}
		if CheckTarget(s) == nil {
			c := NewHTTP1Client(ClientOptions{})
			if _, err := c.Prepare(Request{URL: s}); err != nil && strings.HasPrefix(s, "http:") {
				t.Fatalf("target %q allowed but not sendable: %v", s, err)
			}
		}
	})
}

func TestParseTask(t *testing.T) {
	base := Request{Method: "GET", URL: "http://127.0.0.1:8080/start?x=1", Header: http.Header{"X-A": {"b"}}, Body: []byte("hi")}
	for _, c := range []struct {
		in, method, url string
		weight          int
	}{
		{"home:3:/", "GET", "http://127.0.0.1:8080/", 3},
		{"buy:1:POST:/cart?id=2", "POST", "http://127.0.0.1:8080/cart?id=2", 1},
		{"a b:10:/x:y", "GET", "http://127.0.0.1:8080/x:y", 10},
		{FormatTask("main: page", 2, "PUT", "/p?q=1"), "PUT", "http://127.0.0.1:8080/p?q=1", 2},
	} {
		task, err := ParseTask(c.in, base)
		if err != nil {
			t.Errorf("ParseTask(%q): %v", c.in, err)
			continue
		}
		if c.weight == 2 && task.Name != "main: page" {
			t.Errorf("FormatTask/ParseTask lost the name: %q", task.Name)
		}
		if task.Request.Method != c.method || task.Request.URL != c.url || task.Weight != c.weight || task.Request.Header.Get("X-A") != "b" || string(task.Request.Body) != "hi" {
			t.Errorf("ParseTask(%q) = %+v", c.in, task)
		}
	}
	for _, bad := range []string{"", "home", "home:3", "home:0:/", "home:-1:/", "home:x:/", ":1:/", "home:1:path", "home:1:GET:path", "home:1:BAD METHOD:/", "home:1:/a b", "home:1:/a#frag"} {
		if task, err := ParseTask(bad, base); err == nil {
			t.Errorf("ParseTask(%q) accepted: %+v", bad, task)
		} else if !strings.Contains(err.Error(), "--task") {
			t.Errorf("ParseTask(%q): %v does not name the flag", bad, err)
		}
	}
}
