//! DSpark, the block drafter of DeepSeek-V4-Flash-DSpark: a few full deepseek_v4 blocks that read
//! the target's last layers and propose a block of tokens in one pass, a Markov head chaining
//! them, and a confidence head to stop early. No transformers code exists; the reference is
//! llama.cpp 0c1e570 (`src/models/dflash.cpp` graph_dsv4 and build_dspark_markov_head,
//! `common/speculative.cpp` draft-dspark, `conversion/deepseek.py` DeepseekV4DSparkModel) and
//! `scripts/gen-deepseekv4-with-dspark.py` re-implements it independently:
//!
//! ```text
//! every position p the target evaluates:
//!     taps(p)  = the mean over the streams after each layer of dspark_target_layer_ids, concatenated
//!     g(p)     = rms(main_proj · taps(p)) · main_norm
//!     ctx_s(p) = rope_main(kv_norm_s(wkv_s · g(p)), p)        stage s's K=V row of position p
//! a draft of B tokens after `last` at position P (positions < P evaluated):
//!     the block [last, noise × (B−1)] at positions P..P+B−1 through the stages (mHC, attention,
//!     MoE, mHC); a block query at q reads the context rows of q−W < p < P and every block row
//!     (no causal mask inside the block), with the stage's sinks
//!     t_i = DSpark hc_head(streams_i); base_i = head(rms(t_i) · norm)       the target's head
//!     logits_i = base_i + markov_w2 · markov_w1[prev_i]   prev_0 = last, then draft i−1
//!     confidence_i = σ(conf · [t_i ; markov_w1[prev_i]] + b); drafting stops below the threshold
//! ```
//!
//! Each stage's context rows are a window ring of the target's sequence state (the same kind as
//! a trunk layer's window), so prefix reuse, rollback and checkpoints cover them. A draft writes
//! its block's rows into the rings at P.. too: those positions are rewritten by the target's next
//! forward before any draft reads them. The rows are kept only while a drafter is bound.
//!
//! Checkpoint: the release's layout, the stages as `mtp.<s>.*` (sliding attention, top-k routing)
//! and the heads under one of them (`main_proj`, `main_norm`, `markov_head.markov_w{1,2}`,
//! `confidence_head.proj`, `norm`, `hc_head_*`), with `dspark_block_size`,
//! `dspark_target_layer_ids` and `dspark_noise_token_id` in config.json.

use super::*;
use crate::lm::ModelState;
use crate::mtp::MtpHead;
use serde_json::Value;
use std::sync::atomic::Ordering;

/// The DSpark keys of config.json.
#[derive(Clone, Debug, PartialEq)]
pub struct DsparkConfig {
    /// Tokens per drafted block (the anchor's slot predicts the first draft).
    pub block: usize,
    /// Trunk layers whose output streams feed the drafter.
    pub taps: Vec<usize>,
    /// The token filling the block after the anchor.
    pub noise: u32,
}

impl DsparkConfig {
    /// `None` without `dspark_block_size`.
    pub fn from_json(j: &Value, n_layers: usize, n_vocab: usize) -> Result<Option<Self>> {
        let j = j.get("text_config").unwrap_or(j);
        let Some(b) = j.get("dspark_block_size").filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        let block = b
            .as_u64()
            .filter(|&b| (1..=64).contains(&b))
            .ok_or_else(|| anyhow!("config.json: dspark_block_size must be an integer in 1..=64"))?
            as usize;
        let taps: Vec<usize> = j
            .get("dspark_target_layer_ids")
            .and_then(Value::as_array)
            .ok_or_else(|| anyhow!("config.json: dspark_target_layer_ids must be a list"))?
            .iter()
            .map(|v| {
                v.as_u64()
                    .map(|v| v as usize)
                    .filter(|&v| v < n_layers)
                    .ok_or_else(|| {
                        anyhow!("config.json: dspark_target_layer_ids: {v} is not a layer below {n_layers}")
                    })
            })
            .collect::<Result<_>>()?;
        if taps.is_empty() {
            bail!("config.json: dspark_target_layer_ids is empty");
        }
        let noise = j
            .get("dspark_noise_token_id")
            .and_then(Value::as_u64)
            .filter(|&t| (t as usize) < n_vocab)
            .ok_or_else(|| {
                anyhow!("config.json: dspark_noise_token_id must be a token id below {n_vocab}")
            })? as u32;
        Ok(Some(DsparkConfig { block, taps, noise }))
    }
}

/// The drafter's weights.
pub(super) struct Dspark<B: Backend> {
    pub(super) cfg: DsparkConfig,
    /// Sliding-attention, top-k-routed blocks; their windows are state entries.
    stages: Vec<Layer<B>>,
    main_proj: B::Weight,
    main_norm: B::Vector,
    /// `[vocab, rank]`, read as rows.
    markov_w1: B::Weight,
    /// `[vocab, rank]`.
    markov_w2: B::Weight,
    rank: usize,
    /// `[hidden + rank]` and the bias.
    conf: Option<(Vec<f32>, f32)>,
    head_hc: Hc<B>,
    norm: B::Vector,
}

/// A state's DSpark scratch.
pub(super) struct DsparkScratch<B: Backend> {
    /// Row k·max_batch + t: tap k of the forward's token t.
    taps: B::Buf,
    /// Row t·K + k of the concatenation = taps row k·max_batch + t.
    cat_ids: B::Ids,
    cat: B::Buf,
    /// 1/S in every cell: the weights of the mean over the streams (Σ (1/S)·X_s, the same
    /// bits as ΣX_s / S for the release's S = 4).
    mean: B::Buf,
}

/// The release names of the stages (`mtp.<s>.*`) and where the heads are.
const STAGE_PREFIX: &str = "mtp";

impl<B: Backend> load::Loader<'_, B> {
    /// The DSpark stages and heads, when `dc` is given; `entries` are the stages' window
    /// entries.
    pub(super) fn dspark(
        &mut self,
        c: &DeepseekV4Config,
        dc: DsparkConfig,
        entries: &[usize],
    ) -> Result<Dspark<B>> {
        let mut stages = Vec::with_capacity(entries.len());
        for (s, &e) in entries.iter().enumerate() {
            let p = format!("{STAGE_PREFIX}.{s}");
            let kind = (Attn::Sliding, Routing::TopK);
            stages.push(self.layer(&p, s, kind, c, [Some(e), None, None])?);
        }
        // The heads sit under one of the stages.
        let n_stages = entries.len();
        let find = |ld: &Self, leaf: &str| -> Result<String> {
            (0..n_stages)
                .map(|s| format!("{STAGE_PREFIX}.{s}.{leaf}"))
                .find(|n| ld.locate(n).is_ok())
                .ok_or_else(|| anyhow!("DSpark checkpoint without {STAGE_PREFIX}.*.{leaf}"))
        };
        let h = c.hidden;
        let main_proj = self.host(&find(self, "main_proj.weight")?, false)?;
        if main_proj.rows != h || main_proj.cols != dc.taps.len() * h {
            bail!(
                "DSpark main_proj: [{}, {}], expected [{h}, {}]",
                main_proj.rows,
                main_proj.cols,
                dc.taps.len() * h
            );
        }
        let w1 = self
            .get(&find(self, "markov_head.markov_w1.weight")?)?
            .as_head(true);
        let w2 = self.host(&find(self, "markov_head.markov_w2.weight")?, false)?;
        let rank = w1.cols;
        if w1.rows != c.n_vocab || w2.rows != c.n_vocab || w2.cols != rank {
            bail!(
                "DSpark Markov head: w1 [{}, {}], w2 [{}, {}]; expected [{v}, R] twice \
                 (a reduced draft vocabulary is not supported)",
                w1.rows,
                w1.cols,
                w2.rows,
                w2.cols,
                v = c.n_vocab
            );
        }
        let conf = match find(self, "confidence_head.proj.weight") {
            Ok(n) => {
                let w = self.floats(&n, h + rank)?;
                let b = match find(self, "confidence_head.proj.bias") {
                    Ok(bn) => self.floats(&bn, 1)?[0],
                    Err(_) => 0.0,
                };
                Some((w, b))
            }
            Err(_) => None,
        };
        let s = c.hc;
        let hc_prefix = find(self, "hc_head_fn")?;
        let hc_prefix = hc_prefix.trim_end_matches("_fn");
        Ok(Dspark {
            stages,
            main_proj: self.upload(&main_proj, 1.0)?,
            main_norm: self.vector(&find(self, "main_norm.weight")?, h)?,
            markov_w1: self.upload(&w1, 0.0)?,
            markov_w2: self.upload(&w2, 0.0)?,
            rank,
            conf,
            head_hc: self.hc(hc_prefix, s, s * h)?,
            norm: self.vector(&find(self, "norm.weight")?, h)?,
            cfg: dc,
        })
    }
}

/// The number of DSpark stages in a checkpoint (`mtp.<s>.attn.wq_a.weight` for s = 0, 1, ...;
/// at most 64).
pub(super) fn count_stages(has: &dyn Fn(&str) -> bool) -> usize {
    (0..64)
        .take_while(|s| has(&format!("{STAGE_PREFIX}.{s}.attn.wq_a.weight")))
        .count()
}

impl<B: Backend> DeepseekV4Model<B> {
    /// The confidence below which a draft stops (DS4's default 0.6; 0 drafts whole blocks).
    pub fn dspark_p_min(&self) -> f32 {
        f32::from_bits(self.dspark_p_min.load(Ordering::Relaxed))
    }

    pub fn set_dspark_p_min(&self, p: f32) {
        self.dspark_p_min.store(p.to_bits(), Ordering::Relaxed);
    }

    /// The drafter, when one is bound (forwards keep its context rows only then).
    pub(super) fn active_dspark(&self) -> Option<&Dspark<B>> {
        self.dspark
            .as_ref()
            .filter(|_| self.dspark_on.load(Ordering::Relaxed))
    }

    pub(super) fn dspark_scratch(&self, max_batch: usize) -> Option<DsparkScratch<B>> {
        let ds = self.dspark.as_ref()?;
        let be = &*self.backend;
        let (k, h, s, nb) = (ds.cfg.taps.len(), self.cfg.hidden, self.cfg.hc, max_batch);
        let ids: Vec<u32> = (0..nb * k).map(|r| ((r % k) * nb + r / k) as u32).collect();
        let mut cat_ids = be.alloc_ids(ids.len());
        be.write_ids(&mut cat_ids, &ids);
        let mut mean = be.alloc(nb * s);
        be.write(&mut mean, &vec![1.0 / s as f32; nb * s]);
        Some(DsparkScratch {
            taps: be.alloc(k * nb * h),
            cat_ids,
            cat: be.alloc(nb * k * h),
            mean,
        })
    }

    /// After trunk layer `il` of a forward of `n` tokens: its tap, when it is one.
    pub(super) fn dspark_tap(
        &self,
        st: &mut DeepseekV4State<B>,
        ds: &Dspark<B>,
        il: usize,
        n: usize,
    ) {
        let Some(k) = ds.cfg.taps.iter().position(|&t| t == il) else {
            return;
        };
        let be = &*self.backend;
        let (s, h) = (self.cfg.hc, self.cfg.hidden);
        let Some(sc) = st.dspark.as_mut() else {
            return;
        };
        {
            let [x, cc] = pick2(&mut st.bufs, X, C);
            be.mhc_collapse(x, &sc.mean, s, n, s, h, cc);
        }
        be.copy_rows(&st.bufs[C], 0, n, h, &mut sc.taps, k * st.max_batch);
    }

    /// After the trunk of a forward at `positions`: every stage's context rows.
    pub(super) fn dspark_inject(
        &self,
        st: &mut DeepseekV4State<B>,
        ds: &Dspark<B>,
        positions: &[u32],
    ) -> Result<()> {
        let be = &*self.backend;
        let c = &self.cfg;
        let (n, h, k) = (positions.len(), c.hidden, ds.cfg.taps.len());
        let sc = st.dspark.as_mut().ok_or_else(no_dspark_state)?;
        // Concatenation row t·K + k is taps row k·max_batch + t: the first n·K ids serve any n.
        be.gather_rows(&sc.taps, &sc.cat_ids, n * k, h, &mut sc.cat);
        be.matmul(&ds.main_proj, &sc.cat, n, &mut st.bufs[C]);
        {
            let [cc, g] = pick2(&mut st.bufs, C, F);
            be.rms_norm(cc, &ds.main_norm, n, h, c.eps, g);
        }
        for stage in &ds.stages {
            let a = &stage.attn;
            {
                let [g, kv] = pick2(&mut st.bufs, F, KV);
                be.matmul(&a.wkv, g, n, kv);
            }
            let kv = &mut st.bufs[KV];
            be.rms_norm_inplace(kv, &a.kv_norm, n, c.head_dim, c.eps);
            be.rope_trailing(kv, 1, c.head_dim, positions, &self.inv_main, false);
            let win = st.extra.blocks_mut(a.window)?;
            let slots = win.raw_slots;
            let p0 = positions[0] as usize;
            store_ring(be, &st.bufs[KV], (n, c.head_dim), win.raw, slots, p0);
        }
        Ok(())
    }

    /// One drafted block after `last` at `pos` (see the module docs): up to `k` tokens, each
    /// position's logits to `next` (which returns the token the chain continues with); stops
    /// early where the confidence falls below [`Self::dspark_p_min`].
    fn dspark_draft(
        &self,
        st: &mut DeepseekV4State<B>,
        last: u32,
        pos: usize,
        k: usize,
        next: &mut dyn FnMut(Vec<f32>) -> Result<u32>,
    ) -> Result<()> {
        let be = &*self.backend;
        let p_min = self.dspark_p_min();
        let c = &self.cfg;
        let ds = self.active_dspark().ok_or_else(no_dspark_state)?;
        let n = k
            .min(ds.cfg.block)
            .min(st.max_batch)
            .min(st.n_ctx.saturating_sub(pos));
        if n == 0 {
            return Ok(());
        }
        let (s, h, v) = (c.hc, c.hidden, c.n_vocab);
        let mut tokens = vec![ds.cfg.noise; n];
        tokens[0] = last;
        let positions: Vec<u32> = (pos..pos + n).map(|p| p as u32).collect();
        be.write_ids(&mut st.tokens, &tokens);
        be.get_rows(&self.embd, &tokens, 1.0, &mut st.bufs[C])?;
        {
            let [e, x] = pick2(&mut st.bufs, C, X);
            be.gather_rows(e, &st.stream_rows, n * s, h, x);
        }
        // Every block query reads the context rows of q − W < p < pos and the whole block.
        {
            let first = ds
                .stages
                .first()
                .ok_or_else(|| anyhow!("DSpark without stages"))?;
            let slots = st.extra.block_raw(first.attn.window)?.1;
            let ww = st.win_width;
            let mut sel = vec![0u32; n * ww];
            let mut cnt = vec![0u32; n];
            for (t, &q) in positions.iter().enumerate() {
                let lo = (q as usize + 1).saturating_sub(c.window);
                for (j, p) in (lo..pos + n).enumerate() {
                    sel[t * ww + j] = (p % slots) as u32;
                }
                cnt[t] = (pos + n - lo) as u32;
            }
            be.write_ids(&mut st.sel_w, &sel);
            be.write_ids(&mut st.cnt_w, &cnt);
        }
        for stage in &ds.stages {
            self.block(st, stage, usize::MAX, &positions)?;
        }
        self.collapse_head(&mut st.bufs, &ds.head_hc, &ds.norm, n);
        // The collapsed rows and the Markov rows are read back only for the confidence head.
        let conf = ds.conf.is_some();
        let mut t_rows = vec![0f32; if conf { n * h } else { 0 }];
        if conf {
            be.read(&st.bufs[C], &mut t_rows);
        }
        crate::stepper::logits_room(be, &mut st.bufs[LOGITS], &mut st.logits_rows, n, v);
        {
            let [xn, lg] = pick2(&mut st.bufs, XN, LOGITS);
            be.matmul(&self.head, xn, n, lg);
        }
        let mut base = vec![0f32; n * v];
        be.read(&st.bufs[LOGITS], &mut base);
        let r = ds.rank;
        let mut w1 = vec![0f32; if conf { r } else { 0 }];
        let mut prev = last;
        for (i, row) in base.chunks_exact(v).enumerate() {
            be.get_rows(&ds.markov_w1, &[prev], 1.0, &mut st.bufs[C])?;
            if conf {
                be.read(&st.bufs[C], &mut w1);
            }
            {
                let [cc, lg] = pick2(&mut st.bufs, C, LOGITS);
                be.matmul(&ds.markov_w2, cc, 1, lg);
            }
            let mut lg = vec![0f32; v];
            be.read(&st.bufs[LOGITS], &mut lg);
            if let Some((w, b)) = &ds.conf {
                let t = &t_rows[i * h..][..h];
                let z = t.iter().chain(&w1).zip(w).map(|(a, b)| a * b).sum::<f32>() + b;
                let conf = 1.0 / (1.0 + (-z).exp());
                if conf < p_min {
                    break;
                }
            }
            for (l, b) in lg.iter_mut().zip(row) {
                *l += b;
            }
            prev = next(lg)?;
        }
        Ok(())
    }

    /// [`crate::lm::CausalLm::load_mtp`] for a checkpoint with DSpark stages: bound as a
    /// drafter (the stages' context rows are kept from then on).
    pub(super) fn bind_dspark(&self, path: &std::path::Path) -> Result<Box<dyn MtpHead>>
    where
        B: 'static,
    {
        if self.dspark.is_none() {
            bail!("this deepseek_v4 checkpoint has no drafter (no DSpark stages)");
        }
        if !crate::mtp::same_source(self.source.as_deref(), path) {
            bail!(
                "deepseek_v4's DSpark stages are part of its checkpoint: --mtp takes the model's \
                 own directory, not {}",
                path.display()
            );
        }
        self.dspark_on.store(true, Ordering::Relaxed);
        Ok(Box::new(DsparkHead::<B> {
            _be: std::marker::PhantomData,
        }))
    }
}

fn no_dspark_state() -> anyhow::Error {
    anyhow!("deepseek_v4: no DSpark drafter is bound to this model")
}

/// DSpark as a drafter of its own model's sequences.
pub struct DsparkHead<B: Backend> {
    _be: std::marker::PhantomData<fn() -> B>,
}

impl<B: Backend + 'static> MtpHead for DsparkHead<B> {
    fn sync(&mut self, _target: &dyn ModelState, _row: usize) -> Result<()> {
        // The target's forwards keep the context rows.
        Ok(())
    }

    fn draft(
        &mut self,
        target: &mut dyn ModelState,
        last: u32,
        pos: usize,
        k: usize,
        next: &mut dyn FnMut(Vec<f32>) -> Result<u32>,
    ) -> Result<()> {
        let seq = crate::mtp::own_seq::<DeepseekV4Model<B>>(target, pos, "DSpark")?;
        let model = seq.model.clone();
        model.dspark_draft(&mut seq.state, last, pos, k, next)
    }
}
