//! The compute layer: one small op set that every model is written against, implemented per backend.
//!
//! A model never touches device memory directly: it asks its [`Backend`] for activation buffers,
//! weights and a KV cache and calls the ops below. The CPU backend ([`cpu::CpuBackend`]) is the
//! default and runs anywhere; a CUDA backend implements the same trait.

pub mod cpu;

use anyhow::Result;

mod host_weight;
pub use host_weight::HostWeight;
pub mod kv_export;
mod select;
pub use kv_export::{KvBytes, KvExport, KvLayerExport};
pub use select::{argmax, top_k_row, TopK};
mod params;
pub use params::*;

pub use cpu::recurrent::DeltaDims;

/// A device's side channel for measurement, usable from another thread while the engine runs.
pub trait DeviceProbe: Send {
    /// Enqueue a tiny operation (a 4 KiB copy) on a stream of its own and wait for it: how long
    /// the device took to get to it, which grows when the engine's work starves other streams.
    fn canary(&mut self) -> Result<std::time::Duration>;
    /// Device memory in use (all processes), bytes.
    fn memory_used(&self) -> Result<u64>;
}

/// The op set. Buffers hold f32 activations laid out row-major `[n_tokens, width]`.
pub trait Backend: Send + Sync {
    type Buf: Send;
    type Weight: Send + Sync;
    type Vector: Send + Sync;
    type Kv: Send;
    /// Saved state of the sliding-window layers of a KV cache at a given length.
    type KvSnapshot: Send + Sync;
    /// A buffer of u32 (token ids, expert ids, row indices) where the ops read them: on the
    /// device for a GPU, so routing and expert products need no host round trip.
    type Ids: Send;

    fn name(&self) -> String;

    /// Free memory of the device the backend allocates on (a GPU's free memory; the CPU
    /// backend's host `MemAvailable`): sessions check their cache size against it before
    /// allocating. None when unknown (no check).
    fn memory_free(&self) -> Option<u64> {
        None
    }

    /// A responsiveness probe of the device (`vela eval`'s stall probe): None for the CPU,
    /// whose stalls a host timer measures.
    fn device_probe(&self) -> Option<Box<dyn DeviceProbe>> {
        None
    }

    // --- memory ---
    fn alloc(&self, len: usize) -> Self::Buf;
    fn write(&self, buf: &mut Self::Buf, data: &[f32]);
    /// [`Backend::write`] of a forward's input that only launches after this call read, into a
    /// buffer no earlier launch of the forward touches (host-gathered rows): while a decode step
    /// is recorded a backend may upload it at once, ahead of the step's launches, instead of
    /// ending the recording.
    fn write_step_input(&self, buf: &mut Self::Buf, data: &[f32]) {
        self.write(buf, data);
    }
    fn read(&self, buf: &Self::Buf, out: &mut [f32]);
    fn upload_weight(&self, w: &HostWeight) -> Result<Self::Weight>;
    /// Overwrite rows `row0..row0 + w.rows` of an uploaded weight with `w`'s rows (same type
    /// and columns), as [`Backend::upload_weight`] would have laid them out: a device cache
    /// replaces single experts in place.
    fn write_weight_rows(&self, dst: &mut Self::Weight, row0: usize, w: &HostWeight) -> Result<()>;
    /// A small f32 vector (norm weight, bias).
    fn upload_vector(&self, data: &[f32]) -> Result<Self::Vector>;
    /// A zeroed id buffer of `len` entries.
    fn alloc_ids(&self, len: usize) -> Self::Ids;
    /// Copy `data` into the first `data.len()` entries of `ids`.
    fn write_ids(&self, ids: &mut Self::Ids, data: &[u32]);
    /// Copy the first `out.len()` entries of `ids` into `out` (waits for the device).
    fn read_ids(&self, ids: &Self::Ids, out: &mut [u32]);
    fn new_kv(&self, layers: &[KvLayerSpec], ty: KvType) -> Result<Self::Kv>;
    /// Save what later writes could overwrite of a cache holding positions `0..n_past`: the
    /// window of each sliding layer (full layers are append-only and need nothing).
    fn kv_checkpoint(&self, kv: &Self::Kv, n_past: usize) -> Self::KvSnapshot;
    /// Undo every write made since `snap` was taken (positions ≥ its `n_past` become invalid).
    fn kv_restore(&self, kv: &mut Self::Kv, snap: &Self::KvSnapshot);
    /// Deep copy of a cache (used by the prefix cache to fork a sequence); an error when the
    /// device runs out of memory.
    fn kv_clone(&self, kv: &Self::Kv) -> Result<Self::Kv>;
    /// Bytes held by a cache.
    fn kv_bytes(&self, kv: &Self::Kv) -> usize;
    /// Make storage exist for positions `0..n_past` (a paged cache allocates blocks as a
    /// sequence grows; an error, with nothing lost, when memory runs out). Called before every
    /// forward; a cache allocated whole at its creation does nothing.
    fn kv_reserve(&self, kv: &mut Self::Kv, n_past: usize) -> Result<()> {
        let _ = (kv, n_past);
        Ok(())
    }
    /// Free storage no position below `n_past` uses (after a rollback or reset); a cache
    /// allocated whole at its creation keeps it.
    fn kv_release(&self, kv: &mut Self::Kv, n_past: usize) {
        let _ = (kv, n_past);
    }
    /// Whether buffers from [`Backend::alloc`] cost memory only once written and are cheap to
    /// free and make again (host memory): a sequence left idle then gives its scratch buffers
    /// back until its next forward (`ModelState::park`). A GPU keeps them: its recorded decode
    /// steps point into them.
    fn scratch_by_use(&self) -> bool {
        false
    }
    /// The rows of every position a cache holds for a sequence of `n_past` positions, by
    /// position ([`kv_export`]: the prefix cache's files).
    fn kv_export(&self, kv: &Self::Kv, n_past: usize) -> KvExport;
    /// Write an export back into a cache of the same element type and layers (any capacity
    /// that holds the positions the sequence reads); an error, with nothing written, when it
    /// does not fit.
    fn kv_import(&self, kv: &mut Self::Kv, e: &KvExport) -> Result<()>;

    // --- ops ---
    /// out[t] = row `ids[t]` of the embedding matrix, times `scale`.
    fn get_rows(
        &self,
        w: &Self::Weight,
        ids: &[u32],
        scale: f32,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// y = x · Wᵀ for `n` rows of x.
    fn matmul(&self, w: &Self::Weight, x: &Self::Buf, n: usize, y: &mut Self::Buf);
    /// Several products of the same activations (Q/K/V, gate/up) — one dispatch where the
    /// backend can fuse them; results identical to separate [`Backend::matmul`] calls.
    fn matmul_many(
        &self,
        ws: &[&Self::Weight],
        x: &Self::Buf,
        n: usize,
        ys: &mut [&mut Self::Buf],
    ) {
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            self.matmul(w, x, n, y);
        }
    }
    /// x[t] += b for each of the `n` rows.
    fn add_bias(&self, x: &mut Self::Buf, b: &Self::Vector, n: usize);
    /// RMSNorm over rows of length `width` (`n_rows` rows): out = x / rms(x) * w.
    fn rms_norm(
        &self,
        x: &Self::Buf,
        w: &Self::Vector,
        n_rows: usize,
        width: usize,
        eps: f32,
        out: &mut Self::Buf,
    );
    /// In-place RMSNorm (used for per-head q/k norms).
    fn rms_norm_inplace(
        &self,
        x: &mut Self::Buf,
        w: &Self::Vector,
        n_rows: usize,
        width: usize,
        eps: f32,
    );
    /// Rotate `n_head` heads of width `head_dim` in each of the `positions.len()` rows.
    fn rope(
        &self,
        x: &mut Self::Buf,
        n_head: usize,
        head_dim: usize,
        positions: &[u32],
        p: &RopeParams,
    );
    fn scale(&self, x: &mut Self::Buf, len: usize, s: f32);
    /// x += y over `len` elements.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf, len: usize);
    /// gate = act(gate) * up over `len` elements.
    fn act_mul(&self, gate: &mut Self::Buf, up: &Self::Buf, len: usize, act: Activation);
    /// x = cap * tanh(x / cap).
    fn softcap(&self, x: &mut Self::Buf, len: usize, cap: f32);
    /// Store k/v rows (one per position) into the cache layer.
    fn kv_store(
        &self,
        kv: &mut Self::Kv,
        layer: usize,
        k: &Self::Buf,
        v: &Self::Buf,
        positions: &[u32],
    );
    /// Causal attention of the query rows (at `positions`) over the cache layer; out is
    /// `[n, n_head * head_dim_v]`. Keys for every position ≤ max(positions) in the window must be stored.
    fn attention(
        &self,
        q: &Self::Buf,
        kv: &Self::Kv,
        layer: usize,
        positions: &[u32],
        p: &AttnParams,
        out: &mut Self::Buf,
    );
    /// Copy `n_rows` rows of width `width` starting at row `src_row` of `src` into `dst` from
    /// row `dst_row` on.
    fn copy_rows(
        &self,
        src: &Self::Buf,
        src_row: usize,
        n_rows: usize,
        width: usize,
        dst: &mut Self::Buf,
        dst_row: usize,
    );

    // --- kit ops (MoE and hybrid architectures) ---
    /// Softmax of each of the `n_rows` rows of `width` elements, in place, in f32: subtract the
    /// row max, `exp`, divide by the sum. The sum is accumulated in f64 (sequentially on the CPU,
    /// as a tree on a GPU; the same value up to the final rounding to f32), so backends agree
    /// within a few ulps (the `exp` implementations differ). -inf entries give 0; a row whose
    /// max is -inf (all -inf) gives all 0; NaN propagates.
    fn softmax_rows(&self, x: &mut Self::Buf, n_rows: usize, width: usize);
    /// x = 1 / (1 + exp(-x)) over `len` elements, in place.
    fn sigmoid(&self, x: &mut Self::Buf, len: usize);
    /// x *= y over `len` elements.
    fn mul(&self, x: &mut Self::Buf, y: &Self::Buf, len: usize);
    /// Gated activation of fused gate/up rows: `out` row r = act(`gu` row r's first `width`
    /// elements) · its last `width` (rows of `2·width`: a fused expert product's output), for
    /// `n_rows` rows; the same values as [`Backend::act_mul`] of the halves.
    fn act_mul_split(
        &self,
        gu: &Self::Buf,
        n_rows: usize,
        width: usize,
        act: Activation,
        out: &mut Self::Buf,
    );

    /// `out` row i = `src` row `idx[i]` for i < `n` (rows of `width`). An index at or past the
    /// rows `src` holds is a caller bug: debug-asserted on the CPU; every backend writes a zero
    /// row for it (never reads out of bounds).
    fn gather_rows(
        &self,
        src: &Self::Buf,
        idx: &Self::Ids,
        n: usize,
        width: usize,
        out: &mut Self::Buf,
    );
    /// `dst` row `idx[i]` += `weights[i]` · `src` row i for i < `n` (rows of `width`; without
    /// weights, plain adds). Deterministic: rows landing on the same destination are added in
    /// ascending i, each product and sum rounded to f32 (no fused multiply-add), so every
    /// backend gives the CPU's bits. An index at or past the rows `dst` holds is a caller bug:
    /// debug-asserted on the CPU, skipped on every backend.
    fn scatter_add_rows(
        &self,
        dst: &mut Self::Buf,
        src: &Self::Buf,
        idx: &Self::Ids,
        weights: Option<&Self::Buf>,
        n: usize,
        width: usize,
    );

    /// Mixture-of-experts routing of `n_tokens` rows of router logits (`[n_tokens, n_expert]`),
    /// on the device (no host read-back): writes `[n_tokens, k]` expert ids into `ids` and their
    /// f32 weights into `weights`. Per token ([`RouteParams`] for the models' settings):
    /// scores `s = score(logits)`; selection keys `s + bias` (DeepSeek's
    /// `e_score_correction_bias`: selection only); with groups, only the `topk_group` groups
    /// with the largest sum of their two best keys stay eligible; the `k` best keys are chosen,
    /// in descending order, the lowest expert id first among equal keys (NaN keys rank as -inf);
    /// weights are the chosen experts' unbiased scores, renormalised where `renorm`
    /// (`w / (Σw + eps)`, Σ in that descending order; eps 1e-20 for the sigmoid-type scores as
    /// in DeepSeek, 0 for softmax as in Qwen3 / Gemma 4; a zero sum leaves the weights 0, where
    /// HF gives NaN), times `scale`, times `expert_scale[id]` where given (Gemma 4's
    /// `per_expert_scale`). The `k` slots are then written in ascending expert id: the order in
    /// which HF's expert loops add the experts' outputs, which a combine that adds slots in
    /// order ([`Backend::scatter_add_rows`]) then follows. The GPU computes the scores with its
    /// own `exp`: weights within a few ulps, the same experts unless two keys are that close.
    #[allow(clippy::too_many_arguments)]
    fn route(
        &self,
        logits: &Self::Buf,
        n_tokens: usize,
        p: &RouteParams,
        bias: Option<&Self::Vector>,
        expert_scale: Option<&Self::Vector>,
        ids: &mut Self::Ids,
        weights: &mut Self::Buf,
    );
    /// Hash routing (DeepSeek V4's first layers): token t's experts are row `tokens[t]` of
    /// `table` (`[n_vocab, k]` expert ids), its weights the chosen experts' scores
    /// (`p.score` of its logits row), renormalised, scaled and ordered like [`Backend::route`]
    /// (`p.n_group`, bias and expert scales do not apply). A token id past the table or an
    /// expert id past `n_expert` is a caller bug (debug-asserted on the CPU): that slot gets
    /// expert 0 with weight 0 on every backend.
    #[allow(clippy::too_many_arguments)]
    fn route_hash(
        &self,
        logits: &Self::Buf,
        tokens: &Self::Ids,
        table: &Self::Ids,
        n_tokens: usize,
        p: &RouteParams,
        ids: &mut Self::Ids,
        weights: &mut Self::Buf,
    );

    /// Expert-indexed product (llama.cpp's `mul_mat_id`): `w` is a 3-D expert tensor
    /// `[E, rows_per_expert, cols]` uploaded as one weight of `E · rows_per_expert` rows (expert
    /// e = rows `e · rows_per_expert ..`). For token t < `n_tokens` and slot j < `k`, with
    /// s = t·k + j: `y` row s (`rows_per_expert` wide) = expert `ids[s]` · `x` row (s if
    /// `x_per_slot`, else t). Each expert's result is that of [`Backend::matmul`] of a weight
    /// holding only its rows over the rows routed to it (on the CPU bit-identical, the rows in
    /// ascending slot order). An expert id ≥ E gives a `y` row of 0 on every backend (the
    /// device cache of host-memory experts marks the slots it does not hold so).
    #[allow(clippy::too_many_arguments)]
    fn matmul_experts(
        &self,
        w: &Self::Weight,
        rows_per_expert: usize,
        x: &Self::Buf,
        x_per_slot: bool,
        ids: &Self::Ids,
        n_tokens: usize,
        k: usize,
        y: &mut Self::Buf,
    );

    // --- hyper-connections (several residual streams per token) ---
    /// Mean of the `streams` blocks of each row: `x` is `[n, streams·width]`, `out` row t =
    /// (Σ_s x[t, s]) / streams, summed in ascending s in f32 (HF's `.mean(dim=-2)`).
    fn mean_streams(
        &self,
        x: &Self::Buf,
        n: usize,
        streams: usize,
        width: usize,
        out: &mut Self::Buf,
    );
    /// Add a block's output into every stream with its weight: `x[t, s] += w[t, s] · y[t]` for
    /// `x` `[n, streams·width]`, `w` `[n, streams]`, `y` `[n, width]` (product, then sum, each
    /// rounded to f32).
    fn inject_streams(
        &self,
        x: &mut Self::Buf,
        w: &Self::Buf,
        y: &Self::Buf,
        n: usize,
        streams: usize,
        width: usize,
    );

    /// RMSNorm of rows that come in groups with their own weights: row r of `width` uses
    /// `w[(r % groups)·width ..][..width]` (hyper-connection streams normalised per stream);
    /// otherwise as [`Backend::rms_norm`].
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_grouped(
        &self,
        x: &Self::Buf,
        w: &Self::Vector,
        n_rows: usize,
        width: usize,
        groups: usize,
        eps: f32,
        out: &mut Self::Buf,
    );

    // --- block-sparse attention ---
    /// The indexer's selection (Qwen3.8's QSA): for the query row t at `positions[t]`, the
    /// complete blocks b < ⌊(pos+1)/block⌋ of `block` positions are scored
    /// s_b = Σ_h relu(q_h · key_b) / √head_dim (`q` `[n, n_head·head_dim]`, `keys` one pooled
    /// row per block `[blocks, head_dim]`). With at most `max_blocks` complete blocks every
    /// position 0..=pos is selected; otherwise the `max_blocks` best blocks (the lowest block
    /// first among equal scores) and the open block's tail `block·nb ..= pos`. Row t of `sel`
    /// (`[n, max_selected]`) gets the selected positions in ascending order, `counts[t]` their
    /// number.
    #[allow(clippy::too_many_arguments)]
    fn indexer_select(
        &self,
        q: &Self::Buf,
        keys: &Self::Buf,
        positions: &[u32],
        p: &IndexerParams,
        sel: &mut Self::Ids,
        counts: &mut Self::Ids,
    );

    /// Row i of `src` (`width` wide) into row `positions[i]` of `dst`, or with `ring > 0` into
    /// row `positions[i] % ring` (a ring of raw rows). The rows go where the positions say on
    /// the device too (a recorded decode step's launches do not depend on its position).
    fn store_rows_at(
        &self,
        src: &Self::Buf,
        width: usize,
        positions: &[u32],
        ring: usize,
        dst: &mut Self::Buf,
    ) {
        for (i, &p) in positions.iter().enumerate() {
            let r = if ring > 0 {
                p as usize % ring
            } else {
                p as usize
            };
            self.copy_rows(src, i, 1, width, dst, r);
        }
    }

    /// The indexer's pooled keys of the blocks the rows at `positions` complete: for each
    /// position p with (p + 1) % `block` = 0, block b = p / `block`: the mean of its `block`
    /// raw rows (`raw`, position x in row x % `raw_slots`, `width` wide; summed in order, then
    /// divided), RMS-normalised with `norm`, rotated at position b·`block`, into row b of
    /// `rows`. `scratch`: two buffers of `max(block, positions.len())·width` floats.
    #[allow(clippy::too_many_arguments)]
    fn pool_blocks(
        &self,
        raw: &Self::Buf,
        raw_slots: usize,
        width: usize,
        block: usize,
        positions: &[u32],
        norm: (&Self::Vector, f32),
        rope: &RopeParams,
        scratch: [&mut Self::Buf; 2],
        rows: &mut Self::Buf,
    ) {
        let [gathered, pooled] = scratch;
        for &p in positions {
            let p = p as usize;
            if !(p + 1).is_multiple_of(block) {
                continue;
            }
            let bi = p / block;
            for j in 0..block {
                self.copy_rows(raw, (bi * block + j) % raw_slots, 1, width, gathered, j);
            }
            self.mean_streams(gathered, 1, block, width, pooled);
            self.rms_norm_inplace(pooled, norm.0, 1, width, norm.1);
            self.rope(pooled, 1, width, &[(bi * block) as u32], rope);
            self.copy_rows(pooled, 0, 1, width, rows, bi);
        }
    }

    /// Attention of the `n` query rows (`[n, n_head·hd]`) over the positions row t of `sel`
    /// selects (`counts[t]` of them, `width` wide), with f32 K and V rows by position
    /// (`[positions, n_head_kv·hd]`); query head h reads K/V head h / (n_head / n_head_kv);
    /// softmax in f32 of `scale`·q·k over the selection, in its order (sum in f64).
    #[allow(clippy::too_many_arguments)]
    fn attention_selected(
        &self,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        sel: &Self::Ids,
        counts: &Self::Ids,
        n: usize,
        width: usize,
        heads: (usize, usize, usize),
        scale: f32,
        out: &mut Self::Buf,
    );

    // --- DeepSeek V4: mHC streams, compressed entries, attention with sinks ---
    /// mHC mixing weights, in place. Row t of `mix` (the normalised streams' products with the
    /// mixing matrix) is `[pre S | post S | C S×S]` (`(2+S)·S` wide; with `head`, `[pre S]`):
    /// pre = σ(pre·scale[0] + base) + eps; post = 2σ(post·scale[1] + base); C = softmax over k
    /// of each row j of C·scale[2] + base, + eps, then columns normalised (x / (Σ_j + eps)), then
    /// `iters − 1` times rows then columns. All f32 (HF computes them in f32).
    #[allow(clippy::too_many_arguments)]
    fn mhc_weights(
        &self,
        mix: &mut Self::Buf,
        base: &Self::Vector,
        scale: [f32; 3],
        n: usize,
        streams: usize,
        iters: usize,
        eps: f32,
        head: bool,
    );
    /// The block input of `x` (`[n, S·width]`): out row t = Σ_s w[t·stride + s] · x[t, s], in
    /// ascending s, each product and sum rounded to f32.
    #[allow(clippy::too_many_arguments)]
    fn mhc_collapse(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        stride: usize,
        n: usize,
        streams: usize,
        width: usize,
        out: &mut Self::Buf,
    );
    /// The streams after a block: x[t, k] = post[t, k] · y[t] + Σ_j C[t, j, k] · x[t, j] (j
    /// ascending), with `w` rows of [`Backend::mhc_weights`].
    fn mhc_expand(
        &self,
        x: &mut Self::Buf,
        w: &Self::Buf,
        y: &Self::Buf,
        n: usize,
        streams: usize,
        width: usize,
    );
    /// Rotate the trailing `2·inv_freq.len()` channels of each of the `n_head` heads of every
    /// row in interleaved (GPT-J) pairs: angle = f32(pos) · inv_freq[i] in f32;
    /// (a, b) → (a·cos − b·sin, b·cos + a·sin); `inverse` negates the sine.
    fn rope_trailing(
        &self,
        x: &mut Self::Buf,
        n_head: usize,
        head_dim: usize,
        positions: &[u32],
        inv_freq: &[f32],
        inverse: bool,
    );
    /// A compressor's entries for windows `first..first + n_windows` of `m` positions into rows
    /// `0..n_windows` of `out` (`width` wide). `raw` is a ring of `raw_slots` rows (position p
    /// in slot p % raw_slots) of `[values | gate logits]`, each half `width` wide, or `2·width`
    /// with `overlap`. Per channel, a softmax over the window's slots of logit + `ape[j]` weighs
    /// the values. With `overlap` (CSA) the slots are the previous window's first halves
    /// (logits + ape's first half; none for window 0) then this window's second halves (ape's
    /// second half). All f32, the softmax's sum in slot order.
    #[allow(clippy::too_many_arguments)]
    fn compress_pool(
        &self,
        raw: &Self::Buf,
        raw_slots: usize,
        raw_width: usize,
        width: usize,
        ape: &Self::Vector,
        m: usize,
        overlap: bool,
        first: usize,
        n_windows: usize,
        out: &mut Self::Buf,
    );
    /// [`Backend::compress_pool`] of the windows the rows at `positions` complete (position p
    /// with (p + 1) % `m` = 0 completes window p / `m`), each into row p / `m` of `rows`.
    /// `scratch` holds as many rows of `width` as the positions complete windows. A GPU reads
    /// the positions on the device, so a decode step's launches do not depend on the position.
    #[allow(clippy::too_many_arguments)]
    fn compress_pool_at(
        &self,
        raw: &Self::Buf,
        (raw_slots, raw_width): (usize, usize),
        width: usize,
        ape: &Self::Vector,
        (m, overlap): (usize, bool),
        positions: &[u32],
        scratch: &mut Self::Buf,
        rows: &mut Self::Buf,
    ) {
        let windows: Vec<usize> = positions
            .iter()
            .filter(|&&p| (p as usize + 1).is_multiple_of(m))
            .map(|&p| p as usize / m)
            .collect();
        let mut i = 0;
        while i < windows.len() {
            let mut j = i + 1;
            while j < windows.len() && windows[j] == windows[j - 1] + 1 {
                j += 1;
            }
            let (first, k) = (windows[i], j - i);
            self.compress_pool(
                raw, raw_slots, raw_width, width, ape, m, overlap, first, k, scratch,
            );
            self.copy_rows(scratch, 0, k, width, rows, first);
            i = j;
        }
    }
    /// The Lightning indexer's selection: for the query row t at `positions[t]`, the visible
    /// entries e < ⌊(pos+1)/ratio⌋ of `keys` (`[entries, head_dim]`) are scored
    /// Σ_h relu(q_h · key_e) · scale · w[t, h] (`q` `[n, n_head·head_dim]`, `w` `[n, n_head]`).
    /// With at most `top_k` visible entries all of them are selected; otherwise the `top_k`
    /// best (the lower entry first among equal scores, NaN lowest). Row t of `sel`
    /// (`[n, top_k]`) gets them in ascending order, `counts[t]` their number. With `expand`
    /// the row (`[n, p.width()]`) lists positions: e·ratio .. e·ratio + ratio − 1 of each kept
    /// entry e in ascending order, then the open entry's ⌊(pos+1)/ratio⌋·ratio ..= pos.
    #[allow(clippy::too_many_arguments)]
    fn lightning_select(
        &self,
        q: &Self::Buf,
        w: &Self::Buf,
        keys: &Self::Buf,
        positions: &[u32],
        p: &LightningParams,
        sel: &mut Self::Ids,
        counts: &mut Self::Ids,
    );
    /// Attention with sinks over K=V rows (one head of `head_dim`, shared by every query head):
    /// query row t (`[n, n_head·head_dim]`) reads the rows of `a` selected by its row of
    /// `a_sel` (`a_counts[t]` of them, `a_width` wide), then those of `b`; per head h the
    /// softmax of `scale`·q·k over them and the sink logit `sinks[h]` (which takes probability
    /// but adds no value; f32, the sum in f64), times the rows.
    #[allow(clippy::too_many_arguments)]
    fn attention_sink(
        &self,
        q: &Self::Buf,
        a: (&Self::Buf, &Self::Ids, &Self::Ids, usize),
        b: (&Self::Buf, &Self::Ids, &Self::Ids, usize),
        sinks: &Self::Vector,
        n: usize,
        n_head: usize,
        head_dim: usize,
        scale: f32,
        out: &mut Self::Buf,
    );

    // --- recurrent layers (Gated DeltaNet, short convolutions) ---
    /// Depthwise causal convolution over time with a carried state, over rows `from..from + n`
    /// of `x` and `out` (`width` wide): `state` holds the `(k−1)·dilation` rows before them
    /// (zeros at a sequence start) and is advanced to end after them; `w` is `[width, k]` (HF's `[C, 1, K]` conv weight). Row t of
    /// `out` = Σ_j w[·, j] ⊙ row (t + j·dilation) of [state; x], summed in ascending j, each
    /// product and sum rounded to f32 (the CPU's bits on every backend), then SiLU when `silu`
    /// (the backend's `exp`).
    #[allow(clippy::too_many_arguments)]
    fn conv1d_causal(
        &self,
        x: &Self::Buf,
        from: usize,
        n: usize,
        width: usize,
        w: &Self::Vector,
        k: usize,
        dilation: usize,
        silu: bool,
        state: &mut Self::Buf,
        out: &mut Self::Buf,
    );

    /// Sum of each of `n_rows` rows of `width` into `out[r]`, in ascending order in f32.
    fn sum_rows(&self, x: &Self::Buf, n_rows: usize, width: usize, out: &mut Self::Buf);

    /// The decay of a gated delta rule, in place over rows of `width` (one value per head):
    /// x = scale[j] · softplus(x + bias[j]) with softplus(y) = y above 20, else ln(1 + eʸ)
    /// (Gated DeltaNet's g = −exp(A_log)·softplus(a + dt_bias), `scale` = −exp(A_log)).
    fn decay_gate(
        &self,
        x: &mut Self::Buf,
        bias: &Self::Vector,
        scale: &Self::Vector,
        n_rows: usize,
        width: usize,
    );

    /// Qwen3.8's n-gram injection gate, in place over `len` values:
    /// x = sigmoid(sign(y) · sqrt(max(|y|, 1e-6))) with y = x · `scale` (sign(0) = 0).
    fn signed_sqrt_gate(&self, x: &mut Self::Buf, len: usize, scale: f32);

    /// The gated delta rule, token by token (its recurrent form, so a result never depends on
    /// how the sequence is split into calls). `qkv` rows are `[q (n_k·dk) | k (n_k·dk) | v
    /// (n_v·dv)]` (Gated DeltaNet's projection after its convolution); each q and k head is
    /// L2-normalised (x · 1/sqrt(Σx² + 1e-6)) and q scaled by dk^-½ first. Rows
    /// `dims.from..dims.from + dims.n` of `qkv`, g, β and `out` are processed. Then for t < n and
    /// value head h, with key head [`DeltaDims::key_head`] (HF's grouping or llama.cpp's tiled
    /// order) and S_h
    /// the `[dk, dv]` f32 state: S_h ← exp(g[t,h])·S_h; δ = β[t,h]·(v[t,h] − S_hᵀk);
    /// S_h += k ⊗ δ; out[t,h] = S_hᵀq. g, β are `[n, n_v]`; out `[n, n_v·dv]`; `state`
    /// `[n_v, dk, dv]`, zeros at a sequence start. Each sum over keys runs in ascending key
    /// index, products and sums rounded separately.
    #[allow(clippy::too_many_arguments)]
    fn gated_delta_rule(
        &self,
        qkv: &Self::Buf,
        g: &Self::Buf,
        beta: &Self::Buf,
        dims: DeltaDims,
        state: &mut Self::Buf,
        out: &mut Self::Buf,
    );

    /// [`Backend::gated_delta_rule`] with a decay per key channel (Kimi Delta Attention, GLM
    /// 5.3's linear layers): g is `[n, n_v·dk]` and S_h ← Diag(exp(g[t,h,·]))·S_h scales row i
    /// (key channel i) of each head's state by its own factor; everything else as there. With
    /// one value repeated over a head's channels, the per-head rule's bits.
    fn gated_delta_rule_channels(
        &self,
        qkv: &Self::Buf,
        g: &Self::Buf,
        beta: &Self::Buf,
        dims: DeltaDims,
        state: &mut Self::Buf,
        out: &mut Self::Buf,
    );

    // --- fused elementwise chains: the listed ops' values (on the CPU bit for bit), one launch ---
    /// x = v·σ(v), v = x·`s` over `len` values ([`Backend::scale`], then SiLU as v · σ(v)).
    fn silu_scaled(&self, x: &mut Self::Buf, len: usize, s: f32);
    /// x = `post`·σ(`pre`·x) over `len` values (scale, [`Backend::sigmoid`], scale).
    fn sigmoid_scaled(&self, x: &mut Self::Buf, len: usize, pre: f32, post: f32);
    /// x *= σ(g) over `len` values ([`Backend::sigmoid`] of g, then [`Backend::mul`]; g kept).
    fn sigmoid_mul(&self, x: &mut Self::Buf, g: &Self::Buf, len: usize);
    /// `out` = [`Backend::mean_streams`] of σ(a) ⊙ xn (`a`, `xn` `[n, streams·width]`; a kept).
    fn sigmoid_mix_streams(
        &self,
        a: &Self::Buf,
        xn: &Self::Buf,
        n: usize,
        streams: usize,
        width: usize,
        out: &mut Self::Buf,
    );
    /// Gated DeltaNet's gates over `[n_rows, width]`: b = σ(b), and [`Backend::decay_gate`] of a.
    fn delta_gates(
        &self,
        b: &mut Self::Buf,
        a: &mut Self::Buf,
        bias: &Self::Vector,
        scale: &Self::Vector,
        n_rows: usize,
        width: usize,
    );

    /// Products from here on, until `precise_products(false)`, take the backend's most precise
    /// quantized path where it has one (the CPU adds the product of each activation row's
    /// rounding residual: `docs/testing.md`, "Accuracy of the quantized path"). Models turn it on
    /// for the rows whose logits they return in the last layer past its K/V, where rounding
    /// reaches the logits undamped. Default: no change.
    fn precise_products(&self, _on: bool) {}
    // --- fused ops (default: the unfused ops, so results are identical) ---
    /// RoPE of the query rows (`n_head` heads) and the key rows (`n_head_kv` heads) at the
    /// same positions: [`Backend::rope`] on each.
    #[allow(clippy::too_many_arguments)]
    fn rope_qk(
        &self,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        positions: &[u32],
        p: &RopeParams,
    ) {
        self.rope(q, n_head, head_dim, positions, p);
        self.rope(k, n_head_kv, head_dim, positions, p);
    }
    /// [`Backend::rope_qk`], then [`Backend::kv_store`] of the rotated keys and of `v`.
    #[allow(clippy::too_many_arguments)]
    fn rope_qk_store(
        &self,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        v: &Self::Buf,
        kv: &mut Self::Kv,
        layer: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        positions: &[u32],
        p: &RopeParams,
    ) {
        self.rope_qk(q, k, n_head, n_head_kv, head_dim, positions, p);
        self.kv_store(kv, layer, k, v, positions);
    }
    /// [`Backend::rope_qk_store`] after RMS-normalizing every q and k head (`head_dim`
    /// elements; Qwen3's and Gemma's QK norm) with `norms` = (q weights, k weights, eps), and
    /// every v head with `v_norm` where given (Gemma 4's V norm, weights all ones):
    /// [`Backend::rms_norm_inplace`] two or three times, then the RoPE and the store, in one
    /// call that a backend may fuse.
    #[allow(clippy::too_many_arguments)]
    fn norm_rope_qk_store(
        &self,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        v: &mut Self::Buf,
        kv: &mut Self::Kv,
        layer: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        positions: &[u32],
        p: &RopeParams,
        norms: (&Self::Vector, &Self::Vector, f32),
        v_norm: Option<&Self::Vector>,
    ) {
        let n = positions.len();
        let (qn, kn, eps) = norms;
        if let Some(vn) = v_norm {
            self.rms_norm_inplace(v, vn, n * n_head_kv, head_dim, eps);
        }
        self.rms_norm_inplace(q, qn, n * n_head, head_dim, eps);
        self.rms_norm_inplace(k, kn, n * n_head_kv, head_dim, eps);
        self.rope_qk_store(
            q, k, v, kv, layer, n_head, n_head_kv, head_dim, positions, p,
        );
    }
    /// [`Backend::attention`] into `a`, then `y = a · wᵀ` ([`Backend::matmul`]): the attention
    /// output and its projection, one call that a backend may fuse.
    #[allow(clippy::too_many_arguments)]
    fn attention_matmul(
        &self,
        q: &Self::Buf,
        kv: &Self::Kv,
        layer: usize,
        positions: &[u32],
        p: &AttnParams,
        a: &mut Self::Buf,
        w: &Self::Weight,
        y: &mut Self::Buf,
    ) {
        self.attention(q, kv, layer, positions, p, a);
        self.matmul(w, a, positions.len(), y);
    }
    /// One layer's RoPE + K/V store ([`Backend::norm_rope_qk_store`] with `norms`, else
    /// [`Backend::rope_qk_store`]) and [`Backend::attention`] of several sequences in one call:
    /// the rows of `q`, `k`, `v` and `out` are sequence 0's `positions[0].len()` rows, then
    /// sequence 1's, ..., each over its own `kvs[i]`. A GPU runs each op once over all rows
    /// instead of once per sequence; a row's results are the per-sequence calls' up to the
    /// split-K rounding. Returns false without doing anything where there is no such path (the
    /// default): the caller runs the sequences one by one.
    #[allow(clippy::too_many_arguments)]
    fn rope_store_attend_batch(
        &self,
        _q: &mut Self::Buf,
        _k: &mut Self::Buf,
        _v: &mut Self::Buf,
        _kvs: &mut [&mut Self::Kv],
        _layer: usize,
        _positions: &[&[u32]],
        _rope: &RopeParams,
        _norms: Option<(&Self::Vector, &Self::Vector, f32)>,
        _p: &AttnParams,
        _out: &mut Self::Buf,
    ) -> bool {
        false
    }
    /// `gate = act(gate) * up` over `n_rows * width` elements ([`Backend::act_mul`]), then
    /// `y = gate · wᵀ` ([`Backend::matmul`]).
    #[allow(clippy::too_many_arguments)]
    fn act_mul_matmul(
        &self,
        gate: &mut Self::Buf,
        up: &Self::Buf,
        n_rows: usize,
        width: usize,
        act: Activation,
        w: &Self::Weight,
        y: &mut Self::Buf,
    ) {
        self.act_mul(gate, up, n_rows * width, act);
        self.matmul(w, gate, n_rows, y);
    }
    /// The input of a pre-norm block: `x += residual` (if given; `n_rows * width` elements),
    /// `h = rms_norm(x) * w`, then `ys[i] = h · ws[i]ᵀ`, plus `biases[i]` on each row where
    /// given (`biases` empty or one per weight; Qwen2's Q/K/V) — [`Backend::add`],
    /// [`Backend::rms_norm`], [`Backend::matmul_many`] and [`Backend::add_bias`] in one call
    /// that a backend may fuse.
    #[allow(clippy::too_many_arguments)]
    fn norm_matmul_many(
        &self,
        x: &mut Self::Buf,
        residual: Option<&Self::Buf>,
        w: &Self::Vector,
        n_rows: usize,
        width: usize,
        eps: f32,
        h: &mut Self::Buf,
        ws: &[&Self::Weight],
        biases: &[Option<&Self::Vector>],
        ys: &mut [&mut Self::Buf],
    ) {
        if let Some(r) = residual {
            self.add(x, r, n_rows * width);
        }
        self.rms_norm(x, w, n_rows, width, eps, h);
        self.matmul_many(ws, h, n_rows, ys);
        for (b, y) in biases.iter().zip(ys.iter_mut()) {
            if let Some(b) = b {
                self.add_bias(y, b, n_rows);
            }
        }
    }
    /// [`Backend::norm_matmul_many`] whose residual is first RMS-normalized with `post`
    /// (Gemma's post-attention and post-FFN norms): `x += rms_norm(residual) * post`, then
    /// `x *= x_scale` unless it is 1 (Gemma 4's layer scalar), then the pre-norm and the
    /// products, in one call that a backend may fuse. `residual`'s content afterwards is
    /// unspecified (this default normalizes it in place).
    #[allow(clippy::too_many_arguments)]
    fn post_norm_matmul_many(
        &self,
        x: &mut Self::Buf,
        residual: &mut Self::Buf,
        post: &Self::Vector,
        x_scale: f32,
        w: &Self::Vector,
        n_rows: usize,
        width: usize,
        eps: f32,
        h: &mut Self::Buf,
        ws: &[&Self::Weight],
        biases: &[Option<&Self::Vector>],
        ys: &mut [&mut Self::Buf],
    ) {
        self.rms_norm_inplace(residual, post, n_rows, width, eps);
        if x_scale == 1.0 {
            self.norm_matmul_many(x, Some(residual), w, n_rows, width, eps, h, ws, biases, ys);
        } else {
            self.add(x, residual, n_rows * width);
            self.scale(x, n_rows * width, x_scale);
            self.norm_matmul_many(x, None, w, n_rows, width, eps, h, ws, biases, ys);
        }
    }
    // --- decode-step recording and device-side argmax (default: plain ops, host argmax) ---
    /// Announce a single-token decode step (`token` at position `pos` of the sequence `key`:
    /// nonzero and unique per sequence state, or 0 for none) whose ops follow. A backend may
    /// record them and run the whole step at once (CUDA graphs); the ops keep their meaning.
    /// Returns whether it records: then [`Backend::decode_step_end`] must follow the step's last
    /// op. The default (CPU) records nothing.
    fn decode_step_begin(&self, _token: u32, _pos: u32, _key: u64) -> bool {
        false
    }
    /// Run what was recorded since [`Backend::decode_step_begin`].
    fn decode_step_end(&self) {}
    /// [`Backend::decode_step_begin`] for a batched step: the ops of `tokens` at `positions`
    /// (several sequences' rows in turn) follow, then [`Backend::decode_step_end`].
    fn decode_batch_begin(&self, _tokens: &[u32], _positions: &[u32]) -> bool {
        false
    }
    /// Start recording the one-token step at `pos` of the sequence `key` (nonzero, unique per
    /// sequence state) before its token is known: the ops get [`DEVICE_TOKEN`] as the token id,
    /// and [`Backend::decode_step_park`] ends the recording without running anything; a later
    /// [`Backend::decode_step_launch`] runs it. The host records the next step while the device
    /// still computes the one whose logits pick its token. False (nothing started) when the
    /// backend cannot; the default never can.
    fn decode_step_prepare(&self, _pos: u32, _key: u64) -> bool {
        false
    }
    /// End a [`Backend::decode_step_prepare`] recording; its ops wait for
    /// [`Backend::decode_step_launch`] (any other step's recording drops them).
    fn decode_step_park(&self) {}
    /// Drop a [`Backend::decode_step_prepare`] recording (or a parked step) without running it.
    fn decode_step_discard(&self) {}
    /// Run the parked step if it is the one of `pos` in sequence `key`, with `token`: then the
    /// step's ops need not be issued again. False (nothing run, the parked step dropped)
    /// otherwise.
    fn decode_step_launch(&self, _token: u32, _pos: u32, _key: u64) -> bool {
        false
    }
    /// Pipelined greedy decoding: start recording a one-token step at `pos` of sequence `key`
    /// whose token is the id the last [`Backend::argmax_start`] (made in this sequence's step at
    /// `pos - 1`) left on the device, before the host has read it back; the step's ops get
    /// [`DEVICE_TOKEN`] as the token id.
    /// Returns false (and starts nothing) when the backend cannot: no recording, no such id on
    /// the device, or pipelining switched off. The default never can.
    fn decode_step_begin_chained(&self, _pos: u32, _key: u64) -> bool {
        false
    }
    /// The argmax of the one logits row `x` of `width` elements ([`Backend::argmax_rows`]'s
    /// semantics) without waiting for it: ends the step being recorded, keeps the id on the
    /// device for a [`Backend::decode_step_begin_chained`] step and starts copying it back.
    /// Returns the ticket to pass to [`Backend::argmax_finish`] (at most
    /// [`ARGMAX_TICKETS`] may be outstanding), or `None` when the backend does not pipeline
    /// (the default): then nothing was launched and the step is still being recorded.
    fn argmax_start(&self, _x: &Self::Buf, _width: usize) -> Option<u64> {
        None
    }
    /// The id of an [`Backend::argmax_start`] ticket (waits until it is on the host).
    fn argmax_finish(&self, ticket: u64) -> Result<u32> {
        anyhow::bail!("argmax ticket {ticket}: this backend does not pipeline decode steps")
    }
    /// Index of the largest element of each of the `n_rows` rows of `width` elements: the lowest
    /// index among equal maxima, NaNs skipped (a row of NaNs gives 0). A GPU computes it on the
    /// device and copies back only the indices.
    fn argmax_rows(&self, x: &Self::Buf, n_rows: usize, width: usize) -> Vec<u32> {
        if width == 0 {
            return vec![0; n_rows];
        }
        let mut v = vec![0f32; n_rows * width];
        self.read(x, &mut v);
        v.chunks_exact(width).map(argmax).collect()
    }

    // --- device-side top-k for sampling (default: read back, select on the host) ---
    /// The `k` best elements of each of the `n_rows` rows of `width` elements, with each row's
    /// max and softmax normalizer: [`top_k_row`] of every row. A GPU selects on the device and
    /// copies back only the `k` pairs and the row statistics.
    fn top_k_rows(&self, x: &Self::Buf, n_rows: usize, width: usize, k: usize) -> Vec<TopK> {
        let mut v = vec![0f32; n_rows * width];
        if !v.is_empty() {
            self.read(x, &mut v);
        }
        (0..n_rows)
            .map(|r| top_k_row(&v[r * width..(r + 1) * width], k))
            .collect()
    }
}

/// The token id a [`Backend::decode_step_begin_chained`] step passes to its ops: the step's token
/// is on the device (never a vocabulary id).
pub const DEVICE_TOKEN: u32 = u32::MAX;

/// Most [`Backend::argmax_start`] tickets that may be outstanding at once.
pub const ARGMAX_TICKETS: u64 = 4;

/// Ring size of a cache layer: full layers hold the whole context; a sliding layer holds its
/// window plus one batch (a batch's earliest query still needs `window - 1` older keys while the
/// batch's own keys are written), capped at the context.
pub fn ring_capacity(window: Option<usize>, n_ctx: usize, max_batch: usize) -> usize {
    match window {
        Some(w) => (w + max_batch).min(n_ctx),
        None => n_ctx,
    }
}

/// Positions whose KV entries a sliding layer needs to restore a checkpoint (see [`KvLayerSpec`]).
pub fn window_start(pos: usize, window: Option<usize>) -> usize {
    match window {
        Some(w) => (pos + 1).saturating_sub(w),
        None => 0,
    }
}
