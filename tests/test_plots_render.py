"""`dvc plots show` drawn for real: its HTML opened in headless Chromium, and the SVG the
browser drew read back, plot by plot.

The HTML template given to `dvc plots show --html-template` loads vega, vega-lite and
vega-embed from .cache/vega/ (tests/setup_browser.sh fetches them; the default template's CDN
is out of reach here) and has vega-embed draw SVG, so the drawn marks are in the DOM that
`chromium --dump-dom` prints; it also leaves each embed's outcome on its div (drawn / error).

Needs chromium and the cached JS: `./run.sh test` sets both up where it can; otherwise the
tests skip, saying how, except with STRUCTINIT_REQUIRE_BROWSER=1 (CI, .ci/run), where they fail.
"""
from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
VEGA_JS = [REPO / ".cache/vega" / f for f in ("vega.min.js", "vega-lite.min.js", "vega-embed.min.js")]
# the flags that work on these machines (root, no GPU, no network, no D-Bus)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--virtual-time-budget=20000"]    # run the page's timers/promises until drawn
METRICS = ("test_acc", "train_acc", "test_loss", "train_loss")

# {plot_divs} is DVC's placeholder; it leaves out the CDN <script>s ({scripts}), and the
# local ones are filled in below (str.replace: the JS is full of braces)
HTML_TEMPLATE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<title>structinit plots</title>
<script src="VEGA"></script>
<script src="VEGA_LITE"></script>
<script src="VEGA_EMBED"></script>
<script>
// DVC's divs call vegaEmbed('#id', spec). Draw SVG (marks readable in the DOM) and record
// the outcome on the div: data-embed = pending / drawn / error (message in a <pre>).
(function () {
  var embed = window.vegaEmbed;
  window.vegaEmbed = function (el, spec, opts) {
    var div = document.querySelector(el);
    div.setAttribute("data-embed", "pending");
    return embed(el, spec, Object.assign({renderer: "svg", actions: false}, opts || {}))
      .then(function (r) { div.setAttribute("data-embed", "drawn"); return r; })
      .catch(function (e) {
        div.setAttribute("data-embed", "error");
        var pre = document.createElement("pre");
        pre.className = "embed-error";
        pre.textContent = String(e);
        div.appendChild(pre);
      });
  };
})();
</script>
</head>
<body>
{plot_divs}
</body>
</html>
"""


@dataclass
class Drawn:
    """What the browser drew in one plot's div."""
    status: str | None = None                       # data-embed: drawn / error / pending
    svgs: int = 0
    lines: list[tuple[str, int]] = field(default_factory=list)   # (line label, points on its path),
                                                   # a list: facets (datasets) repeat labels
    bands: int = 0                                  # area paths (the ±1 std bands)
    errors: list[str] = field(default_factory=list)


class _PlotReader(HTMLParser):
    """Reads the dumped DOM: for each top-level <div id> (one per DVC plot) its Drawn."""
    VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                      "source", "track", "wbr"})

    def __init__(self):
        super().__init__()
        self.plots: dict[str, Drawn] = {}
        self.stack: list[tuple[str, dict]] = []
        self.plot: Drawn | None = None
        self.in_error = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and "id" in a and [t for t, _ in self.stack] == ["html", "body"]:
            self.plot = self.plots.setdefault(a["id"], Drawn())
            self.plot.status = a.get("data-embed")
        if self.plot is not None:
            marks = " ".join(attrs_.get("class", "") for t, attrs_ in self.stack if t == "g")
            d = a.get("d") or ""
            if tag == "svg":
                self.plot.svgs += 1
            elif tag == "path" and "mark-line" in marks and d:
                label = a.get("aria-label", "")
                name = re.search(r"initializer \(seeds\): ([^;]+)", label)
                self.plot.lines.append((name.group(1) if name else label, len(re.findall(r"[ML]", d))))
            elif tag == "path" and "mark-area" in marks and d:
                self.plot.bands += 1
            elif tag == "pre" and "embed-error" in a.get("class", ""):
                self.in_error = True
        if tag not in self.VOID:
            self.stack.append((tag, a))

    def handle_endtag(self, tag):
        while self.stack:                            # tolerate unclosed tags
            if self.stack.pop()[0] == tag:
                break
        if tag == "pre":
            self.in_error = False
        if len(self.stack) == 2 and tag == "div":   # left a plot's div
            self.plot = None

    def handle_data(self, data):
        if self.in_error and self.plot is not None:
            self.plot.errors.append(data.strip())


def _sh(cwd, *cmd, timeout=120):
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", DVC_NO_ANALYTICS="1")
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if r.returncode:
        raise AssertionError(f"{cmd} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r


def _missing(what: str, how: str):
    """Skip, saying how to set it up; in CI (STRUCTINIT_REQUIRE_BROWSER=1) fail instead."""
    if os.environ.get("STRUCTINIT_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{what} not found ({how}); STRUCTINIT_REQUIRE_BROWSER=1: CI must render the plots")
    pytest.skip(f"{what} not found: {how}")


@pytest.fixture(scope="module")
def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        _missing("chromium", "apt-get install -y chromium (./run.sh test does it when run as root)")
    lacking = [p.name for p in VEGA_JS if not p.is_file()]
    if lacking:
        _missing(f"{lacking} in .cache/vega", "run tests/setup_browser.sh (needs npm and the npm registry)")
    return exe


def render(chromium: str, repo: Path, out: Path, js_files: list[Path] = VEGA_JS) -> dict[str, Drawn]:
    """`dvc plots show` in `repo` with the local-JS template, opened in the browser: what it drew."""
    template = HTML_TEMPLATE
    for anchor, js in zip(("VEGA", "VEGA_LITE", "VEGA_EMBED"), js_files):
        template = template.replace(f'"{anchor}"', f'"{js.as_uri()}"')
    (out / "template.html").write_text(template)
    _sh(repo, "dvc", "plots", "show", "--html-template", str(out / "template.html"), "-o", str(out / "html"))
    with tempfile.TemporaryDirectory() as profile:     # a fresh profile: no state between runs
        dom = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom",
                              (out / "html/index.html").as_uri()],
                             capture_output=True, text=True, timeout=120, check=False)
    assert dom.returncode == 0 and "<body" in dom.stdout, f"chromium failed:\n{dom.stderr[-2000:]}"
    reader = _PlotReader()
    reader.feed(dom.stdout)
    return reader.plots


def problems(drawn: Drawn, expected_lines) -> list[str]:
    """Why a plot is not what the data says it must be (empty: drawn right). expected_lines:
    (line label `<init> (n = <seeds>)`, points = epochs with a value) pairs, one per dataset and
    init (or a dict label -> points)."""
    found = []
    if isinstance(expected_lines, dict):
        expected_lines = list(expected_lines.items())
    expected_lines = sorted(expected_lines)
    if drawn.status != "drawn" or drawn.errors:
        found.append(f"embed {drawn.status}: {drawn.errors}")
    if drawn.svgs < 1:
        found.append("no <svg>")
    if sorted(drawn.lines) != expected_lines:
        found.append(f"lines {drawn.lines}, expected {expected_lines}")
    if drawn.bands != len(expected_lines):
        found.append(f"{drawn.bands} bands, expected one per line ({len(expected_lines)})")
    return found


def expected_lines(csv_path: Path, metric: str) -> list[tuple[str, int]]:
    """From the CSV: one line per (dataset, init), named as the template labels it, with one
    point per epoch where some seed has a value (the test metrics: evaluated epochs only)."""
    epochs, seeds = {}, {}
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            key = (row["dataset"], row["init"])
            if row[metric] != "":
                epochs.setdefault(key, set()).add(row["epoch"])
                seeds.setdefault(key, set()).add(row["seed"])
    return sorted((f"{init} (n = {len(seeds[d, init])})", len(e)) for (d, init), e in epochs.items())


def plot_repo(root: Path, plots: list, curves_csv: str, templates: dict[str, str]) -> Path:
    """A bare DVC project (no git) holding only plots: dvc.yaml's `plots:`, the templates
    and the CSV."""
    repo = root / "repo"
    (repo / "reports").mkdir(parents=True)
    _sh(repo, "dvc", "init", "--no-scm", "-q")
    (repo / ".dvc/plots").mkdir(exist_ok=True)
    for name, text in templates.items():
        (repo / f".dvc/plots/{name}.json").write_text(text)
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"plots": plots}, sort_keys=False))
    (repo / "reports/curves.csv").write_text(curves_csv)
    return repo


def test_dvc_plots_show_draws_every_curve(chromium, tmp_path):
    """The project's own plots (dvc.yaml, .dvc/plots/mean_band.json) of the committed
    reports/curves.csv: every plot drawn, one line and one band per initializer, each line
    with a point per epoch (train) or per evaluated epoch (test), no error."""
    plots = yaml.safe_load((REPO / "dvc.yaml").read_text())["plots"]
    templates = {p.stem: p.read_text() for p in (REPO / ".dvc/plots").glob("*.json")}
    csv_text = (REPO / "reports/curves.csv").read_text()
    repo = plot_repo(tmp_path, plots, csv_text, templates)
    out = tmp_path / "out"
    out.mkdir()
    drawn = render(chromium, repo, out)

    # which column each plot draws, from dvc.yaml; DVC's div id is the plot id, special chars -> _
    ys = {re.sub(r"[^0-9A-Za-z-]", "_", name): next(iter(spec["y"].values()))
          for p in plots for name, spec in p.items()}
    assert sorted(ys.values()) == sorted(METRICS)
    assert set(drawn) == set(ys), f"plots drawn {sorted(drawn)}, dvc.yaml has {sorted(ys)}"
    failures = {div: found for div, y in ys.items()
                if (found := problems(drawn[div], expected_lines(REPO / "reports/curves.csv", y)))}
    assert not failures, failures
    test_points = {n for div, y in ys.items() if y.startswith("test") for _, n in drawn[div].lines}
    train_points = {n for div, y in ys.items() if y.startswith("train") for _, n in drawn[div].lines}
    assert max(test_points) < min(train_points)       # test curves: evaluated epochs only


BROKEN_TEMPLATE = '{"$schema": "https://vega.github.io/schema/vega-lite/v5.json", ' \
                  '"data": {"values": "<DVC_METRIC_DATA>"}, "mark": "no-such-mark", ' \
                  '"encoding": {"x": {"field": "<DVC_METRIC_X>"}, "y": {"field": "<DVC_METRIC_Y>"}}}'


def _plot(y: str, template: str = "mean_band") -> dict:
    return {y: {"template": template, "x": "epoch", "y": {"reports/curves.csv": y}}}


def test_a_plot_not_drawn_is_caught(chromium, tmp_path):
    """The checks above can fail: beside a good plot of a small CSV (2 inits × 2 seeds,
    3 epochs, test at epochs 2-3), a template that vega-lite rejects and a column with no
    value are both reported; and a missing JS library leaves every plot undrawn."""
    header = "dataset,init,seed,epoch,train_acc,train_loss,test_acc,test_loss,empty\n"
    rows = [f"toy,{init},{seed},{e},{10 * e + seed},{3 - e},{'' if e == 1 else 20 * e + seed},"
            f"{'' if e == 1 else 2 - e / 2},"
            for init in ("trunc_normal", "impulse3") for seed in (0, 1) for e in (1, 2, 3)]
    templates = {"mean_band": (REPO / ".dvc/plots/mean_band.json").read_text(), "broken": BROKEN_TEMPLATE}
    repo = plot_repo(tmp_path, [_plot("test_acc"), _plot("train_loss", "broken"), _plot("empty")],
                     header + "\n".join(rows) + "\n", templates)
    out = tmp_path / "out"
    out.mkdir()
    drawn = render(chromium, repo, out)

    two = {"trunc_normal (n = 2)": 2, "impulse3 (n = 2)": 2}
    assert problems(drawn["test_acc"], two) == []                 # epoch 1 (no test) skipped
    assert problems(drawn["test_acc"], {k: 3 for k in two})       # a wrong count is seen
    broken = problems(drawn["train_loss"], {k: 3 for k in two})
    assert broken and broken[0].startswith("embed error") and drawn["train_loss"].errors  # its message kept
    empty = problems(drawn["empty"], two)
    assert any(p.startswith("lines []") for p in empty) and drawn["empty"].status == "drawn"

    # no vega at all (a bad path in the template): nothing drawn, and the checks say so
    out = tmp_path / "out_without_vega"
    out.mkdir()
    undrawn = render(chromium, repo, out, [tmp_path / "missing.js"] + VEGA_JS[1:])
    assert problems(undrawn["test_acc"], two)[0].startswith("embed pending")
