package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"image/png"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// TestConsoleInChromium drives berthd's web console in Debian's headless
// Chromium (chromedp): log in with a token, create a sandbox, type
// `echo hi` into the terminal and see hi, upload a file and download it
// back byte-exact, see the terminal's exec with its exit code in the exec
// history, and save a screenshot (its path is logged: the directory of
// BERTH_TEST_ARTIFACTS, default $TMPDIR/berth-test-artifacts,
// console.png). No request leaves the machine: Chromium's proxy for every
// address but loopback is a listener that reads each request's first line
// and refuses it; every request the page makes (Chrome DevTools
// Protocol's Network events) must be to berthd's origin, a blob: or a
// data: URL; and the proxy may see only Chromium's own calls to Google
// (*.google.com, *.googleapis.com), never another host (a CDN).
func TestConsoleInChromium(t *testing.T) {
	need(t)
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("Debian's chromium is not installed (scripts/deps.sh installs it): %v", err)
	}
	_, base := startWSBerthd(t)
	origin, _ := url.Parse(base)

	// The proxy of every request that is not to loopback: it refuses all.
	proxy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	var (
		proxyMu sync.Mutex
		proxied []string // the first line of each request to the proxy
	)
	go func() {
		for {
			c, err := proxy.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				line, _ := bufio.NewReader(c).ReadString('\n')
				proxyMu.Lock()
				proxied = append(proxied, strings.TrimSpace(line))
				proxyMu.Unlock()
			}()
		}
	}()

	downloads := t.TempDir()
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(chromium),
		chromedp.NoSandbox, // root
		chromedp.UserDataDir(t.TempDir()),
		chromedp.ProxyServer("http://"+proxy.Addr().String()),
		chromedp.Flag("disable-dev-shm-usage", true),
		// Chromium's own services, which call Google whatever the page
		// does (seen at the proxy without these): the clock
		// (clients2.google.com), autofill and password checks of the
		// token field (content-autofill.googleapis.com), optimization
		// hints (optimizationguide-pa.googleapis.com). Component updates
		// and sign-in go on (see the proxy's check below).
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-domain-reliability", true),
		chromedp.Flag("no-pings", true),
		chromedp.Flag("disable-features", "Translate,BlinkGenPropertyTrees,AutofillServerCommunication,OptimizationHints,"+
			"OptimizationGuideModelDownloading,OptimizationHintsFetching,OptimizationTargetPrediction,PasswordLeakDetection,"+
			"MediaRouter,DialMediaRouteProvider,CertificateTransparencyComponentUpdater,NetworkTimeServiceQuerying,"+
			"AccountConsistency,ChromeSignin"),
		chromedp.WindowSize(1280, 1400),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancelCtx := chromedp.NewContext(actx)
	defer cancelCtx()
	ctx, cancel := context.WithTimeout(ctx, 6*time.Minute)
	defer cancel()

	upload := filepath.Join(t.TempDir(), "payload.bin")
	payload := make([]byte, 700<<10) // three of the page's 256 KiB chunks
	rand.Read(payload)
	if err := os.WriteFile(upload, payload, 0o600); err != nil {
		t.Fatal(err)
	}

	// Start the browser and the tab, then record every request the page
	// makes from its first.
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatalf("start %s: %v", chromium, err)
	}
	if _, err := chromedp.Call(ctx, runtime.Enable, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		requests []string
		pageLog  []string
	)
	err = chromedp.Listen(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			requests = append(requests, ev.Request.URL)
		case *network.EventWebSocketCreated:
			requests = append(requests, ev.URL)
		case *runtime.EventExceptionThrown:
			pageLog = append(pageLog, "exception: "+ev.ExceptionDetails.Text+" "+exceptionText(ev.ExceptionDetails))
		case *runtime.EventConsoleAPICalled:
			line := string(ev.Type) + ":"
			for _, a := range ev.Args {
				line += " " + string(a.Value) + a.Description
			}
			pageLog = append(pageLog, line)
		}
	})
	// The page's console and exceptions, shown when the test fails.
	defer func() {
		if t.Failed() {
			mu.Lock()
			defer mu.Unlock()
			t.Logf("the page's console:\n%s", strings.Join(pageLog, "\n"))
		}
	}()
	if err != nil {
		t.Fatal(err)
	}
	allow := true
	if _, err := chromedp.CallBrowser(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: downloads, EventsEnabled: &allow}); err != nil {
		t.Fatal(err)
	}

	step := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// The terminal's lines (xterm.js's buffer).
	const lines = `Array.from({length: term.buffer.active.length}, (_, i) => term.buffer.active.getLine(i).translateToString(true))`
	poll := func(what, expr string, timeout time.Duration) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(timeout))); err != nil {
			screen, _ := chromedp.Run(ctx, chromedp.Evaluate[[]string](`typeof term === "object" && term ? `+lines+` : []`))
			status, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("term-status")))
			t.Fatalf("%s (%s): %v\nterminal %q: %q", what, expr, err, status, strings.Join(screen, "\n"))
		}
	}
	step("open the console", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("token")))
	step("log in", chromedp.SendKeys(chromedp.ID("token"), httpToken), chromedp.Click(chromedp.CSS(`#login-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("app")))
	step("create a sandbox", chromedp.Click(chromedp.ID("create")), chromedp.WaitVisible(chromedp.ID("sandbox")))
	sb, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("sandbox-id")))
	if err != nil || sb == "" {
		t.Fatalf("the console shows no sandbox id after create: %q %v", sb, err)
	}

	step("open a terminal", chromedp.Click(chromedp.ID("term-open")))
	poll("the terminal runs", `document.getElementById("term-status").textContent.startsWith("running")`, time.Minute)
	// Keys as a keyboard sends them, one keyDown (with its text) and keyUp
	// each, as puppeteer types (chromedp's SendKeys made xterm.js see each
	// character twice).
	typeKeys := func(keys string) {
		t.Helper()
		step("focus the terminal", chromedp.Focus(chromedp.CSS(".xterm-helper-textarea")))
		for _, r := range keys {
			down := input.DispatchKeyEventParams{Type: input.DispatchKeyEventTypeKeyDown, Key: string(r), Text: string(r)}
			if r == '\r' {
				down.Key, down.Code, down.WindowsVirtualKeyCode = "Enter", "Enter", 13
			}
			up := down
			up.Type, up.Text = input.DispatchKeyEventTypeKeyUp, ""
			for _, ev := range []input.DispatchKeyEventParams{down, up} {
				if _, err := chromedp.Call(ctx, input.DispatchKeyEvent, ev); err != nil {
					t.Fatalf("type %q: %v", keys, err)
				}
			}
		}
	}
	typeKeys("echo hi\r")
	// The command echoed, then its output on a line of its own.
	poll("see hi", lines+`.some((l) => l === "hi")`, time.Minute)
	screen, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](lines))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(screen, func(l string) bool { return strings.HasSuffix(l, "echo hi") }) {
		t.Errorf("the terminal shows no echoed command line: %q", screen)
	}

	step("upload a file", chromedp.SetUploadFiles(chromedp.ID("upload"), []string{upload}),
		chromedp.WaitVisible(chromedp.CSS(`button[data-name="payload.bin"]`)))
	step("download it", chromedp.Click(chromedp.CSS(`button[data-name="payload.bin"]`)))
	got := waitFile(t, filepath.Join(downloads, "payload.bin"), len(payload))
	if !bytes.Equal(got, payload) {
		t.Errorf("downloaded %d bytes, not the %d uploaded byte-exact", len(got), len(payload))
	}

	typeKeys("exit 5\r")
	poll("the terminal exited 5", `document.getElementById("term-status").textContent === "exited 5"`, time.Minute)
	step("refresh the exec history", chromedp.Click(chromedp.ID("execs-refresh")))
	poll("the exec history shows exit 5", `Array.from(document.querySelectorAll("#exec-rows tr")).some((r) => r.cells[2].textContent === "exited" && r.cells[3].textContent === "5")`, 30*time.Second)

	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil || img.Bounds().Dx() < 1000 {
		t.Fatalf("screenshot: %v (%v)", err, img)
	}
	dir := os.Getenv("BERTH_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "berth-test-artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "console.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(shot))

	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.confirm = () => true; true`)); err != nil {
		t.Fatal(err)
	}
	step("delete the sandbox", chromedp.Click(chromedp.CSS(`#sandbox-rows tr[data-id="`+sb+`"] button:nth-of-type(2)`)),
		chromedp.WaitNotPresent(chromedp.CSS(`#sandbox-rows tr[data-id="`+sb+`"]`)))

	mu.Lock()
	defer mu.Unlock()
	if len(requests) < 5 {
		t.Fatalf("saw %d requests: the Network events are not recorded (%q)", len(requests), requests)
	}
	for _, r := range requests {
		u, err := url.Parse(r)
		if err == nil && (u.Scheme == "blob" || u.Scheme == "data" || (u.Host == origin.Host && (u.Scheme == "http" || u.Scheme == "ws"))) {
			continue
		}
		t.Errorf("a request to %q, which is not berthd's origin %s", r, base)
	}
	// The proxy refused everything, so nothing left the machine. What
	// reached it must be Chromium's own calls to Google that no flag
	// stops (component updates at update.googleapis.com, sign-in at
	// accounts.google.com: seen on every run), never the page's.
	proxyMu.Lock()
	defer proxyMu.Unlock()
	for _, line := range proxied {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue // a connection closed before its request
		}
		host := f[1]
		if u, err := url.Parse(f[1]); err == nil && u.Host != "" {
			host = u.Host
		}
		host, _, _ = strings.Cut(host, ":")
		if !strings.HasSuffix(host, ".google.com") && !strings.HasSuffix(host, ".googleapis.com") {
			t.Errorf("a request for %s went to the (refusing) proxy: %q", host, line)
		}
	}
	t.Logf("Chromium's own requests, refused by the proxy: %q", proxied)
	t.Logf("%d requests, all to %s (or blob:/data:)", len(requests), base)
}

// exceptionText is what an exception in the page says.
func exceptionText(d *runtime.ExceptionDetails) string {
	if d.Exception != nil {
		return d.Exception.Description
	}
	return ""
}

// waitFile waits (bounded) for the download at path to have size bytes
// and returns them.
func waitFile(t *testing.T, path string, size int) []byte {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := os.ReadFile(path)
		if err == nil && len(b) == size {
			return b
		}
		if time.Now().After(deadline) {
			entries, _ := os.ReadDir(filepath.Dir(path))
			t.Fatalf("no download of %d bytes at %s within a minute (%v, %d bytes; directory holds %v)", size, path, err, len(b), fmt.Sprint(entries))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
