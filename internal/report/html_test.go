package report

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

func chromiumPath(t *testing.T) string {
	for _, p := range []string{os.Getenv("MESHMARK_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"} {
		if p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	// meshmark setup installs chromium; a missing browser is a broken setup, not a skip.
	t.Fatal("chromium not found (install it with `meshmark setup` or `apt-get install -y chromium`)")
	return ""
}

// sectionCheck is what the page reports about one section after rendering.
type sectionCheck struct {
	ID        string `json:"id"`
	Charts    int    `json:"charts"`    // charts whose canvas/svg has a non-zero size
	DataRows  int    `json:"dataRows"`  // rows in tbody of tables
	EmptyNote string `json:"emptyNote"` // the "no data" sentence, if any
	// NetworkRows are the rows of the "Network per pod" table (resources section).
	NetworkRows int `json:"networkRows"`
	// FailEvidence is the hover text of the security matrix's failed cells.
	FailEvidence []string `json:"failEvidence"`
	// AnswerFlags are the flags in the answer tables, as "column:mesh:text".
	AnswerFlags []string `json:"answerFlags"`
}

const inspectSections = `Array.from(document.querySelectorAll('section[data-section]')).map(s => {
  let charts = 0;
  s.querySelectorAll('.chart').forEach(c => {
    const g = c.querySelector('canvas, svg');
    if (g) { const r = g.getBoundingClientRect(); if (r.width > 0 && r.height > 0) charts++; }
  });
  let rows = 0;
  s.querySelectorAll('table tbody tr').forEach(() => rows++);
  const e = s.querySelector('.empty');
  const net = s.querySelectorAll('table[data-table="network"] tbody tr').length;
  const ev = Array.from(s.querySelectorAll('span.sec.fail')).map(x => x.getAttribute('title'));
  const flags = Array.from(s.querySelectorAll('table[data-table="answer"] span.flag')).map(f => {
    const td = f.closest('td');
    return Array.from(td.parentNode.children).indexOf(td) + ':' + td.parentNode.firstChild.textContent.split(' ')[0] + ':' + f.textContent;
  });
  return {id: s.dataset.section, charts: charts, dataRows: rows, emptyNote: e ? e.textContent : '', networkRows: net, failEvidence: ev, answerFlags: flags};
})`

// TestHTMLInChromium opens the report in real headless Chromium and checks that it
// renders every section with no console error and no network request but the file.
func TestHTMLInChromium(t *testing.T) {
	run, an := fixture(t)
	dir := t.ArtifactDir()
	paths, err := Write(context.Background(), run, an, dir, Options{}, HTML)
	if err != nil {
		t.Fatal(err)
	}
	page := paths[0]
	t.Logf("report: %s", page)

	checks, requests, problems, png := renderInChromium(t, page)
	fileURL := (&url.URL{Scheme: "file", Path: page}).String()
	if len(requests) == 0 {
		t.Error("saw no request at all, not even the page: the network check is blind")
	}
	for _, r := range requests {
		if r != fileURL {
			t.Errorf("the page made a request other than itself: %s", r)
		}
	}
	for _, p := range problems {
		t.Errorf("browser reported: %s", p)
	}
	wantCharts := map[string]int{"answer": 1, "spectrum": 1, "capacity": 1, "heatmaps": 1, "timeseries": 3, "resources": 2, "cost": 1}
	wantRows := map[string]int{"answer": 8 * 3, "verdicts": 2 * 8 * 6 / 2, "comparisons": 96, "results": 24, "capacity": 3, "resources": 1, "cost": 3, "checks": 3, "security": 3, "provenance": 5}
	seen := map[string]bool{}
	for _, c := range checks {
		seen[c.ID] = true
		if c.EmptyNote != "" {
			t.Errorf("section %s says it has no data (%q) although the run has it", c.ID, c.EmptyNote)
		}
		if n, ok := wantCharts[c.ID]; ok && c.Charts < n {
			t.Errorf("section %s: %d charts with a non-zero size, want %d", c.ID, c.Charts, n)
		}
		if n, ok := wantRows[c.ID]; ok && c.DataRows < n {
			t.Errorf("section %s: %d table rows, want at least %d", c.ID, c.DataRows, n)
		}
		if c.ID == "resources" && c.NetworkRows != 13 {
			t.Errorf("section resources: network table has %d rows, want 13", c.NetworkRows)
		}
		// The failed probe is flagged beside sidecar-mtls's security posture (column 6)
		// at each of the run's 8 load points; at 1400 rps, past its capacity, the SLO it
		// breaks beside the mesh (served rate) and its errors (column 5).
		if c.ID == "answer" {
			var want []string
			for i := 0; i < 8; i++ {
				if i == 7 {
					want = append(want, "0:sidecar-mtls:(served 89%, breaks SLO)", "5:sidecar-mtls:(breaks SLO)")
				}
				want = append(want, "6:sidecar-mtls:(1 probe failed)")
			}
			if strings.Join(c.AnswerFlags, "|") != strings.Join(want, "|") {
				t.Errorf("answer flags %q, want %q", c.AnswerFlags, want)
			}
		}
		if c.ID == "security" && (len(c.FailEvidence) != 1 || !strings.Contains(c.FailEvidence[0], "✗ productpage-0 -> reviews-0: synthetic observation")) {
			t.Errorf("security matrix: failed cells' evidence %q, want the one failed probe's check", c.FailEvidence)
		}
		if c.Charts == 0 && c.DataRows == 0 {
			t.Errorf("section %s shows neither a chart nor a table row", c.ID)
		}
	}
	for id := range wantRows {
		if !seen[id] {
			t.Errorf("section %s missing", id)
		}
	}
	shot := filepath.Join(dir, "report.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", shot)
	if err := os.WriteFile("/tmp/meshmark-report.png", png, 0o644); err != nil {
		t.Logf("could not copy the screenshot to /tmp: %v", err)
	}
}

// TestHTMLEmptySectionsSayNoData renders a run with one mesh and no sweep: every
// section must still render, the chart sections with a plain sentence.
func TestHTMLEmptySectionsSayNoData(t *testing.T) {
	run := syntheticRun(t)
	var keep = run.Trials[:0]
	for _, tr := range run.Trials {
		if tr.Experiment == "fixed" && tr.Mesh == "baseline" {
			tr.Result.Resources, tr.Result.Intervals, tr.Result.Network = nil, nil, nil
			keep = append(keep, tr)
		}
	}
	run.Trials, run.Meshes = keep, run.Meshes[:1]
	page, err := Write(context.Background(), run, nil, t.TempDir(), Options{}, HTML)
	if err != nil {
		t.Fatal(err)
	}
	checks, _, problems, _ := renderInChromium(t, page[0])
	for _, p := range problems {
		t.Errorf("browser reported: %s", p)
	}
	wantEmpty := map[string]string{"verdicts": "nothing to rank", "capacity": "no sweep", "heatmaps": "no sweep",
		"timeseries": "No per-interval data", "resources": "No resource samples", "cost": "no cost"}
	for _, c := range checks {
		if w, ok := wantEmpty[c.ID]; ok && !strings.Contains(c.EmptyNote, w) {
			t.Errorf("section %s: empty note %q, want one containing %q", c.ID, c.EmptyNote, w)
		}
		if _, ok := wantEmpty[c.ID]; ok && c.Charts != 0 {
			t.Errorf("section %s draws %d charts without data", c.ID, c.Charts)
		}
	}
}

// TestChromiumHarnessSeesFetchesAndErrors proves the checks above can fail: a page
// that fetches an image and logs an error must be caught by both.
func TestChromiumHarnessSeesFetchesAndErrors(t *testing.T) {
	page := filepath.Join(t.TempDir(), "bad.html")
	html := `<!DOCTYPE html><html><body data-rendered="true"><img src="http://127.0.0.1:9/x.png"><script>console.error("boom")</script></body></html>`
	if err := os.WriteFile(page, []byte(html), 0o644); err != nil {
		t.Fatal(err)
	}
	_, requests, problems, _ := renderInChromium(t, page)
	if !strings.Contains(strings.Join(requests, " "), "127.0.0.1:9/x.png") {
		t.Errorf("the image fetch was not seen: %v", requests)
	}
	if !strings.Contains(strings.Join(problems, " "), "boom") {
		t.Errorf("console.error was not seen: %v", problems)
	}
}

var chromiumSlots = make(chan struct{}, 1) // one browser at a time on a 2-core machine

func renderInChromium(t *testing.T, page string) (checks []sectionCheck, requests, problems []string, png []byte) {
	t.Helper()
	chromiumSlots <- struct{}{}
	defer func() { <-chromiumSlots }()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()

	var mu sync.Mutex
	listener := func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *network.EventRequestWillBeSent:
			requests = append(requests, e.Request.URL)
		case *runtime.EventExceptionThrown:
			d := e.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			problems = append(problems, fmt.Sprintf("exception at %d:%d: %s", d.LineNumber, d.ColumnNumber, msg))
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledType("error") || e.Type == runtime.ConsoleAPICalledType("warning") || e.Type == runtime.ConsoleAPICalledType("assert") {
				var parts []string
				for _, a := range e.Args {
					parts = append(parts, string(a.Value)+a.Description)
				}
				problems = append(problems, fmt.Sprintf("console.%s: %s", e.Type, strings.Join(parts, " ")))
			}
		}
	}
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithListener(listener))
	defer cancel()
	// The first call's context owns the browser, so it must carry no timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	tctx, cancelT := context.WithTimeout(ctx, 90*time.Second)
	defer cancelT()
	enable := func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		if _, err := cdp.Call(ctx, tg, network.Enable, network.EnableParams{}); err != nil {
			return chromedp.Void{}, err
		}
		_, err := cdp.Call(ctx, tg, runtime.Enable, cdp.Empty{})
		return chromedp.Void{}, err
	}
	fileURL := (&url.URL{Scheme: "file", Path: page}).String()
	err := chromedp.Do(tctx, enable, chromedp.Navigate(fileURL),
		chromedp.WaitVisible(chromedp.CSS(`body[data-rendered="true"]`)),
		chromedp.Sleep(300*time.Millisecond)) // let ECharts finish its first frame
	if err == nil {
		checks, err = chromedp.Run(tctx, chromedp.Evaluate[[]sectionCheck](inspectSections))
	}
	if err == nil {
		png, err = chromedp.Run(tctx, chromedp.FullScreenshot(100)) // 100 means PNG
	}
	mu.Lock()
	defer mu.Unlock()
	if err != nil {
		t.Fatalf("chromium: %v (problems so far: %v)", err, problems)
	}
	return checks, append([]string(nil), requests...), append([]string(nil), problems...), png
}
