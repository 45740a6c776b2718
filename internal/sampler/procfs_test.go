package sampler

import (
	"testing"
	"time"
)

func TestParseStatCountsFieldsFromTheLastParenthesis(t *testing.T) {
	// comm "a) (b c" contains spaces and parentheses; values are distinct so a shifted
	// field would be caught.
	line := "1234 (a) (b c) S 1 1234 1234 0 -1 4194560 100 0 0 0 " +
		"7 3 11 13 20 0 5 0 987654 12345678 321 18446744073709551615\n"
	st, ok := parseStat([]byte(line))
	if !ok {
		t.Fatal("not parsed")
	}
	want := procStat{utime: 7, stime: 3, cutime: 11, cstime: 13, threads: 5, startTime: 987654, rssPages: 321}
	if st != want {
		t.Fatalf("got %+v, want %+v", st, want)
	}
	if _, ok := parseStat([]byte("1234 (x) S 1 2 3\n")); ok {
		t.Fatal("a truncated stat line must not parse")
	}
}

func TestParseNetDev(t *testing.T) {
	in := "Inter-|   Receive                                                |  Transmit\n" +
		" face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n" +
		"    lo:    1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0\n" +
		"  eth0: 5000 50 1 2 0 0 0 0 7000 70 3 4 0 0 0 0\n"
	got := map[string]netDevCounters{}
	parseNetDev([]byte(in), func(name []byte, c netDevCounters) { got[string(name)] = c })
	if len(got) != 2 {
		t.Fatalf("got %v", got)
	}
	if e := got["eth0"]; e != (netDevCounters{rxBytes: 5000, rxPackets: 50, rxErrors: 1, rxDropped: 2,
		txBytes: 7000, txPackets: 70, txErrors: 3, txDropped: 4}) {
		t.Fatalf("eth0 %+v", e)
	}
	if got["lo"].rxBytes != 1000 || got["lo"].txPackets != 10 {
		t.Fatalf("lo %+v", got["lo"])
	}
}

func TestFieldValue(t *testing.T) {
	status := []byte("Name:\tx\nvoluntary_ctxt_switches:\t42\nnonvoluntary_ctxt_switches:\t7\n")
	if v, ok := fieldValue(status, "voluntary_ctxt_switches:"); !ok || v != 42 {
		t.Fatalf("voluntary %d %v", v, ok)
	}
	if v, ok := fieldValue(status, "nonvoluntary_ctxt_switches:"); !ok || v != 7 {
		t.Fatalf("nonvoluntary %d %v", v, ok)
	}
	if _, ok := fieldValue(status, "Pss:"); ok {
		t.Fatal("missing key found")
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 9 10 11 12\n"))
	f.Add([]byte(")))"))
	f.Fuzz(func(t *testing.T, b []byte) { parseStat(b) })
}

func FuzzParseNetDev(f *testing.F) {
	f.Add([]byte("  eth0: 5000 50 1 2 0 0 0 0 7000 70 3 4 0 0 0 0\n"))
	f.Add([]byte("a|b:\n:"))
	f.Fuzz(func(t *testing.T, b []byte) {
		parseNetDev(b, func(name []byte, c netDevCounters) {
			if len(name) == 0 {
				t.Fatal("empty interface name")
			}
		})
	})
}

func TestSummarizeArithmetic(t *testing.T) {
	t0 := time.Unix(1000, 0)
	mk := func(sec int, cpuMs int, rssMiB uint64, vol uint64) ProcSample {
		return ProcSample{Target: Target{PID: 10, Role: "sidecar", Pod: "p", Node: "n", Mesh: "m", Component: "envoy"},
			StartTicks: 5, User: time.Duration(cpuMs) * time.Millisecond, RSSBytes: rssMiB << 20, PSSBytes: rssMiB << 19,
			VoluntaryCtxSwitches: vol}
	}
	lg := func(cpuMs int) ProcSample {
		return ProcSample{Target: Target{PID: 20, Role: "load-generator", Pod: "c", Mesh: "m"}, StartTicks: 9,
			System: time.Duration(cpuMs) * time.Millisecond}
	}
	net := func(rx, tx uint64) []NetSample {
		return []NetSample{{Pod: "p", Interface: "eth0", RxBytes: rx, TxBytes: tx}}
	}
	// 5 rounds 1 s apart; warm-up 1 s and tail 1 s leave rounds at t=1,2,3.
	rounds := []Round{
		{Time: t0, Procs: []ProcSample{mk(0, 0, 10, 0), lg(0)}, Nets: net(0, 0)},
		{Time: t0.Add(1 * time.Second), Procs: []ProcSample{mk(1, 5000, 20, 100), lg(900)}, Nets: net(1000, 500)},
		{Time: t0.Add(2 * time.Second), Procs: []ProcSample{mk(2, 5200, 30, 150), lg(1800)}, Nets: net(3000, 1500)},
		{Time: t0.Add(3 * time.Second), Procs: []ProcSample{mk(3, 5600, 50, 250), lg(2700)}, Nets: net(5000, 2500)},
		{Time: t0.Add(4 * time.Second), Procs: []ProcSample{mk(4, 9000, 90, 900), lg(3600)}, Nets: net(9000, 9000)},
	}
	s, err := Summarize(rounds, SummaryOptions{WarmUp: time.Second, Tail: time.Second, Requests: 400, AchievedRPS: 200})
	if err != nil {
		t.Fatal(err)
	}
	g := s.Group(ByComponent, "envoy")
	// CPU: 5.0 -> 5.2 -> 5.6 s: 0.6 s over 2 s = 0.3 vCPU avg, peak 0.4; 0.3/200*1000 = 1.5
	// vCPU per 1000 rps; 0.6 s / 400 requests = 1500 µs. RSS 20,30,50 MiB: avg 33.33, peak
	// 50; PSS half. Voluntary switches 150 over 2 s = 75/s.
	check := func(name string, got, want float64) {
		t.Helper()
		if abs(got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("AvgVCPU", g.AvgVCPU, 0.3)
	check("PeakVCPU", g.PeakVCPU, 0.4)
	check("VCPUPer1000RPS", g.VCPUPer1000RPS, 1.5)
	check("CPUMicrosPerReq", g.CPUMicrosPerReq, 1500)
	check("AvgRSSMiB", g.AvgRSSMiB, 100.0/3)
	check("PeakRSSMiB", g.PeakRSSMiB, 50)
	check("AvgPSSMiB", g.AvgPSSMiB, 50.0/3)
	check("VoluntaryCtxSwPerSec", g.VoluntaryCtxSwPerSec, 75)
	if g.Mesh != "m" || g.Processes != 1 {
		t.Errorf("group %+v", g)
	}
	if m := s.Group(ByMesh, "m"); m == nil || m.Processes != 2 {
		t.Errorf("mesh group %+v", m)
	}
	// Interface: rx 1000 -> 5000 over 2 s.
	if len(s.Interfaces) != 1 || s.Interfaces[0].RxBytes != 4000 || s.Interfaces[0].TxBytes != 2000 {
		t.Fatalf("interfaces %+v", s.Interfaces)
	}
	check("RxBytesPerSec", s.Interfaces[0].RxBytesPerSec, 2000)
	// Load generator: 0.9 vCPU > 80% of 1 core.
	if !s.LoadGen.Saturated || abs(s.LoadGen.AvgVCPU-0.9) > 1e-9 {
		t.Errorf("load generator %+v should be flagged at 0.9 vCPU", s.LoadGen)
	}
	s2, _ := Summarize(rounds, SummaryOptions{WarmUp: time.Second, Tail: time.Second, LoadGenCores: 2})
	if s2.LoadGen.Saturated {
		t.Errorf("0.9 vCPU of 2 cores must not be flagged: %+v", s2.LoadGen)
	}
	s3, _ := Summarize(rounds, SummaryOptions{WarmUp: time.Second, Tail: time.Second, LoadGenWaitVCPU: 0.5})
	if s3.LoadGen.Saturated || s3.LoadGen.AvgVCPU != s.LoadGen.AvgVCPU {
		t.Errorf("0.9 vCPU of which 0.5 spinning must not be flagged, and still be reported whole: %+v", s3.LoadGen)
	}
	if _, err := Summarize(rounds, SummaryOptions{WarmUp: 3 * time.Second, Tail: 1500 * time.Millisecond}); err == nil {
		t.Error("a window with fewer than 2 rounds must be an error")
	}
}

func TestSummarizeTreatsAReusedPIDAsANewProcess(t *testing.T) {
	t0 := time.Unix(0, 0)
	p := func(start uint64, cpu time.Duration) ProcSample {
		return ProcSample{Target: Target{PID: 7, Role: "workload"}, StartTicks: start, User: cpu}
	}
	rounds := []Round{
		{Time: t0, Procs: []ProcSample{p(1, 10*time.Second)}},
		{Time: t0.Add(time.Second), Procs: []ProcSample{p(1, 10500*time.Millisecond)}},
		{Time: t0.Add(2 * time.Second), Procs: []ProcSample{p(2, 100*time.Millisecond)}},
		{Time: t0.Add(3 * time.Second), Procs: []ProcSample{p(2, 300*time.Millisecond)}},
	}
	s, err := Summarize(rounds, SummaryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g := s.Group(ByRole, "workload")
	if g.Processes != 2 || abs(g.CPUSeconds-0.7) > 1e-9 {
		t.Fatalf("want 2 incarnations and 0.5+0.2 s CPU, got %+v", g)
	}
}
