"""The HTML report in a real browser: kvcheck runs a mutant known to fail
(M2: get_cache of one id hands out the stored object itself) with
--report html; headless Chromium (Debian's package) loads the page, and
the DOM it built must hold the failure's picture: the failing step framed,
the boxes the check names highlighted, the shared storage linked, the
replay command. A screenshot of the page is kept in the build directory
(report_html.png), for a person to look at.

    report_html_test.py KVCHECK CHROMIUM SCREENSHOT
"""

import html.parser
import os
import shutil
import subprocess
import sys
import tempfile


class Dom(html.parser.HTMLParser):
    """The elements of a page: (tag, attributes, text inside, direct)."""

    def __init__(self):
        super().__init__()
        self.elements = []
        self.open = []

    def handle_starttag(self, tag, attrs):
        element = {"tag": tag, "attrs": dict(attrs), "text": ""}
        self.elements.append(element)
        if tag not in ("rect", "path", "meta", "br", "input", "img", "link"):
            self.open.append(element)

    def handle_endtag(self, tag):
        while self.open:
            if self.open.pop()["tag"] == tag:
                break

    def handle_data(self, data):
        for element in self.open:
            element["text"] += data

    def having(self, tag, class_name):
        return [e for e in self.elements
                if e["tag"] == tag and class_name in (e["attrs"].get("class") or "").split()]


def chromium(binary, *arguments):
    # As root, Chromium runs only without its sandbox; nothing here is fetched.
    command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--no-first-run", "--disable-extensions", *arguments]
    return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)


def main(kvcheck, browser, screenshot):
    scratch = tempfile.mkdtemp(prefix="kvcheck-report-html-test-")
    try:
        page = os.path.join(scratch, "report.html")
        run = subprocess.run([kvcheck, "run", "--adapter", "M2", "--property", "stored-immutable", "--cases", "100",
                              "--failures", "1", "--report", "html", "--out", page, "--quiet",
                              "--trace-dir", os.path.join(scratch, "traces")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert run.returncode == 1, f"kvcheck exited {run.returncode}: {run.stderr}"
        with open(page) as file:
            source = file.read()
        assert "<script" not in source and "http://" not in source and "https://" not in source, \
            "the page must be self-contained"

        dumped = chromium(browser, "--dump-dom", "file://" + page)
        assert dumped.returncode == 0 and "</html>" in dumped.stdout, dumped.stderr[-2000:]
        dom = Dom()
        dom.feed(dumped.stdout)
        failing = dom.having("section", "failing")
        assert len(failing) == 1, f"{len(failing)} failing steps"
        assert dom.having("td", "fail"), "the table shows no FAIL"
        culprits = dom.having("rect", "culprit")
        assert culprits, "no box is highlighted"
        links = dom.having("path", "link")
        assert links, "no shared storage is drawn"
        named = {c["attrs"]["data-name"] for c in culprits}
        linked = {name for link in links for name in (link["attrs"]["data-from"], link["attrs"]["data-to"])}
        assert named & linked, f"the highlighted boxes {named} are not among the linked ones {linked}"
        checks = dom.having("div", "check")
        assert len(checks) == 1 and checks[0]["text"].strip(), "the check's message is not beside the failing step"
        replay = dom.having("pre", "replay")
        assert replay and replay[0]["text"].startswith("kvcheck replay "), replay
        assert dom.having("div", "bar"), "no coverage chart"

        shot = chromium(browser, "--screenshot=" + screenshot, "--window-size=1280,900", "--hide-scrollbars",
                        "file://" + page)
        assert shot.returncode == 0 and os.path.getsize(screenshot) > 1000, shot.stderr[-2000:]
        with open(screenshot, "rb") as file:
            assert file.read(8) == b"\x89PNG\r\n\x1a\n", "the screenshot is not a PNG"
        print(f"report_html_test: ok; {len(failing[0]['text'])} characters in the failing step, {len(culprits)} "
              f"highlighted boxes, {len(links)} links; screenshot {screenshot}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
