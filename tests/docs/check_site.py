#!/usr/bin/env python3
"""Checks the generated documentation site (standard library + headless Chromium).

  check_site.py links    --html DIR [--missing-figures FILE]
      Every relative href/src/data in every .html and .svg file of the site
      resolves to an existing file, and no page loads a script, stylesheet,
      image or frame from the network (the site must work offline). FILE lists
      figures a chapter shows that nothing makes (docs/CMakeLists.txt writes it).

  check_site.py browser  --html DIR --screenshots DIR --page P [--page P ...] [--require-math P ...]
      Opens each page from file:// in headless Chromium, driven through the
      DevTools protocol over a pipe (--remote-debugging-pipe: no websocket,
      no port). A page fails on any uncaught exception, console.error/warn/assert,
      or browser log entry of level error (e.g. a script or font that failed to
      load); if the page holds formulas (or --require-math names it), MathJax must
      have typeset every one of them, with no TeX error and no raw \\( \\[ left in
      the text. A full-page PNG screenshot of each page is written to --screenshots.

  check_site.py selftest --html DIR --work DIR
      Proves the two checks above detect faults: pages with an uncaught
      exception, a missing script, a console.error, a TeX error, formulas left
      untypeset, and a broken link must each fail, and a clean page must pass.

Exit status: 0 pass, 1 fail, 77 skipped (Chromium not installed; CTest's SKIP_RETURN_CODE).
"""
import argparse
import fcntl
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

SKIP = 77
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


# --------------------------------------------------------------------------- links

class _References(html.parser.HTMLParser):
    """Collects (tag, attribute, value) of every href/src/data attribute."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src", "data", "xlink:href") and value is not None:
                self.found.append((tag, name, value))

    handle_startendtag = handle_starttag


_SVG_HREF = re.compile(r'(?:xlink:)?href\s*=\s*"([^"]*)"')
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, javascript:, data:, file:


def check_links(html_dir):
    """Returns a list of problems (empty when every internal link resolves)."""
    html_dir = Path(html_dir).resolve()
    problems = []
    files = sorted(list(html_dir.rglob("*.html")) + list(html_dir.rglob("*.svg")))
    if not (html_dir / "index.html").is_file():
        problems.append(f"{html_dir}/index.html does not exist")
    checked = 0
    for page in files:
        text = page.read_text(encoding="utf-8", errors="replace")
        if page.suffix == ".html":
            parser = _References()
            parser.feed(text)
            references = parser.found
        else:
            references = [("svg", "href", value) for value in _SVG_HREF.findall(text)]
        for tag, attribute, value in references:
            value = value.strip()
            if not value or value.startswith("#"):
                continue
            if _EXTERNAL.match(value):
                scheme = value.split(":", 1)[0].lower()
                # Plain links to other sites are fine; loading a resource from one is not.
                if scheme in ("http", "https") and (attribute != "href" or tag == "link"):
                    problems.append(f"{page.relative_to(html_dir)}: <{tag} {attribute}=\"{value}\"> loads from the network")
                continue
            target_path = urllib.parse.unquote(urllib.parse.urlsplit(value).path)
            if not target_path:
                continue
            target = (page.parent / target_path).resolve()
            checked += 1
            if not target.exists():
                problems.append(f"{page.relative_to(html_dir)}: <{tag} {attribute}=\"{value}\"> -> missing {target}")
            elif html_dir not in target.parents and target != html_dir:
                problems.append(f"{page.relative_to(html_dir)}: <{tag} {attribute}=\"{value}\"> leaves the site")
    return problems, len(files), checked


# --------------------------------------------------------------------------- browser

def find_chromium():
    explicit = os.environ.get("ROPE_CHROMIUM")
    if explicit:
        return explicit if shutil.which(explicit) else None
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """Headless Chromium driven through the DevTools protocol over a pipe."""

    def __init__(self, executable):
        self.profile = tempfile.mkdtemp(prefix="rope-docs-chromium-")
        # Chromium reads commands on fd 3 and writes replies/events on fd 4.
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire_pipes():
            read_end = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            write_end = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        self.log_path = os.path.join(self.profile, "chromium.log")
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-default-apps", "--disable-extensions", "--hide-scrollbars", "--mute-audio",
             "--allow-file-access-from-files", f"--user-data-dir={self.profile}",
             "--remote-debugging-pipe", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
            preexec_fn=wire_pipes, pass_fds=(3, 4))
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events = []

    def close(self):
        try:
            self.send("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def _read_message(self, deadline):
        import select
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self._from_browser], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium closed the DevTools pipe (see {self.log_path})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method, params=None, session=None, timeout=60):
        self._next_id += 1
        request = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            request["sessionId"] = session
        os.write(self._to_browser, json.dumps(request).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            message = self._read_message(deadline)
            if message is None:
                raise TimeoutError(f"no reply to {method} within {timeout} s")
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def pump(self, seconds):
        """Collects events for a while."""
        deadline = time.monotonic() + seconds
        while True:
            message = self._read_message(deadline)
            if message is None:
                return
            self.events.append(message)

    def wait_for(self, method, session, timeout):
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event.get("method") == method and event.get("sessionId") == session:
                return True
        while True:
            message = self._read_message(deadline)
            if message is None:
                return False
            self.events.append(message)
            if message.get("method") == method and message.get("sessionId") == session:
                return True


_MATH_DONE = """
new Promise((resolve) => {
  if (!window.MathJax || !MathJax.Hub || !MathJax.Hub.Queue) { resolve('no MathJax'); return; }
  MathJax.Hub.Queue(() => resolve('done'));
})
"""

_SUMMARY = r"""
(() => {
  const merror = (node) => !!node && (node.type === 'merror' || (node.data || []).some(merror));
  const jax = (window.MathJax && MathJax.Hub && MathJax.Hub.getAllJax) ? MathJax.Hub.getAllJax() : [];
  const text = document.body ? document.body.innerText : '';
  const message = document.getElementById('MathJax_Message');
  const shown = message && getComputedStyle(message).display !== 'none' && message.innerText.trim();
  return JSON.stringify({
    title: document.title,
    mathjax: !!(window.MathJax && MathJax.Hub),
    typeset: jax.length,
    tex_errors: jax.filter(j => j.root && (j.root.texError || merror(j.root))).map(j => j.originalText),
    rendered: document.querySelectorAll(
      '.MathJax_SVG, .MathJax_SVG_Display, .MathJax, .MathJax_Display, .MathJax_CHTML, mjx-container').length,
    raw: ['\\(', '\\[', '\\f$', '\\f['].filter(s => text.includes(s)),
    mathjax_message: shown || '',
    // Doxygen's side-bar layout scrolls #doc-content inside a window-high box:
    // a full-page screenshot needs a window as high as that content.
    height: Math.max(document.documentElement.scrollHeight, document.body ? document.body.scrollHeight : 0,
      ['top', 'doc-content', 'nav-path'].map(id => document.getElementById(id))
        .reduce((sum, e) => sum + (e ? (e.id === 'doc-content' ? e.scrollHeight : e.offsetHeight) : 0), 0)),
  });
})()
"""


def _count_formulas(path):
    """Formulas Doxygen wrote into the page: \\( ... \\) inline, \\[ ... \\] displayed."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    text = re.sub(r"<script.*?</script>", "", text, flags=re.S)
    return text.count("\\(") + text.count("\\[")


def check_page(browser, path, screenshot, require_math, width=1280):
    """Loads one page; returns (problems, facts)."""
    problems = []
    url = Path(path).resolve().as_uri()
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    first_event = len(browser.events)
    for domain in ("Page", "Runtime", "Log"):
        browser.send(f"{domain}.enable", session=session)
    browser.send("Emulation.setDeviceMetricsOverride",
                 {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
    navigation = browser.send("Page.navigate", {"url": url}, session=session)
    if navigation.get("errorText"):
        problems.append(f"navigation failed: {navigation['errorText']}")
    if not browser.wait_for("Page.loadEventFired", session, 60):
        problems.append("the load event did not fire within 60 s")
    done = browser.send("Runtime.evaluate", {"expression": _MATH_DONE, "awaitPromise": True, "returnByValue": True},
                        session=session, timeout=120)
    # Late errors, the navigation tree's scripts, and MathJax's lazy menu
    # extensions: its status message ("Loading ...") must go; a failure stays.
    deadline = time.monotonic() + 15
    while True:
        browser.pump(0.5)
        facts = json.loads(browser.send("Runtime.evaluate", {"expression": _SUMMARY, "returnByValue": True},
                                        session=session)["result"]["value"])
        if not facts["mathjax_message"] or time.monotonic() > deadline:
            break
    facts["mathjax_queue"] = done.get("result", {}).get("value")

    for event in browser.events[first_event:]:
        if event.get("sessionId") != session:
            continue
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            description = details.get("exception", {}).get("description") or details.get("text")
            problems.append(f"uncaught exception: {description} ({details.get('url', '')}:{details.get('lineNumber')})")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            problems.append(f"console.{params['type']}: {text}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            problems.append(f"browser error ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}".rstrip())

    formulas = _count_formulas(path)
    facts["formulas_in_html"] = formulas
    if require_math and formulas == 0:
        problems.append("the page should hold formulas but its HTML has none")
    if formulas or require_math:
        if not facts["mathjax"]:
            problems.append("MathJax did not load")
        elif facts["typeset"] < formulas:
            problems.append(f"MathJax typeset {facts['typeset']} of the page's {formulas} formulas")
        if facts["rendered"] == 0:
            problems.append("no MathJax output element (.MathJax_SVG ...) in the page")
    if facts["tex_errors"]:
        problems.append(f"TeX errors in: {facts['tex_errors']}")
    if facts["raw"]:
        problems.append(f"raw math delimiters left in the text: {facts['raw']}")
    if facts["mathjax_message"]:
        problems.append(f"MathJax says: {facts['mathjax_message']}")

    if screenshot:
        height = max(600, min(int(facts.get("height") or 900), 16000))
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
        browser.pump(0.3)
        shot = browser.send("Page.captureScreenshot", {"format": "png"}, session=session)["data"]
        import base64
        data = base64.b64decode(shot)
        Path(screenshot).parent.mkdir(parents=True, exist_ok=True)
        Path(screenshot).write_bytes(data)
        if not data.startswith(b"\x89PNG") or len(data) < 1000:
            problems.append(f"the screenshot {screenshot} is not a PNG")
    browser.send("Target.closeTarget", {"targetId": target})
    return problems, facts


# --------------------------------------------------------------------------- commands

def command_links(args):
    problems, files, checked = check_links(args.html)
    if args.missing_figures and Path(args.missing_figures).is_file():
        # Figures a chapter shows but nothing makes (docs/CMakeLists.txt lists them).
        for line in Path(args.missing_figures).read_text().splitlines():
            if line.strip():
                problems.append(f"missing figure: {line.strip()}")
    for problem in problems[:200]:
        print("BROKEN:", problem)
    if len(problems) > 200:
        print(f"... and {len(problems) - 200} more")
    print(f"links: {files} files, {checked} internal references, {len(problems)} problem(s)")
    return 1 if problems else 0


def command_browser(args):
    chromium = find_chromium()
    if not chromium:
        print("SKIPPED: Chromium is not installed (Debian: apt-get install chromium); "
              "the docs' browser check needs it")
        return SKIP
    html_dir = Path(args.html)
    failed = False
    browser = Browser(chromium)
    try:
        for page in args.page:
            path = html_dir / page
            if not path.is_file():
                print(f"FAIL {page}: {path} does not exist")
                failed = True
                continue
            screenshot = Path(args.screenshots) / (Path(page).stem + ".png")
            problems, facts = check_page(browser, path, screenshot, page in args.require_math)
            status = "FAIL" if problems else "ok"
            print(f"{status:4} {page}: title '{facts['title']}', {facts['formulas_in_html']} formulas in the HTML, "
                  f"{facts['typeset']} typeset by MathJax ({facts['rendered']} output elements); screenshot {screenshot}")
            for problem in problems:
                print(f"     - {problem}")
            failed = failed or bool(problems)
    finally:
        browser.close()
    return 1 if failed else 0


_SELFTEST_PAGES = {
    "clean": ("<p>Clean: \\(\\theta_i = b^{-2i/d}\\)</p>", []),
    "uncaught": ("<p>\\(x\\)</p><script>setTimeout(() => { undefinedFunction(); }, 100);</script>",
                 ["uncaught exception"]),
    "missing_script": ("<p>\\(x\\)</p><script src=\"no_such_script.js\"></script>", ["browser error"]),
    "console_error": ("<p>\\(x\\)</p><script>console.error('injected console error');</script>", ["console.error"]),
    "tex_error": ("<p>\\(\\undefinedmacro x\\)</p>", ["TeX errors"]),
    "mathjax_file_missing": ("<p>\\(x\\)</p><script>MathJax.Hub.Config({extensions: ['no_such_extension.js']});</script>",
                             ["browser error"]),
    "untypeset": ("<p>\\(x\\)</p><script>window.MathJax = undefined;</script>", ["MathJax"]),
}


def command_selftest(args):
    chromium = find_chromium()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    # The pages use the site's own MathJax copy, configured as Doxygen configures it.
    mathjax = os.path.relpath(Path(args.html).resolve() / "mathjax", work.resolve())
    head = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>selftest</title>"
            "<script type='text/x-mathjax-config'>MathJax.Hub.Config({extensions: ['tex2jax.js'],"
            " jax: ['input/TeX','output/SVG']});</script>"
            f"<script src='{mathjax}/MathJax.js'></script></head><body>")
    failures = []

    # Links: one broken internal link must be found, the rest of the folder is fine.
    site = work / "site"
    site.mkdir()
    (site / "index.html").write_text("<html><body><a href='exists.html'>ok</a> <a href='missing.html'>broken</a>"
                                     "<img src='https://example.com/x.png'></body></html>")
    (site / "exists.html").write_text("<html><body>ok</body></html>")
    problems, _, _ = check_links(site)
    if not any("missing.html" in p for p in problems):
        failures.append("links: a broken link was not reported")
    if not any("network" in p for p in problems):
        failures.append("links: an image loaded from the network was not reported")
    if any("exists.html" in p for p in problems):
        failures.append("links: a good link was reported")
    print(f"selftest links: {len(problems)} problem(s) found, as expected: {problems}")

    if not chromium:
        print("SKIPPED: Chromium is not installed (Debian: apt-get install chromium); the link selftest passed")
        return SKIP if not failures else 1
    browser = Browser(chromium)
    try:
        for name, (body, expected) in _SELFTEST_PAGES.items():
            page = work / f"{name}.html"
            if name == "untypeset":  # MathJax never loads: the formula stays raw
                page.write_text("<!DOCTYPE html><html><head><title>t</title></head><body>" + body + "</body></html>")
            else:
                page.write_text(head + body + "</body></html>")
            problems, _ = check_page(browser, page, None, require_math=True)
            if expected:
                missing = [e for e in expected if not any(e in p for p in problems)]
                ok = not missing
            else:
                ok = not problems
            print(f"selftest {name}: {'detected as expected' if expected and ok else 'passes as expected' if ok else 'WRONG'}"
                  f"; problems: {problems}")
            if not ok:
                failures.append(f"{name}: expected {expected or 'no problem'}, got {problems}")
    finally:
        browser.close()
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    links = sub.add_parser("links")
    links.add_argument("--html", required=True)
    links.add_argument("--missing-figures", help="file listing figures the chapters show but nothing makes")
    browser = sub.add_parser("browser")
    browser.add_argument("--html", required=True)
    browser.add_argument("--screenshots", required=True)
    browser.add_argument("--page", action="append", required=True)
    browser.add_argument("--require-math", action="append", default=[])
    selftest = sub.add_parser("selftest")
    selftest.add_argument("--html", required=True)
    selftest.add_argument("--work", required=True)
    args = parser.parse_args()
    return {"links": command_links, "browser": command_browser, "selftest": command_selftest}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
