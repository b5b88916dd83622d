// codecd page: connect (with a ticket when the server wants a token), read the hello, stream
// a token file or the demo sequence, play it through an AudioWorklet jitter buffer, and chart
// /metrics. Plain ES module, no framework, no build step; the protocol is docs/protocol.md.
// Audio is PCM, or Opus packets decoded by WebCodecs' AudioDecoder where the browser has one
// for Opus (docs/protocol.md, "Opus streams"); a stream may also be text, which the server's
// upstream LM turns into tokens (`start.text`).

const $ = (id) => document.getElementById(id);
const ORPHEUS_BASE = 128266;           // raw id of <custom_token_10>
const CUSTOM_TO_ID = ORPHEUS_BASE - 10; // <custom_token_N> -> id N + 128256
const HISTORY = 120;                   // chart points (seconds)
const MAX_BACKOFF_MS = 4000;
const OPUS_RATE = 48000;                // opus streams: 48 kHz mono, 20 ms packets
const OPUS_CONFIG = {codec: "opus", sampleRate: OPUS_RATE, numberOfChannels: 1};
const FORMAT_LABELS = {pcm_f32le: "PCM float32", pcm_s16le: "PCM 16-bit", mulaw: "μ-law 8-bit",
                       opus: "Opus (WebCodecs)"};

// Everything the page knows, on window for tests and for the curious (devtools).
const state = {
  ws: null, hello: null, everOpen: false, reconnects: 0, backoff: 250, retryTimer: null,
  lostAt: 0, seq: 0, stream: null, last: null, audio: null, node: null, analyser: null,
  opus: {server: false, browser: null, why: ""},  // the Opus path: offered, and decodable here
  events: [], metrics: {streams: [], tick: [], batch: [], fetched: 0, errors: 0},
};
window.codecd = state;

function log(msg) {
  const line = `${new Date().toISOString().slice(11, 23)} ${msg}`;
  state.events.push(msg);
  const el = $("log");
  el.textContent += line + "\n";
  el.scrollTop = el.scrollHeight;
}

function setStatus(s, text) {
  const el = $("status");
  el.dataset.state = s;
  el.textContent = text;
}

// ------------------------------------------------------------------ connection

async function credentials() {
  // GET /auth/ticket: {"auth": false}, or a single-use ticket for the token; 401 without it
  const token = $("token").value.trim();
  const r = await fetch("/auth/ticket", {cache: "no-store",
    headers: token ? {Authorization: `Bearer ${token}`} : {}});
  if (r.status === 401 || r.status === 403) return {error: r.status};
  if (!r.ok) throw new Error(`ticket: HTTP ${r.status}`);
  const j = await r.json();
  return {protocols: j.auth ? j.subprotocols : ["codecd.v1"]};
}

async function connect() {
  clearTimeout(state.retryTimer);
  const old = state.ws;
  state.ws = null;  // its close event is not a lost connection: onClose ignores it
  if (state.stream) finishStream("stopped: reconnecting");
  if (old && old.readyState <= WebSocket.OPEN) old.close(1000);
  let cred;
  try {
    cred = await credentials();
  } catch (e) {
    scheduleReconnect(`server unreachable (${e.message})`);
    return;
  }
  if (cred.error) {
    setStatus("unauthorized", cred.error === 401 ? "unauthorized: enter the server's token"
                                                 : "this page's origin is not allowed");
    log(`not connected: HTTP ${cred.error} from /auth/ticket`);
    return;
  }
  const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/`;
  const ws = new WebSocket(url, cred.protocols);
  ws.binaryType = "arraybuffer";
  state.ws = ws;
  ws.onmessage = (e) => onMessage(ws, e);
  ws.onclose = (e) => onClose(ws, e);
}

function scheduleReconnect(why) {
  const wait = state.backoff;
  state.backoff = Math.min(MAX_BACKOFF_MS, state.backoff * 2);
  setStatus("closed", `disconnected: ${why}; reconnecting in ${(wait / 1000).toFixed(1)} s`);
  state.retryTimer = setTimeout(connect, wait);
}

function onClose(ws, e) {
  if (ws !== state.ws) return;
  if (ws.everOpen) state.lostAt = performance.now();
  $("play").disabled = true;
  if (state.stream) finishStream(`connection lost mid-stream (close ${e.code})`);
  log(`connection closed (code ${e.code}${e.reason ? `, ${e.reason}` : ""})`);
  scheduleReconnect(`connection closed (${e.code})`);
}

// Whether this browser decodes Opus: WebCodecs' AudioDecoder (secure contexts only; http on
// localhost counts) and a config check. Asked once; {ok, why}.
const opusProbe = (async () => {
  if (typeof AudioDecoder === "undefined") {
    return {ok: false, why: "this browser has no WebCodecs AudioDecoder" +
                            (window.isSecureContext ? "" : " (the page is not a secure context)")};
  }
  try {
    const r = await AudioDecoder.isConfigSupported(OPUS_CONFIG);
    return r.supported ? {ok: true, why: ""} : {ok: false, why: "WebCodecs here cannot decode Opus"};
  } catch (e) {
    return {ok: false, why: `WebCodecs' Opus check failed (${e.message})`};
  }
})();

async function onHello(msg) {
  const again = state.everOpen;
  const probe = await opusProbe;
  state.opus = {server: msg.formats.includes("opus"), browser: probe.ok, why: probe.why};
  state.hello = msg;
  state.everOpen = true;
  state.backoff = 250;
  if (again) state.reconnects += 1;
  const names = msg.models.map((m) => `${m.name} (${m.arch}, ${m.sample_rate} Hz)`).join(", ");
  $("server-info").textContent = `${msg.server}, protocol v${msg.version}: ${names || "no models"}`;
  fillSelect($("model"), msg.models.map((m) => m.name), $("model").value);
  const formats = msg.formats.filter((f) => f.startsWith("pcm_") || f === "mulaw" ||
                                          (f === "opus" && probe.ok));
  fillSelect($("format"), formats, $("format").value || "pcm_f32le", FORMAT_LABELS);
  $("format-note").textContent = !state.opus.server
    ? "Audio arrives as PCM (this server offers no Opus: it has no PyAV) and plays through an AudioWorklet."
    : probe.ok
      ? "Opus (WebCodecs): 20 ms packets decoded by this browser's AudioDecoder at 48 kHz; " +
        "PCM formats as they come. Both play through an AudioWorklet."
      : `The server offers Opus but ${probe.why}: PCM only. Audio plays through an AudioWorklet.`;
  onModelChange();
  $("play").disabled = false;
  const away = again ? ((performance.now() - state.lostAt) / 1000).toFixed(1) : "";
  setStatus("open", again ? `connected to ${msg.server} (reconnected after ${away} s away)`
                          : `connected to ${msg.server}`);
  log(again ? `reconnected: the server is back (${msg.server})` : `hello from ${msg.server}`);
}

function fillSelect(sel, values, keep, labels = {}) {
  sel.replaceChildren(...values.map((v) => new Option(labels[v] ?? v, v)));
  if (values.includes(keep)) sel.value = keep;
}

function currentModel() {
  return state.hello?.models.find((m) => m.name === $("model").value);
}

function onModelChange() {
  const m = currentModel();
  const voices = m?.voices ?? [];
  fillSelect($("voice"), voices.length ? voices : [""], $("voice").value);
  $("voice").disabled = !voices.length;
  // the demo sequence and text both need a model that takes Orpheus LM ids
  const orpheus = !!m?.layouts.includes("orpheus_ids");
  for (const v of ["demo", "text"]) {
    const r = document.querySelector(`input[name=source][value=${v}]`);
    r.disabled = !orpheus;
    if (r.disabled && r.checked) document.querySelector('input[name=source][value=file]').checked = true;
  }
  $("text").disabled = $("text-voice").disabled = !orpheus;
}

// ------------------------------------------------------------------ messages

function onMessage(ws, e) {
  if (typeof e.data !== "string") return onAudio(new Uint8Array(e.data));
  const msg = JSON.parse(e.data);
  const s = state.stream;
  switch (msg.type) {
    case "hello": ws.everOpen = true; return onHello(msg);
    case "started":
      if (s && msg.stream_id === s.id) {
        s.rate = msg.sample_rate;
        if (msg.codec) {
          s.codec = msg.codec;
          s.skipLeft = msg.codec.pre_skip;
          $("path").textContent = `Opus ${msg.codec.bitrate / 1000} kb/s, ${msg.codec.frame_ms} ms packets → ` +
            `WebCodecs AudioDecoder → AudioWorklet at ${state.audio.sampleRate} Hz ` +
            `(pre-skip ${msg.codec.pre_skip} samples dropped)`;
        }
        log(`started ${s.id}: ${msg.format} at ${msg.sample_rate} Hz, look-ahead ${msg.latency_samples} samples` +
            (msg.codec ? `, pre-skip ${msg.codec.pre_skip}` : ""));
      }
      return;
    case "done":
      if (s && msg.stream_id === s.id) onDone(s, msg);
      return;
    case "cancelled":
      if (s && msg.stream_id === s.id) finishStream("cancelled");
      return;
    case "error": {
      const sub = msg.upstream_code ? ` [${msg.upstream_code}]` : "";
      log(`error ${msg.code}${sub}${msg.stream_id ? ` (${msg.stream_id})` : ""}: ${msg.message}`);
      if (s && (!msg.stream_id || msg.stream_id === s.id)) {
        setStatus("error", msg.upstream_code === "no_upstream"
          ? `cannot speak text: this server has no upstream LM (start it with --upstream URL); ` +
            `stream tokens instead (${msg.code}${sub})`
          : `stream failed: ${msg.code}${sub}: ${msg.message}`);
        finishStream(`failed: ${msg.code}${sub}`, {error: {code: msg.code,
          upstream_code: msg.upstream_code ?? null, message: msg.message}});
      }
      return;
    }
  }
}

async function onDone(s, msg) {
  s.sent = msg.samples;
  $("sent").textContent = `${msg.samples} samples`;
  log(`done ${s.id}: the server sent ${msg.samples} samples (${msg.duration_s.toFixed(3)} s)` +
      (s.decoder ? ` in ${s.packets} Opus packets` : ""));
  if (s.decoder) {
    try {
      await s.decoder.flush();  // every packet's samples are out (and in the worklet)
    } catch (e) {
      if (state.stream === s) finishStream(`failed: opus decoder (${e.message})`);
      return;
    }
  }
  if (state.stream === s) state.node.port.postMessage({type: "end"});
}

const MULAW = new Float32Array(256).map((_, i) => {
  const u = ~i & 0xff, t = (((u & 0x0f) << 3) + 0x84) << ((u >> 4) & 7);
  return ((u & 0x80) ? 0x84 - t : t - 0x84) / 32768;
});

function onAudio(b) {
  const s = state.stream;
  if (b[0] !== 0x02 || !s) return;
  const idLen = b[1];
  const id = new TextDecoder().decode(b.subarray(2, 2 + idLen));
  if (id !== s.id) return;
  if (s.firstAudio === null) {
    s.firstAudio = performance.now();
    $("ttfa").textContent = `${(s.firstAudio - s.t0).toFixed(0)} ms`;
  }
  if (s.decoder) {
    // one raw Opus packet; its first sample's offset in the decoder's output -> timestamp
    const offset = Number(new DataView(b.buffer, b.byteOffset + 6 + idLen, 8).getBigUint64(0, true));
    s.packets += 1;
    if (s.decoder.state === "configured") {
      s.decoder.decode(new EncodedAudioChunk({type: "key", data: b.subarray(14 + idLen),
        timestamp: Math.round(offset * 1e6 / OPUS_RATE)}));
    }
    return;
  }
  const pcm = b.slice(14 + idLen);  // a copy: aligned, transferable
  let x;
  if (s.format === "pcm_f32le") {
    x = new Float32Array(pcm.buffer);
  } else if (s.format === "pcm_s16le") {
    const i16 = new Int16Array(pcm.buffer);
    x = new Float32Array(i16.length);
    for (let i = 0; i < i16.length; i++) x[i] = i16[i] / 32768;
  } else {
    x = new Float32Array(pcm.length);
    for (let i = 0; i < pcm.length; i++) x[i] = MULAW[pcm[i]];
  }
  toPlayer(s, x);
}

function toPlayer(s, x) {
  s.received += x.length;
  $("received").textContent = s.received;
  state.node.port.postMessage(x, [x.buffer]);
}

// An AudioDecoder for one opus stream: its output (f32) minus the first pre_skip samples
// goes to the worklet, like PCM.
function opusDecoder(s) {
  const dec = new AudioDecoder({
    output: (ad) => {
      const n = ad.numberOfFrames;
      if (state.stream !== s) { ad.close(); return; }
      const x = new Float32Array(n);
      ad.copyTo(x, {planeIndex: 0, format: "f32-planar"});
      ad.close();
      s.decoded += n;
      const skip = Math.min(s.skipLeft, n);
      s.skipLeft -= skip;
      s.skipped += skip;
      if (n > skip) toPlayer(s, skip ? x.slice(skip) : x);
    },
    error: (e) => {
      log(`opus decoder error: ${e.message}`);
      if (state.stream === s) finishStream(`failed: opus decoder (${e.message})`);
    },
  });
  dec.configure(OPUS_CONFIG);
  return dec;
}

// ------------------------------------------------------------------ audio

async function ensureAudio(rate) {
  if (state.audio && (state.audio.sampleRate === rate || state.audioAsked === rate)) {
    await state.audio.resume();
    return;
  }
  if (state.audio) await state.audio.close();
  let ctx;
  try {
    ctx = new AudioContext({sampleRate: rate, latencyHint: "interactive"});
  } catch (e) {  // a browser without this rate: its own rate, and the server resamples
    ctx = new AudioContext({latencyHint: "interactive"});
    log(`audio: ${rate} Hz not available (${e.message}); asking the server for ${ctx.sampleRate} Hz`);
  }
  await ctx.audioWorklet.addModule("/static/player-worklet.js");
  const node = new AudioWorkletNode(ctx, "codecd-player", {outputChannelCount: [1]});
  const analyser = ctx.createAnalyser();
  analyser.fftSize = 2048;
  node.connect(analyser);
  analyser.connect(ctx.destination);
  node.port.onmessage = (e) => onPlayer(e.data);
  Object.assign(state, {audio: ctx, audioAsked: rate, node, analyser});
  await ctx.resume();
  log(`audio: ${ctx.sampleRate} Hz, base latency ${(ctx.baseLatency * 1000).toFixed(1)} ms`);
}

function onPlayer(m) {
  const s = state.stream;
  if (m.type === "stats") {
    $("depth").textContent = `${(1000 * m.buffered / state.audio.sampleRate).toFixed(0)} ms`;
    $("underruns").textContent = m.underruns;
    $("played").textContent = m.played;
  } else if (m.type === "started" && s) {
    s.firstSound = performance.now();
    $("ttfs").textContent = `${(s.firstSound - s.t0).toFixed(0)} ms`;
  } else if (m.type === "drained" && s) {
    $("played").textContent = m.played;
    $("underruns").textContent = m.underruns;
    if (s.decoder) {
      const ok = s.decoded === s.sent && m.played === s.decoded - s.codec.pre_skip;
      log(`played ${m.played} samples: ${s.packets} Opus packets decoded to ${s.decoded} samples ` +
          `(the server sent ${s.sent}), less ${s.skipped} of pre-skip; ${m.underruns} underrun(s)` +
          (ok ? "" : " (MISMATCH)"));
    } else {
      const ok = s.sent === m.played;
      log(`played ${m.played} of ${s.sent} samples the server sent; ${m.underruns} underrun(s)` +
          (ok ? "" : " (MISMATCH)"));
    }
    finishStream("played", {played: m.played, received: m.received, underruns: m.underruns});
  }
}

function drawWave() {
  const c = $("wave"), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  if (state.analyser) {
    const d = new Float32Array(state.analyser.fftSize);
    state.analyser.getFloatTimeDomainData(d);
    g.strokeStyle = "#2d6cdf";
    g.beginPath();
    for (let i = 0; i < d.length; i++) {
      const x = i * c.width / d.length, y = (0.5 - 0.5 * Math.max(-1, Math.min(1, d[i]))) * c.height;
      i ? g.lineTo(x, y) : g.moveTo(x, y);
    }
    g.stroke();
  }
  requestAnimationFrame(drawWave);
}

// ------------------------------------------------------------------ streaming

function parseTokens(text, model) {
  const words = text.match(/<custom_token_\d+>|[^\s,<>]+|<[^>]*>?/g) ?? [];
  let custom = false;
  const vals = words.map((w) => {
    const m = w.match(/^<custom_token_(\d+)>$/);
    if (m) { custom = true; return Number(m[1]) + CUSTOM_TO_ID; }
    if (!/^\d+$/.test(w)) throw new Error(`not a token: ${w.slice(0, 40)}`);
    return Number(w);
  });
  if (!vals.length) throw new Error("the file holds no tokens");
  if (model.layouts.includes("chatterbox_ids") && !model.layouts.includes("orpheus_ids")) {
    return {layout: "chatterbox_ids", tokens: vals, perSecond: 25};
  }
  const layout = custom || vals.some((v) => v >= ORPHEUS_BASE) ? "orpheus_ids" : "orpheus";
  return {layout, tokens: vals, perSecond: 7 * model.sample_rate / 2048};
}

async function tokenSource(model) {
  const src = document.querySelector("input[name=source]:checked").value;
  if (src === "text") {
    const text = $("text").value.trim();
    if (!text) throw new Error("type some text first");
    return {text, voice: $("text-voice").value.trim(), name: "text"};
  }
  if (src === "demo") {
    const j = await (await fetch("/demo/tokens.json", {cache: "no-store"})).json();
    return {layout: j.layout, tokens: j.tokens, perSecond: 7 * model.sample_rate / 2048,
            name: "the demo sequence"};
  }
  const f = state.file ?? $("file").files[0];
  if (!f) throw new Error("pick or drop a token file first");
  return {...parseTokens(await f.text(), model), name: f.name};
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function play() {
  const model = currentModel();
  if (!model || state.stream) return;
  let src;
  try {
    src = await tokenSource(model);
  } catch (e) {
    log(`cannot stream: ${e.message}`);
    return;
  }
  const format = $("format").value;
  const opus = format === "opus";
  // the AudioContext runs at the stream's output rate: 48 kHz for Opus, else the model's
  await ensureAudio(opus ? OPUS_RATE : model.sample_rate);
  if (opus && state.audio.sampleRate !== OPUS_RATE) {
    log(`cannot stream Opus: this browser's audio runs at ${state.audio.sampleRate} Hz, not 48 kHz; pick a PCM format`);
    return;
  }
  const ws = state.ws;
  if (!ws || ws.readyState !== WebSocket.OPEN || state.stream) {
    log("cannot stream: not connected");
    return;
  }
  const s = {id: `page-${Date.now().toString(36)}-${++state.seq}`, format,
             path: opus ? "opus-webcodecs" : "pcm", t0: performance.now(), firstAudio: null,
             firstSound: null, received: 0, sent: null, rate: model.sample_rate, cancelled: false,
             decoder: null, codec: null, packets: 0, decoded: 0, skipped: 0, skipLeft: 0,
             text: src.text !== undefined};
  if (opus) {
    try {
      s.decoder = opusDecoder(s);
    } catch (e) {
      log(`cannot stream Opus: ${e.message}`);
      return;
    }
  }
  state.stream = s;
  for (const id of ["ttfa", "ttfs", "sent"]) $(id).textContent = "–";
  $("path").textContent = opus
    ? "Opus → WebCodecs AudioDecoder → AudioWorklet at 48000 Hz"
    : `PCM (${FORMAT_LABELS[format] ?? format}) → AudioWorklet at ${state.audio.sampleRate} Hz`;
  if ($("status").dataset.state === "error") setStatus("open", `connected to ${state.hello.server}`);
  const prebuffer = Math.round(Number($("prebuffer").value) * state.audio.sampleRate / 1000);
  state.node.port.postMessage({type: "reset", prebuffer});
  $("play").disabled = true;
  $("stop").disabled = false;
  const start = {type: "start", stream_id: s.id, model: model.name, format};
  if (!opus) start.sample_rate = state.audio.sampleRate;  // opus is 48 kHz, and only that
  if (s.text) {
    // the server's upstream LM makes the tokens and ends the stream: no tokens, no end
    start.text = src.text;
    if (src.voice) start.voice = src.voice;
    ws.send(JSON.stringify(start));
    log(`streaming text (${src.text.length} characters${src.voice ? `, speaker ${src.voice}` : ""}) ` +
        `to ${model.name} through the server's upstream LM`);
    return;
  }
  start.layout = src.layout;
  if ($("voice").value) start.voice = $("voice").value;
  ws.send(JSON.stringify(start));
  log(`streaming ${src.name}: ${src.tokens.length} tokens (${src.layout}) to ${model.name}`);
  const pace = Number($("pace").value);
  const chunk = src.layout === "chatterbox_ids" ? 25 : 7;
  for (let i = 0; i < src.tokens.length && !s.cancelled && ws.readyState === WebSocket.OPEN;
       i += chunk) {
    if (pace > 0) {
      const due = s.t0 + 1000 * i / (src.perSecond * pace);
      const wait = due - performance.now();
      if (wait > 0) await sleep(wait);
    }
    if (s.cancelled || ws.readyState !== WebSocket.OPEN) break;
    ws.send(JSON.stringify({type: "tokens", stream_id: s.id, tokens: src.tokens.slice(i, i + chunk)}));
  }
  if (!s.cancelled && ws.readyState === WebSocket.OPEN) {
    ws.send(JSON.stringify({type: "end", stream_id: s.id}));
  }
}

function stop() {
  const s = state.stream;
  if (!s) return;
  s.cancelled = true;
  if (state.ws?.readyState === WebSocket.OPEN) {
    state.ws.send(JSON.stringify({type: "cancel", stream_id: s.id}));
  }
}

function finishStream(outcome, result = {}) {
  const s = state.stream;
  if (!s) return;
  state.stream = null;
  state.node?.port.postMessage({type: "end"});
  if (s.decoder && s.decoder.state !== "closed") s.decoder.close();
  state.last = {id: s.id, outcome, sent: s.sent, received: s.received, format: s.format,
                path: s.path, text: s.text,
                ttfaMs: s.firstAudio === null ? null : s.firstAudio - s.t0, ...result};
  if (s.decoder) {
    Object.assign(state.last, {packets: s.packets, decoded: s.decoded, skipped: s.skipped,
                               preSkip: s.codec?.pre_skip ?? null});
  }
  $("stop").disabled = true;
  $("play").disabled = !(state.ws && state.ws.readyState === WebSocket.OPEN && state.hello);
  if (outcome !== "played") log(`stream ${s.id} ${outcome}`);
}

// ------------------------------------------------------------------ metrics view

function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    const m = line.match(/^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/);
    if (m) (out[m[1]] ??= []).push(Number(m[3]));
  }
  return out;
}

const sum = (a) => (a ?? []).reduce((x, y) => x + y, 0);
const max = (a) => (a?.length ? Math.max(...a) : 0);

async function pollMetrics() {
  const M = state.metrics;
  try {
    const r = await fetch("/metrics", {cache: "no-store"});
    const m = parseMetrics(await r.text());
    const point = {streams: sum(m.codecd_streams_active), tick: 1000 * max(m.codecd_tick_seconds_mean),
                   batch: max(m.codecd_batch_size_recent)};
    for (const k of ["streams", "tick", "batch"]) {
      M[k].push(point[k]);
      if (M[k].length > HISTORY) M[k].shift();
    }
    M.fetched += 1;
    $("v-streams").textContent = point.streams;
    $("v-tick").textContent = point.tick.toFixed(2);
    $("v-batch").textContent = point.batch.toFixed(1);
    $("metrics-age").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    M.errors += 1;
    $("metrics-age").textContent = `(unreachable: ${e.message})`;
  }
  {
    chart($("chart-streams"), M.streams, "#2d6cdf");
    chart($("chart-tick"), M.tick, "#c0392b");
    chart($("chart-batch"), M.batch, "#1e8449");
  }
}

// the smallest 1, 2 or 5 times a power of ten at or above v: the chart's top
function niceCeil(v) {
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 5, 10].map((m) => m * p).find((t) => t >= v * (1 - 1e-9));
}

function chart(c, data, color) {
  const g = c.getContext("2d"), w = c.width, h = c.height;
  g.clearRect(0, 0, w, h);
  const top = niceCeil(Math.max(1e-9, ...data));
  g.strokeStyle = "#e4e6ee";
  g.strokeRect(0.5, 0.5, w - 1, h - 1);
  g.fillStyle = "#889";
  g.font = "10px system-ui";
  g.fillText(String(+top.toPrecision(3)), 4, 11);
  g.strokeStyle = color;
  g.lineWidth = 1.5;
  g.beginPath();
  data.forEach((v, i) => {
    const x = w - (data.length - 1 - i) * (w / (HISTORY - 1)), y = h - 2 - (h - 14) * v / top;
    i ? g.lineTo(x, y) : g.moveTo(x, y);
  });
  g.stroke();
}

// ------------------------------------------------------------------ wiring

function showView(name) {
  for (const v of ["listen", "server"]) {
    $(`view-${v}`).hidden = v !== name;
    $(`tab-${v}`).classList.toggle("active", v === name);
  }
  if (name === "server") pollMetrics();
}

function init() {
  for (const b of document.querySelectorAll(".tab")) b.onclick = () => showView(b.dataset.view);
  $("connect").onclick = () => { state.backoff = 250; connect(); };
  $("model").onchange = onModelChange;
  $("play").onclick = play;
  $("stop").onclick = stop;
  $("text").oninput = () => {
    if ($("text").value.trim()) document.querySelector("input[name=source][value=text]").checked = true;
  };
  $("file").onchange = () => {
    state.file = null;
    document.querySelector("input[name=source][value=file]").checked = true;
  };
  const drop = $("drop");
  drop.ondragover = (e) => { e.preventDefault(); drop.classList.add("over"); };
  drop.ondragleave = () => drop.classList.remove("over");
  drop.ondrop = (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    state.file = e.dataTransfer.files[0] ?? null;
    if (state.file) {
      drop.textContent = `token file: ${state.file.name}`;
      document.querySelector("input[name=source][value=file]").checked = true;
    }
  };
  if (location.hash === "#server") showView("server");
  // /metrics asks every worker for fresh stats: poll only while the view is on screen
  setInterval(() => { if (!$("view-server").hidden && !document.hidden) pollMetrics(); }, 1000);
  requestAnimationFrame(drawWave);
  connect();
}

init();
