"""The HTML report in a real browser: kvcheck runs a mutant known to fail
(M2: get_cache of one id hands out the stored object itself) with
--report html; headless Chromium (Debian's package) loads the page, and
the DOM it built must hold the failure's picture: the failing step framed,
the boxes the check names highlighted, the shared storage linked, the
replay command. The failures come first (a line per failing property
linking to its drawing), then the table; no text is clipped at 900 or
1,400 pixels of width (measured in the browser by a script added to a copy
of the page: the report itself holds none); the coverage chart shows only
shapes of operations the adapter claims. Screenshots at both widths are
kept in the build directory (report_html.png, report_html-900.png), for a
person to look at.

    report_html_test.py KVCHECK CHROMIUM SCREENSHOT
"""

import html.parser
import json
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


# Added to a copy of the page: what is drawn past its box, and whether the
# page is wider than the window (a table or a picture wider than the window
# scrolls inside its own box instead). The answer goes into the DOM.
LAYOUT_PROBE = """<script>
window.addEventListener("load", () => {
  const problems = [];
  for (const text of document.querySelectorAll("svg text")) {
    const drawn = text.getBBox();
    const rect = text.closest("g") && text.closest("g").querySelector("rect");
    const limit = rect ? rect.getBBox().x + rect.getBBox().width : text.ownerSVGElement.width.baseVal.value;
    if (drawn.x + drawn.width > limit + 0.5) problems.push("text past its box: " + text.textContent);
  }
  const page = document.documentElement.scrollWidth;
  if (page > window.innerWidth + 1) problems.push("the page is " + page + " px wide in a window of " + window.innerWidth);
  const out = document.createElement("pre");
  out.id = "layout-probe";
  out.textContent = JSON.stringify({width: window.innerWidth, problems: problems});
  document.body.appendChild(out);
});
</script>"""


def layout_problems(browser, page, width):
    """What is clipped or too wide at `width` pixels."""
    probed = page.replace(".html", f"-probe-{width}.html")
    with open(page) as source, open(probed, "w") as out:
        out.write(source.read().replace("</body>", LAYOUT_PROBE + "</body>"))
    dumped = chromium(browser, f"--window-size={width},1000", "--virtual-time-budget=5000", "--dump-dom",
                      "file://" + probed)
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    found = [e for e in dom_of(dumped.stdout).elements if e["attrs"].get("id") == "layout-probe"]
    assert found, f"the layout probe did not run at {width} px"
    result = json.loads(found[0]["text"])
    assert result["width"] == width, result
    return result["problems"]


def dom_of(text):
    dom = Dom()
    dom.feed(text)
    return dom


def main(kvcheck, browser, screenshot):
    scratch = tempfile.mkdtemp(prefix="kvcheck-report-html-test-")
    try:
        page = os.path.join(scratch, "report.html")
        run = subprocess.run([kvcheck, "run", "--adapter", "M2", "--property", "stored-immutable", "--property",
                              "refcount-exact", "--cases", "100",
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
        dom = dom_of(dumped.stdout)
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

        # The failures first: each line of the summary links to a drawing
        # on the page, and they come before the table.
        order = [e for e in dom.elements if e["tag"] in ("ul", "table") and
                 ({"summary", "verdicts"} & set((e["attrs"].get("class") or "").split()))]
        assert [e["attrs"]["class"] for e in order] == ["summary", "verdicts"], order
        anchors = {e["attrs"]["id"] for e in dom.elements if e["tag"] == "h3" and "id" in e["attrs"]}
        links = [e["attrs"]["href"] for e in dom.elements if e["tag"] == "a" and e["attrs"].get("href", "").startswith("#")]
        assert links and all(link[1:] in anchors for link in links), (links, anchors)
        # A contiguous adapter: the paged rows are left out, and said to be.
        rows = [e["text"] for e in dom.elements if e["tag"] == "th"]
        assert "refcount-exact" not in rows and dom.having("p", "left-out"), rows
        # The chart shows the shapes of operations M2 claims (every one but
        # those of shapes left out, tests/failure_shape_test.cpp).
        chart = dom.having("div", "bars")[0]["text"]
        left_out = dom.having("p", "not-drawn")
        for shape in ("merge", "interrupted_dump", "metadata_item"):
            assert shape in chart, f"{shape} is not in the chart: {chart}"
        for shape in (left_out[0]["text"].split(": ", 1)[1].split(", ") if left_out else []):
            assert shape.strip() not in chart, f"{shape} is both charted and left out"

        for width in (900, 1400):
            problems = layout_problems(browser, page, width)
            assert not problems, f"at {width} px: {problems}"

        for path, width in ((screenshot, 1400), (screenshot.replace(".png", "-900.png"), 900)):
            shot = chromium(browser, "--screenshot=" + path, f"--window-size={width},1000", "--hide-scrollbars",
                            "file://" + page)
            assert shot.returncode == 0 and os.path.getsize(path) > 1000, shot.stderr[-2000:]
            with open(path, "rb") as file:
                assert file.read(8) == b"\x89PNG\r\n\x1a\n", "the screenshot is not a PNG"
        print(f"report_html_test: ok; {len(failing[0]['text'])} characters in the failing step, {len(culprits)} "
              f"highlighted boxes, {len(links)} links; screenshot {screenshot}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
