"""The page in a real browser: Debian's chromium, headless, driven by Playwright's Python API.

Never downloads a browser: it runs ``/usr/bin/chromium`` (apt ``chromium``, in
.ci/apt-packages.txt; ``CODECD_CHROMIUM`` overrides the path) and skips when there is
none. The daemon runs in this process on a background event loop, with the demo model.
Screenshots of each view go to ``test-artifacts/`` (``CODECD_TEST_ARTIFACTS`` overrides).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, codecrt_or_skip

from codecd.config import Config, ModelSource, ensure_demo_model
from codecd.demo import DEMO_GROUPS, demo_ids
from codecd.server import Server

CHROMIUM = os.environ.get("CODECD_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("CODECD_TEST_ARTIFACTS", ROOT / "test-artifacts"))
DEMO_SAMPLES = DEMO_GROUPS * 2048  # 24 kHz, 2048 samples per Orpheus group
TOKEN = "page-token_7"

sync_api = pytest.importorskip("playwright.sync_api")
if shutil.which(CHROMIUM) is None:
    pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)


class ServerThread:
    """A codecd daemon on its own event loop in a background thread (the test thread drives
    the browser); ``start`` on a given port again after ``stop`` is a server restart."""

    def __init__(self, model: Path) -> None:
        self.model = model
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.srv: Server | None = None

    def _run(self, coro: Any, timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self, port: int = 0, **kw: Any) -> int:
        cfg = Config(listen=f"127.0.0.1:{port}", models=[ModelSource("demo", str(self.model))],
                     devices=["cpu"], threads=1, batch_buckets=[1], **kw)
        self.srv = Server(cfg, {"demo": str(self.model)})
        self._run(self.srv.start())
        return self.srv.port

    def stop(self) -> None:
        if self.srv is not None:
            self._run(self.srv.close())
            self.srv = None

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    codecrt_or_skip()
    return ensure_demo_model(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox", "--autoplay-policy=no-user-gesture-required"])
        yield b
        b.close()


@pytest.fixture()
def server(demo_model: Path) -> Iterator[ServerThread]:
    st = ServerThread(demo_model)
    try:
        yield st
    finally:
        st.close()


class Page:
    """A page of the browser on the server, with its JS errors collected."""

    def __init__(self, browser: Any, port: int) -> None:
        self.ctx = browser.new_context(viewport={"width": 1100, "height": 760})
        self.page = self.ctx.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        # console errors but the browser's own network reports (a refused upgrade while the
        # server restarts, the 401 that tells the page it needs a token)
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" and not (
            m.text.startswith("Failed to load resource") or
            m.text.startswith("WebSocket connection to")) else None)
        self.page.goto(f"http://127.0.0.1:{port}/")

    def js(self, body: str) -> Any:
        return self.page.evaluate(f"() => {body}")  # a function: evaluated despite the CSP

    def wait(self, body: str, timeout_s: float = 30.0) -> None:
        self.page.wait_for_function(f"() => {body}", timeout=timeout_s * 1000)

    def status(self) -> tuple[str, str]:
        return (self.page.get_attribute("#status", "data-state") or "",
                self.page.text_content("#status") or "")

    def play(self, fmt: str = "pcm_f32le") -> dict[str, Any]:
        """Stream the chosen source as fast as the server takes it; the page's result."""
        self.page.select_option("#format", fmt)
        self.page.select_option("#pace", "0")
        self.page.click("#play")
        self.wait("window.codecd.last !== null", 90)
        return dict(self.js("window.codecd.last"))

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / name), full_page=True)

    def close(self) -> None:
        self.ctx.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_page_plays_the_demo_sample_exact_and_charts_metrics(browser: Any,
                                                             server: ServerThread) -> None:
    """The page reads hello and plays the demo stream: the metrics view charts it while it plays; the AudioWorklet played exactly the samples the server sent."""
    pg = Page(browser, server.start())
    try:
        pg.wait("window.codecd.hello !== null")
        assert pg.status() == ("open", "connected to codecd/0.1.0")
        assert pg.js("window.codecd.hello.models.map(m => m.name)") == ["demo"]
        pg.page.select_option("#format", "pcm_s16le")
        pg.page.select_option("#pace", "1")  # the LM's real-time rate: the stream lasts ~3 s
        pg.page.click("#play")
        # the metrics view, while the page's own stream plays: the server counts it
        pg.page.click("#tab-server")
        pg.wait("window.codecd.metrics.streams.some(v => v >= 1)"
                " && window.codecd.metrics.tick.some(v => v > 0)")
        m = pg.js("window.codecd.metrics")
        assert m["errors"] == 0 and max(m["batch"]) >= 1
        assert pg.page.is_visible("#chart-tick") and not pg.page.is_visible("#wave")
        pg.wait("window.codecd.metrics.fetched >= 3")
        pg.shot("page-server.png")
        pg.page.click("#tab-listen")
        pg.wait("window.codecd.last !== null", 90)
        last = pg.js("window.codecd.last")
        assert last["outcome"] == "played", last
        assert last["played"] == last["sent"] == last["received"] == DEMO_SAMPLES, last
        assert last["ttfaMs"] > 0 and last["underruns"] >= 0
        assert pg.page.text_content("#played") == str(DEMO_SAMPLES)
        pg.shot("page-listen.png")
        assert pg.errors == []
    finally:
        pg.close()


def test_page_behind_the_token(browser: Any, server: ServerThread, tmp_path: Path) -> None:
    """With auth_token set the page says unauthorized; with the token typed in it gets a ticket, connects, refuses a file that is not tokens and plays a picked token file."""
    from codecd.families.orpheus import ids_to_custom_tokens

    tokens = tmp_path / "tokens.txt"
    tokens.write_text("".join(ids_to_custom_tokens(demo_ids())))  # as an LM prints them
    pg = Page(browser, server.start(auth_token=TOKEN))
    try:
        pg.wait("document.getElementById('status').dataset.state === 'unauthorized'")
        pg.page.fill("#token", TOKEN)
        pg.page.click("#connect")
        pg.wait("window.codecd.hello !== null")
        assert pg.status()[0] == "open"
        bad = tmp_path / "bad.txt"
        bad.write_text("128266 hello 128267")
        pg.page.set_input_files("#file", str(bad))
        pg.page.click("#play")
        pg.wait("window.codecd.events.some(e => e.startsWith('cannot stream: not a token: hello'))")
        assert pg.js("window.codecd.stream") is None and pg.page.is_enabled("#play")
        pg.page.set_input_files("#file", str(tokens))
        assert pg.js("document.querySelector('input[name=source]:checked').value") == "file"
        last = pg.play()
        assert last["outcome"] == "played" and last["played"] == last["sent"] == DEMO_SAMPLES, last
        assert any("streaming tokens.txt: 245 tokens (orpheus_ids)" in e
                   for e in pg.js("window.codecd.events"))
        assert pg.errors == []
    finally:
        pg.close()


def test_page_reconnects_after_a_server_restart(browser: Any, server: ServerThread,
                                                tmp_path: Path) -> None:
    """The server stops and comes back on the same port: the page says it is reconnecting, then that it reconnected; it streams again, Stop cancels, a starved stream counts underruns."""
    port = server.start(_free_port())
    pg = Page(browser, port)
    try:
        pg.wait("window.codecd.hello !== null")
        server.stop()
        pg.wait("document.getElementById('status').dataset.state === 'closed'")
        assert "reconnecting" in pg.status()[1]
        server.start(port)
        pg.wait("window.codecd.reconnects === 1 && document.getElementById('status')"
                ".dataset.state === 'open'")
        assert "reconnected after" in pg.status()[1]
        assert any("reconnected" in e for e in pg.js("window.codecd.events"))
        pg.shot("page-reconnected.png")
        # the new connection streams; Stop cancels (barge-in) once audio flows (at half the
        # real-time rate the stream lasts ~6 s: a slow click still lands before its end)
        pg.page.select_option("#pace", "0.5")
        pg.page.click("#play")
        pg.wait("window.codecd.stream !== null && window.codecd.stream.received > 0")
        pg.page.click("#stop")
        pg.wait("window.codecd.last !== null")
        last = pg.js("window.codecd.last")
        assert last["outcome"] == "cancelled" and 0 < last["received"] < DEMO_SAMPLES, last
        assert pg.page.is_enabled("#play")
        # tokens at half the real-time rate, no prebuffer: the worklet runs dry and says so,
        # and still plays every sample the server sent
        short = tmp_path / "short.txt"
        short.write_text(" ".join(str(int(t)) for t in demo_ids(12)))
        pg.page.set_input_files("#file", str(short))
        pg.page.fill("#prebuffer", "0")
        pg.page.select_option("#pace", "0.5")
        pg.page.click("#play")
        pg.wait("window.codecd.last !== null && window.codecd.last.outcome === 'played'", 60)
        last = pg.js("window.codecd.last")
        assert last["played"] == last["sent"] == 12 * 2048 and last["underruns"] >= 1, last
        assert pg.page.text_content("#underruns") == str(last["underruns"])
        assert pg.errors == []
    finally:
        pg.close()


def test_page_plays_opus_through_webcodecs(browser: Any, server: ServerThread) -> None:
    """Format Opus (WebCodecs): the page decodes the server's 20 ms packets with the browser's AudioDecoder, drops the pre-skip and plays the rest at 48 kHz: every decoded sample but the pre-skip reaches the worklet, exactly."""
    pg = Page(browser, server.start())
    try:
        pg.wait("window.codecd.hello !== null")
        opus = pg.js("window.codecd.opus")
        if not opus["server"]:
            pytest.skip("the server offers no opus (no PyAV with libopus)")
        if not opus["browser"]:
            pytest.skip(f"chromium here cannot decode Opus with WebCodecs: {opus['why']}")
        assert pg.page.text_content("#format option[value=opus]") == "Opus (WebCodecs)"
        assert "decoded by this browser's AudioDecoder" in (pg.page.text_content("#format-note")
                                                            or "")
        last = pg.play("opus")
        assert last["outcome"] == "played" and last["path"] == "opus-webcodecs", last
        assert pg.js("window.codecd.audio.sampleRate") == 48000
        # the demo's 24 kHz audio is 2n samples at 48 kHz; the server pads the last frame:
        # ceil((2n + pre_skip) / 960) packets, each decoding to 960 samples
        pre = last["preSkip"]
        packets = -(-(2 * DEMO_SAMPLES + pre) // 960)
        assert pre > 0 and last["packets"] == packets and last["sent"] == 960 * packets, last
        assert last["decoded"] == 960 * packets and last["skipped"] == pre, last
        assert last["played"] == last["received"] == 960 * packets - pre, last
        assert pg.page.text_content("#played") == str(960 * packets - pre)
        assert "WebCodecs AudioDecoder" in (pg.page.text_content("#path") or "")
        pg.shot("page-opus.png")
        assert pg.errors == []
    finally:
        pg.close()


def test_page_text_without_an_upstream(browser: Any, server: ServerThread) -> None:
    """Typed text streams as `start.text` (no tokens): on a server without --upstream the page's status shows the no_upstream error, and Play works again."""
    pg = Page(browser, server.start())
    try:
        pg.wait("window.codecd.hello !== null")
        pg.page.fill("#text", "Hello from the page.")
        assert pg.js("document.querySelector('input[name=source]:checked').value") == "text"
        pg.page.fill("#text-voice", "leo")
        pg.page.click("#play")
        pg.wait("document.getElementById('status').dataset.state === 'error'")
        text = pg.status()[1]
        assert "upstream_error [no_upstream]" in text and "--upstream" in text, text
        last = pg.js("window.codecd.last")
        assert last["outcome"] == "failed: upstream_error [no_upstream]" and last["text"], last
        assert last["error"]["upstream_code"] == "no_upstream" and last["received"] == 0, last
        assert any(e.startswith("streaming text (20 characters, speaker leo)")
                   for e in pg.js("window.codecd.events"))
        assert pg.page.is_enabled("#play")
        pg.shot("page-no-upstream.png")
        assert pg.errors == []
    finally:
        pg.close()
