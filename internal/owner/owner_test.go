package owner

import (
	"strings"
	"testing"
)

func TestParseOwner(t *testing.T) {
	o, err := Parse([]byte("1234 98765\n"))
	if err != nil || o.PID != 1234 || o.StartTime != 98765 {
		t.Fatalf("ParseOwner = %+v, %v", o, err)
	}
	for _, bad := range []string{"", "12", "x 1", "0 5", "-3 5", "12 y", "1 2 3"} {
		_, err := Parse([]byte(bad))
		if err == nil {
			t.Errorf("Parse(%q) accepted bad input", bad)
			continue
		}
		if !strings.Contains(err.Error(), "owner file: line 1") {
			t.Errorf("Parse(%q) error %q does not name file and line", bad, err)
		}
	}
	self, err := Current()
	if err != nil || !self.Alive() {
		t.Fatalf("current process: %+v alive=%v err=%v", self, self.Alive(), err)
	}
	if (Owner{PID: self.PID, StartTime: self.StartTime + 1}).Alive() {
		t.Error("a recycled pid (other start time) counts as alive")
	}
}

func TestParseStatStartTime(t *testing.T) {
	// A command name with spaces and parentheses must not shift the fields.
	stat := "42 (a b) c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 777 1000 10"
	st, err := parseStatStartTime([]byte(stat))
	if err != nil || st != 777 {
		t.Fatalf("start time = %d, %v; want 777", st, err)
	}
}

func FuzzParseOwner(f *testing.F) {
	f.Add([]byte("1234 98765\n"))
	f.Add([]byte(""))
	f.Add([]byte("1 2 3"))
	f.Fuzz(func(t *testing.T, data []byte) {
		o, err := Parse(data)
		if err != nil {
			return
		}
		if o.PID <= 0 {
			t.Fatalf("accepted pid %d", o.PID)
		}
		again, err := Parse([]byte(o.String()))
		if err != nil || again != o {
			t.Fatalf("round trip of %+v: %+v, %v", o, again, err)
		}
	})
}

func FuzzParseStatStartTime(f *testing.F) {
	f.Add([]byte("42 (a b) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 777 1000 10"))
	f.Fuzz(func(t *testing.T, data []byte) {
		parseStatStartTime(data) // must not panic
	})
}
