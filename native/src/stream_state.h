/*
 * stream_state.h: the per-slot state buffers of a streaming tick graph
 * (stream_state.c), for any codec whose layers mix time.
 *
 * A tick advances B streams (one per batch entry, each in its slot of the
 * context's pool) by n frames. Every time-mixing layer reads concat(state,
 * new input) and leaves the last S frames of that buffer as the next state,
 * so each output is computed once: a conv of K taps and dilation d keeps
 * S = d (K-1) frames of its input (a "valid" conv over the buffer), a
 * transposed conv the input frames its overlap needs, an attention layer its
 * window of keys and values (or, causal, a KV window per layer). The
 * architecture lists its states (cr_arch.stream_states: channels x frames
 * each) in the order its builder takes them; the context allocates one pool
 * tensor per state, [channels * frames, slots + 1] (the extra row is a dummy
 * that padded batch entries read and write).
 *
 * Per tick the context fills (stream.c):
 *   slot_read, slot_write  I32 [B]: each entry's slot (padding: the dummy row)
 *   keep                   F32 [1, 1, B], edge ticks only: 0 on a stream's
 *                          first tick, so its states start as zeros (an
 *                          offline decode's left zero padding), else 1
 *   times                  per registered time input (cr_states_time): noise
 *                          or positions for the segment the tensor holds,
 *                          starting at tick * chunk * rate - delay
 *   bounds                 F32 [B, 2 * masks]: per mask, each stream's valid
 *                          points [lo, hi) of that segment; the graph builds
 *                          the 0/1 mask from them and a ramp of point indices
 *                          (clamp(i - lo + 1, 0, 1) * clamp(hi - i, 0, 1),
 *                          exact in F32), so a tick copies 8 bytes per stream
 *                          and mask instead of the masks (at 1,000 SNAC
 *                          streams they were tens of MB per tick, filled on
 *                          the host and, past the 30 inputs of one of ggml's
 *                          scheduler splits, a second split whose input copy
 *                          waited for the device in the middle of a launch)
 * A steady tick (masked = false: every point of every stream inside its
 * utterance) needs neither keep nor masks; an edge tick (a stream at its
 * first ticks or past its end) multiplies every tensor by a 0/1 mask over
 * [0, end) before a time-mixing layer reads it, as an offline decode's zero
 * padding would.
 *
 * Two layouts, one per context (a context uses only one of them):
 *   channels fastest  x [C, n, B]; a state row is [C, S] (C*S floats)
 *   time fastest      x [n, B, C] (GPU graphs that keep Snakes fusable); a
 *                     state row is [S, C], read by get_rows and reordered to
 *                     [S, B, C] by one small copy, written back by set_rows
 *                     into the pool viewed [S, slots+1, C] with no copy
 * (a per-channel gather of short rows, tried first, cost 2.3 ms of a
 * 256-stream tick on CUDA).
 *
 * KV windows (cr_states_window: an attention layer's keys or values over its
 * last S steps) are rings instead, so that a tick writes its n new steps and
 * nothing else: a tail state would read, extend and rewrite all S steps per
 * tick (Mimi at 1,000 streams: 8 MiB a stream, 40 % of the H200's tick). The
 * ring holds Q = ceil(S / n) + 1 blocks of n steps [C, n] (channels fastest);
 * a stream's tick k writes its new block into block k mod Q, then gathers its
 * Q blocks oldest first (blocks k+1 .. k+Q mod Q, one get_rows): the window
 * [C, Q n, B] of steps t - (Q-1) n .. t + n - 1, the S kept ones preceded by
 * Q n - n - S older ones that the attention mask excludes. A ring is never
 * cleared: steps before a stream's start hold whatever the slot held (finite
 * keys and values of an earlier stream, or zeros), which the mask's validity
 * gives weight exactly 0, so a window reads as a zero-padded one would.
 */
#ifndef CODECRT_STREAM_STATE_H
#define CODECRT_STREAM_STATE_H

#include "internal.h"

/* A tick graph under construction: where its states and inputs go. */
typedef struct cr_states {
    struct ggml_context *ctx;
    struct ggml_cgraph *gf;           /* the state write-backs are expanded into it */
    struct ggml_tensor *const *pool;  /* pool[i]: state i, [C*S, slots+1] */
    int n_pool;
    int next;                         /* the state the next append takes */
    cr_graph_io *io;
    int64_t B;
    bool masked;
    bool cpu; /* the graph runs on the CPU backend (cr_states_append copies instead of concat) */
    /* masks built so far, reused by every layer that asks for the same one, and the
       point-index ramps [n, B] they are made from, one per length */
    struct cr_states_mask {
        int32_t rate, delay;
        int64_t n;
        struct ggml_tensor *t;
    } masks[CR_MAX_TIMES];
    int n_masks;
    struct cr_states_ramp {
        int64_t n;
        struct ggml_tensor *t;
    } ramps[CR_MAX_TIMES];
    int n_ramps;
    /* io->bounds copied once inside the graph: the masks read views of this copy, so the
       bounds are one input of the graph's first scheduler split, not two per mask */
    struct ggml_tensor *bounds;
} cr_states;

/*
 * Start a tick graph of B streams in gf: creates io->slot_read and
 * io->slot_write (I32 [B]) and, when masked (an edge tick), io->keep (F32
 * [1, 1, B]), all graph inputs. cpu: the graph runs on the CPU backend.
 */
void cr_states_init(cr_states *s, struct ggml_context *ctx, struct ggml_cgraph *gf, struct ggml_tensor *const *pool,
                    int n_pool, cr_graph_io *io, int64_t B, bool masked, bool cpu);

/*
 * x [C, n, B] -> concat(state, x) [C, S+n, B] with the next state (S frames;
 * zeros on a stream's first tick when masked); its last S frames are written
 * back as the state. A state list that does not match the builder (a state
 * of another size, or more states taken than listed) marks the graph failed
 * (io->overflow: the context refuses it as "cannot build the graph") instead
 * of reaching ggml; io->n_states counts the states taken.
 */
struct ggml_tensor *cr_states_append(cr_states *s, struct ggml_tensor *x, int64_t S);

/* The same for a time-fastest x [n, B, C] -> [S+n, B, C] (state row [S, C]). */
struct ggml_tensor *cr_states_append_tf(cr_states *s, struct ggml_tensor *x, int64_t S);

/*
 * cr_states_append_tf in two halves, for an op that writes its output after the state
 * itself (cr_unit_tail's prefix: no concat pass over the residual stream). take: the next
 * state of the list as [S, B, C] (a strided view of the gathered rows, or zeros on a
 * stream's first tick when masked), in the list's order like append; put: buf [S+n, B, C]
 * (the state, then n new frames) -> its last S frames written back as the state; returns
 * buf.
 */
typedef struct cr_state_tf {
    struct ggml_tensor *pool; /* [S*C, slots+1] */
    struct ggml_tensor *st;   /* [S, B, C], any strides (nb0 a float) */
    int64_t S;
} cr_state_tf;
cr_state_tf cr_states_take_tf(cr_states *s, int64_t S, int64_t C);
struct ggml_tensor *cr_states_put_tf(cr_states *s, const cr_state_tf *t, struct ggml_tensor *buf);
/* put after the concat pass, for where no op writes the prefix (the op did not apply):
   x [n, B, C] -> concat(t's state, x) [S+n, B, C], its last S frames the state */
struct ggml_tensor *cr_states_join_tf(cr_states *s, const cr_state_tf *t, struct ggml_tensor *x);

/*
 * x [C, n, B] (rows may be strided; n new steps a tick) -> the window [C, W, B]
 * of the steps t - W + n .. t + n - 1 (W = cr_window_steps(S, n)): the layer's
 * ring state takes the n steps and gives back its Q blocks in time order.
 * The ring's index inputs (io->windows) are shared by every window of the
 * same shape; the state list gives it as cr_state_spec_add_window(C, S, rate).
 */
struct ggml_tensor *cr_states_window(cr_states *s, struct ggml_tensor *x, int64_t S);

/* A window ring's steps: S kept steps rounded up to whole blocks of n, plus the tick's block. */
static inline int64_t cr_window_steps(int64_t S, int64_t n) {
    return (S + n - 1) / n * n + n;
}

/*
 * A time input of n points per stream at a point of the decoder with rate
 * samples per frame, lagging the input frontier by delay samples (of that
 * rate): F32 [1, n, B] (CR_TIME_MASK, CR_TIME_NOISE with its noise site), or
 * I32 [n*B] (CR_TIME_POS: t mod site, positions inside windows of site).
 */
struct ggml_tensor *cr_states_time(cr_states *s, int32_t kind, int64_t n, int32_t rate, int32_t delay,
                                   int32_t site);

/* x [C, n, B] times its 0/1 mask over [0, end) on edge ticks; x itself on steady ones. */
struct ggml_tensor *cr_states_mask(cr_states *s, struct ggml_tensor *x, int32_t rate, int32_t delay);

/* The 0/1 mask [n, B] itself on edge ticks, for the time-fastest layout, whose ops apply it
   in their own pass (cr_unit_tail, cr_upconv_tail: one pass over x fewer than a product
   after them); NULL on steady ones. */
struct ggml_tensor *cr_states_mask_of(cr_states *s, int64_t n, int32_t rate, int32_t delay);

/*
 * An architecture's stream_states list: state *n (channels x frames) written into
 * s when *n < max, *n counted either way (the caller returns it: the list's length,
 * which the context compares with max).
 */
static inline void cr_state_spec_add(cr_state_spec *s, int max, int *n, int64_t channels, int64_t frames) {
    if (*n < max) {
        s[*n] = (cr_state_spec){.channels = channels, .frames = frames};
    }
    (*n)++;
}

/* A KV window's ring (cr_states_window) of channels x S kept steps, `rate` steps per
   code frame: the context sizes it for its chunk. */
static inline void cr_state_spec_add_window(cr_state_spec *s, int max, int *n, int64_t channels, int64_t S,
                                            int32_t rate) {
    if (*n < max) {
        s[*n] = (cr_state_spec){.channels = channels, .frames = S, .window = rate};
    }
    (*n)++;
}

#endif /* CODECRT_STREAM_STATE_H */
