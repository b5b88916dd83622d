// codecd player: an AudioWorkletProcessor with a jitter buffer (a ring of float32 samples).
//
// Messages in (port): {type: "reset", prebuffer}: a new stream, start after `prebuffer`
// samples; Float32Array: samples to append; {type: "end"}: no more samples (play out what
// is buffered, then report "drained").
// Messages out: {type: "stats", buffered, played, received, underruns, started} every
// ~50 ms; {type: "started"} when playback begins (the prebuffer is full, or the stream
// ended shorter than it); {type: "drained", played, received, underruns} once the buffer ran
// dry after "end". An underrun is the buffer running dry before "end"; zeros are played
// and playback waits for the prebuffer again (counted once per episode). `played` counts
// stream samples only, never the zeros: it equals `received` when the stream drains.

const CAPACITY = 1 << 21; // 87 s at 24 kHz: the server paces audio 1 s ahead of real time

class CodecdPlayer extends AudioWorkletProcessor {
  constructor() {
    super();
    this.ring = new Float32Array(CAPACITY);
    this.reset(0);
    this.port.onmessage = (e) => this.onMessage(e.data);
  }

  reset(prebuffer) {
    this.r = 0;
    this.w = 0;
    this.level = 0;
    this.prebuffer = prebuffer;
    this.playing = false;
    this.ended = false;
    this.drained = false;
    this.started = false;
    this.played = 0;
    this.received = 0;
    this.underruns = 0;
    this.dropped = 0;
    this.sinceStats = 0;
  }

  onMessage(m) {
    if (m instanceof Float32Array) {
      this.push(m);
    } else if (m.type === "reset") {
      this.reset(m.prebuffer | 0);
    } else if (m.type === "end") {
      this.ended = true;
    }
  }

  push(x) {
    this.received += x.length;
    let n = x.length;
    if (n > CAPACITY - this.level) {  // never overwrite what is not played yet
      this.dropped += n - (CAPACITY - this.level);
      n = CAPACITY - this.level;
    }
    const first = Math.min(n, CAPACITY - this.w);
    this.ring.set(x.subarray(0, first), this.w);
    if (n > first) this.ring.set(x.subarray(first, n), 0);
    this.w = (this.w + n) % CAPACITY;
    this.level += n;
  }

  process(inputs, outputs) {
    const out = outputs[0][0];
    if (!this.playing && this.level > 0 && (this.level >= this.prebuffer || this.ended)) {
      this.playing = true;
      if (!this.started) {
        this.started = true;
        this.port.postMessage({type: "started", currentTime});
      }
    }
    let n = 0;
    if (this.playing) {
      n = Math.min(out.length, this.level);
      const first = Math.min(n, CAPACITY - this.r);
      out.set(this.ring.subarray(this.r, this.r + first), 0);
      if (n > first) out.set(this.ring.subarray(0, n - first), first);
      this.r = (this.r + n) % CAPACITY;
      this.level -= n;
      this.played += n;
      if (this.level === 0) {
        this.playing = false;
        if (!this.ended) this.underruns += 1;
      }
    }
    out.fill(0, n);
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    if (this.ended && this.level === 0 && !this.drained) {
      this.drained = true;
      this.port.postMessage({type: "drained", played: this.played, received: this.received,
                             underruns: this.underruns, dropped: this.dropped});
    }
    this.sinceStats += out.length;
    if (this.sinceStats >= sampleRate / 20) {
      this.sinceStats = 0;
      this.port.postMessage({type: "stats", buffered: this.level, played: this.played,
                             received: this.received, underruns: this.underruns,
                             started: this.started});
    }
    return true;
  }
}

registerProcessor("codecd-player", CodecdPlayer);
