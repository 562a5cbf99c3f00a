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
person to look at. A failure of several lanes (LM3 with --lanes 3) is
drawn as a table of lanes: each call in its lane's column, in schedule
order, the failing call outlined and the conflicting ones shaded.

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
        element = {"tag": tag, "attrs": dict(attrs), "text": "", "parent": self.open[-1] if self.open else None}
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


def inside(element, ancestor):
    while element is not None:
        if element is ancestor:
            return True
        element = element["parent"]
    return False


def check_lanes(kvcheck, browser, scratch):
    """A failure in a trace of several lanes (LM3, a split load/store count,
    caught by refcount-exact with 3 clients) is drawn as a table of lanes:
    a column per lane that calls, a row per call in schedule order, each
    call in its own lane's column as the trace's switches say, the failing
    call outlined (the last row: a shrunk trace ends at its failure), the
    calls of requests open at it shaded; the table fits a 900 px window."""
    page = os.path.join(scratch, "lanes.html")
    traces = os.path.join(scratch, "lanes-traces")
    run = subprocess.run([kvcheck, "run", "--adapter", "LM3", "--lanes", "3", "--property", "refcount-exact",
                          "--cases", "100", "--failures", "1", "--report", "html", "--out", page, "--quiet",
                          "--trace-dir", traces], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert run.returncode == 1, f"kvcheck exited {run.returncode}: {run.stderr}"
    with open(os.path.join(traces, "LM3-refcount-exact.trace")) as file:
        steps = [line.strip() for line in file if line.strip() and not line.lstrip().startswith("#")]
    lane, lane_of = 0, []
    for step in steps:
        if step.startswith("switch lane="):
            lane = int(step.split("=", 1)[1])
        lane_of.append(lane)
    calls = [i for i, step in enumerate(steps) if not step.startswith("switch ")]
    lanes = sorted({lane_of[i] for i in calls})
    assert len(lanes) >= 2, f"the shrunk trace has one lane: {steps}"

    dumped = chromium(browser, "--dump-dom", "file://" + page)
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = dom_of(dumped.stdout)
    tables = dom.having("table", "lanes")
    assert len(tables) == 1, f"{len(tables)} lanes tables"
    table = tables[0]
    headers = [e["text"].strip() for e in dom.elements if e["tag"] == "th" and inside(e, table)]
    assert headers == ["step"] + [f"lane {k}" for k in lanes], (headers, lanes)
    rows = [e for e in dom.elements if e["tag"] == "tr" and "data-step" in e["attrs"] and inside(e, table)]
    assert [int(r["attrs"]["data-step"]) for r in rows] == calls, ([r["attrs"]["data-step"] for r in rows], calls)
    failing, shaded = [], 0
    for row in rows:
        step = int(row["attrs"]["data-step"])
        cells = [e for e in dom.elements if e["tag"] == "td" and e["parent"] is row]
        assert len(cells) == 1 + len(lanes) and cells[0]["text"].strip() == str(step), row
        filled = [k for k, cell in enumerate(cells[1:]) if cell["text"].strip()]
        assert filled == [lanes.index(lane_of[step])], f"step {step} drawn in columns {filled}"
        cell = cells[1 + filled[0]]
        assert cell["text"].strip() == steps[step], (cell["text"], steps[step])
        classes = (cell["attrs"].get("class") or "").split()
        failing += [step] if "failing" in classes else []
        shaded += "conflict" in classes
    assert failing == [calls[-1]], f"failing cells at {failing}, the failing call is step {calls[-1]}"
    assert shaded >= 1, "no conflicting call is shaded"
    problems = layout_problems(browser, page, 900)
    assert not problems, f"the lanes at 900 px: {problems}"
    return len(rows), len(lanes), shaded


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
        rows, lanes, shaded = check_lanes(kvcheck, browser, scratch)
        print(f"report_html_test: ok; {len(failing[0]['text'])} characters in the failing step, {len(culprits)} "
              f"highlighted boxes, {len(links)} links; lanes: {rows} calls in {lanes} lanes, {shaded} shaded; "
              f"screenshot {screenshot}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
