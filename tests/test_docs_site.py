"""The documentation site: it builds with ``mkdocs build --strict`` (a broken link or anchor is an
error), its generated pages hold what the code says, every Python block in docs/ compiles or is
a marked fragment, and every built page loads in headless Chromium with no console error and
with internal links that resolve."""

from __future__ import annotations

import base64
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_readme_snippets import FRAGMENT, cli_reference, python_blocks

REPO = Path(__file__).resolve().parent.parent
MKDOCS = Path(sys.executable).parent / "mkdocs"
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)}  # no banner about MkDocs 2.0

# The blocks that are excerpts (they name objects the reader supplies), by page and heading: a
# new fragment is a decision made here, not a way to skip a block that stopped compiling.
FRAGMENTS = {
    ("determined.md", "Mixtures"),
    ("tensorflow.md", "TensorFlow and the DataLayer"),
}


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True, text=True, timeout=600, env=ENV, cwd=config.parent,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once for this module's tests, strictly."""
    out = tmp_path_factory.mktemp("site")
    result = build(REPO / "mkdocs.yml", out)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    assert "WARNING" not in log and "not found among documentation files" not in log, log[-6000:]
    return out


def test_the_site_builds_strictly_with_every_page(site: Path) -> None:
    config = (REPO / "mkdocs.yml").read_text()
    assert "strict: true" in config and "anchors: warn" in config  # validation warnings fail --strict
    pages = sorted(p.relative_to(REPO / "docs") for p in (REPO / "docs").rglob("*.md"))
    for page in pages:  # every Markdown page is in the nav and built
        assert f" {page.as_posix()}\n" in config, f"{page} is not in mkdocs.yml's nav"
        html = "index.html" if page.stem == "index" else page.with_suffix("").as_posix() + "/index.html"
        built = site / html
        assert built.is_file(), built
    assert (site / "search" / "search_index.json").is_file()
    assert (site / "architecture" / "index.html").is_file() and (site / "benchmarks" / "index.html").is_file()


def test_the_cli_reference_is_generated_from_the_parser(site: Path) -> None:
    from yogacache.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    html = (site / "cli" / "index.html").read_text()
    for name, sub in commands.items():
        assert f'id="yogacache-{name}"' in html, name
        for action in sub._actions:
            for option in () if action.dest == "help" else action.option_strings:
                assert option in html, f"{name} {option}"
    assert "<!-- cli-reference -->" not in html
    assert cli_reference().count("\n### yogacache ") == len(commands)


def test_the_api_reference_documents_the_public_modules(site: Path) -> None:
    expected = {
        "yogacache": ["DataLayer", "cache_train_dataset", "DataRef", "Stream"],
        "store": ["open_store", "open_cache", "LFSStorage"],
        "torch": ["CacheDataLoader", "CacheIterableDataset", "CacheDataset"],
        "tensorflow": ["make_tf_dataset"],
        "grain": ["CacheDataSource", "CacheSampler", "open_data_source"],
        "ray": ["read_cache", "CacheDatasource"],
        "determined": ["data_layer", "DeterminedDataLayer"],
        "mixture": ["Mixture", "Component", "load_mixture"],
        "errors": ["YogaCacheError", "CorruptCacheError", "CacheNotFoundError"],
    }
    for page, names in expected.items():
        html = (site / "api" / page / "index.html").read_text()
        for name in names:
            assert re.search(rf'id="[\w.]*\b{name}"', html), f"api/{page}: {name}"


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    shutil.copytree(REPO / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    config = (REPO / "mkdocs.yml").read_text().replace("paths: [.]", f"paths: [{REPO}]")
    (tmp_path / "mkdocs.yml").write_text(config)
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[a](cli.md#no-such-anchor) and [b](no-such-page.md)\n")
    result = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    log = result.stdout + result.stderr
    assert result.returncode != 0, log[-3000:]
    assert "no-such-anchor" in log and "no-such-page.md" in log, log[-3000:]


def test_every_docs_python_block_compiles_or_is_a_marked_fragment() -> None:
    fragments = set()
    for page in sorted((REPO / "docs").rglob("*.md")):
        for block in python_blocks(page):
            if block.fragment:
                fragments.add((page.relative_to(REPO / "docs").as_posix(), block.heading))
                continue
            try:
                compile(block.code, f"{page.name} ({block.heading})", "exec")
            except SyntaxError as error:
                pytest.fail(f"docs/{page.name}, under {block.heading!r}: {error}; fix it, or mark the "
                            f"block as an excerpt with a {FRAGMENT} line before it (and list it in FRAGMENTS)")
    assert fragments == FRAGMENTS, fragments ^ FRAGMENTS


# -- the built pages in a real browser ----------------------------------------------------------------
def chromium() -> str:
    """Debian's chromium, installed with apt-get when it is missing (make test runs as root)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    root = [] if os.geteuid() == 0 or not shutil.which("sudo") else ["sudo", "-n"]  # not root: sudo, if allowed
    install = [*root, "apt-get", "install", "-y", "chromium"]
    for command in (install, [*root, "apt-get", "update"], install):  # an old package list: update, try again
        quiet = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(command, capture_output=True, text=True, timeout=900, env=quiet)
        found = shutil.which("chromium")
        if found:
            return found
    pytest.fail("the docs check needs headless Chromium and `apt-get install -y chromium` did not install it: "
                "install Debian's chromium package (as root) and run the test again")


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class DevTools:
    """One page of a headless Chromium, driven over the DevTools protocol."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return dict(message.get("result", {}))
            self.events.append(message)

    def wait_for(self, method: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            self.events.append(json.loads(self.socket.recv(timeout=max(0.1, deadline - time.monotonic()))))

    def drain(self, quiet: float = 0.3) -> None:
        """Collects events until none came for ``quiet`` seconds (late console errors included)."""
        while True:
            try:
                self.events.append(json.loads(self.socket.recv(timeout=quiet)))
            except TimeoutError:
                return


def errors_in(events: list[dict[str, Any]]) -> list[str]:
    found = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            found.append(params["exceptionDetails"].get("exception", {}).get("description", str(params)))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            found.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            found.append(f"{params['entry'].get('text')} {params['entry'].get('url', '')}")
    return found


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    profile = tmp_path_factory.mktemp("chromium-profile")
    process = subprocess.Popen(
        [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert process.stderr is not None
        port = None
        for line in process.stderr:
            match = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if match:
                port = match.group(1)
                break
        assert port, "chromium did not start its DevTools endpoint"
        threading.Thread(target=process.stderr.read, daemon=True).start()  # keep its pipe drained
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as answer:
            pages = [t for t in json.load(answer) if t["type"] == "page"]
        from websockets.sync.client import connect

        with connect(pages[0]["webSocketDebuggerUrl"], max_size=2**26) as socket:
            tools = DevTools(socket)
            for domain in ("Page", "Runtime", "Log"):
                tools.call(f"{domain}.enable")
            yield tools
    finally:
        process.terminate()
        process.wait(timeout=30)


def resolves(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


# `YOGACACHE_DOCS_SCREENSHOTS=DIR`: the browser check also saves each page as DIR/<page>.png,
# 1280x800 (docs/img/screens/ holds one page of each section of the site, made so).
SCREENSHOTS = os.environ.get("YOGACACHE_DOCS_SCREENSHOTS")


def save_screenshot(browser: DevTools, page: str) -> None:
    if not SCREENSHOTS:
        return
    browser.call("Emulation.setDeviceMetricsOverride", width=1280, height=800, deviceScaleFactor=1, mobile=False)
    shot = browser.call("Page.captureScreenshot", format="png")
    out = Path(SCREENSHOTS) / (page.removesuffix(".html").replace("/", "_") + ".png")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(base64.b64decode(shot["data"]))


LINKS_AND_IDS = """JSON.stringify({
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  ids: [...document.querySelectorAll('[id]')].map(e => e.id),
})"""


def test_every_page_loads_in_chromium_with_no_console_error_and_links_that_resolve(
    site: Path, served: str, browser: DevTools
) -> None:
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    assert len(pages) >= 30, pages
    ids: dict[str, set[str]] = {}
    links: dict[str, list[str]] = {}
    problems = []
    for page in pages:
        url = f"{served}/{page}"
        browser.events.clear()
        browser.call("Page.navigate", url=url)
        browser.wait_for("Page.loadEventFired")
        browser.drain()
        problems += [f"{page}: console: {error}" for error in errors_in(browser.events)]
        save_screenshot(browser, page)
        answer = browser.call("Runtime.evaluate", expression=LINKS_AND_IDS, returnByValue=True)
        found = json.loads(answer["result"]["value"])
        path = urllib.parse.urlsplit(url).path
        ids[path] = set(found["ids"])
        links[path] = found["links"]
    for path in ids.copy():  # a directory's URL is its index.html
        if path.endswith("/index.html"):
            ids[path[: -len("index.html")]] = ids[path]
    for page, hrefs in links.items():
        for href in hrefs:
            target = urllib.parse.urlsplit(href)
            if f"{target.scheme}://{target.netloc}" != served:
                continue  # outside the site
            if target.path not in ids:
                if not resolves(f"{served}{target.path}"):  # a file of the site (an asset, the sitemap)
                    problems.append(f"{page}: link to {href}: no such page")
            elif target.fragment and urllib.parse.unquote(target.fragment) not in ids[target.path]:
                problems.append(f"{page}: link to {href}: no such anchor")
    assert not problems, "\n".join(problems[:50])
