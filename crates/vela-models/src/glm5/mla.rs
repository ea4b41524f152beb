//! NoPE multi-head latent attention over the DSA indexer's selection (HF 773-1276, spec §5):
//!
//! ```text
//! qr = rms(x·Wq_aᵀ; q_a_layernorm);  q = qr·Wq_bᵀ                  [n, nh·dn]
//! c  = rms(x·Wkv_aᵀ; kv_a_layernorm)                               the latent row per token, [r]
//! per head h (absorbed, as llama.cpp runs it; kv_b = [W^k_h; W^v_h] per head):
//!     q̂ = W^k_hᵀ q_h;  o_h = W^v_h Σ_{s ∈ Sel(t)} softmax_s(q̂·c_s / √dn) c_s
//! out = o_proj(o)
//! Indexer (full layers): kI = LN(x·Wkᵀ), zI = x·Gᵀ per token; pool p (tokens p·m .. p·m+m−1,
//!     complete pools only) has key Σ_j softmax_j(zI + ape[j]) ⊙ kI, per channel;
//!     score(t, p) = Σ_h wI[t,h]·relu(qI[t,h]·key_p/√dI), wI = x·Wwᵀ/√nI, qI = qr·WqIᵀ;
//!     Sel(t) = the tokens of the top min(kI/m, ⌊(t+1)/m⌋) visible pools (ties: the lower pool)
//!              ∪ the open pool's tail ⌊(t+1)/m⌋·m ..= t.
//! Shared layers reuse the previous layer's Sel.
//! ```
//!
//! The LayerNorm of the indexer keys is an RMSNorm of centred keys plus the bias: the centring
//! (subtracting the mean over the key's channels) is folded into the rows of `wk` at load.
//! The pools are scored and chosen, and their tokens listed, on the backend
//! ([`Backend::lightning_select`] with `expand`).

use super::*;
use vela_compute::LightningParams;

pub(super) struct Indexer<B: Backend> {
    pub wq: B::Weight,
    /// `wk` with its column means subtracted (the keys come out centred).
    pub wk: B::Weight,
    pub k_norm: B::Vector,
    pub k_bias: B::Vector,
    pub weights: B::Weight,
    pub gate: B::Weight,
    /// `[m·dI]` position bias of the pool softmax.
    pub ape: B::Vector,
}

pub(super) struct Mla<B: Backend> {
    pub q_a: B::Weight,
    pub q_norm: B::Vector,
    pub q_b: B::Weight,
    pub kv_a: B::Weight,
    pub kv_norm: B::Vector,
    /// W^k_hᵀ per head: `[nh·r, dn]` as nh experts of r rows.
    pub k_abs: B::Weight,
    /// W^v_h per head: `[nh·dv, r]` as nh experts of dv rows.
    pub v_abs: B::Weight,
    pub o: B::Weight,
    pub indexer: Option<Indexer<B>>,
}

impl<B: Backend> Glm5Model<B> {
    /// MLA on `XN` → `Y`; `ent`: the layer's latent rows (and the indexer's pooled keys).
    pub(super) fn mla(
        &self,
        st: &mut Glm5State<B>,
        a: &Mla<B>,
        ent: &[usize],
        il: usize,
        positions: &[u32],
    ) -> Result<()> {
        let be = &*self.backend;
        let c = &self.cfg;
        let n = positions.len();
        let (nh, dn, r) = (c.n_head, c.nope_dim, c.kv_rank);
        {
            let b = &mut st.bufs;
            {
                let [xn, qr] = pick2(b, XN, QR);
                be.matmul(&a.q_a, xn, n, qr);
                be.rms_norm_inplace(qr, &a.q_norm, n, c.q_rank, c.eps);
            }
            {
                let [qr, q] = pick2(b, QR, Q);
                be.matmul(&a.q_b, qr, n, q);
            }
            let [q, ql] = pick2(b, Q, QL);
            be.matmul_experts(&a.k_abs, r, q, true, &st.heads, n, nh, ql);
        }
        self.mla_cache(st, a, ent, positions)?;
        if let Some(ix) = &a.indexer {
            self.select(st, ix, ent[1], il, positions)?;
        }
        let b = &mut st.bufs;
        {
            let lat = st.extra.block_rows(ent[0])?;
            let [ql, ol] = pick2(b, QL, OL);
            let scale = (dn as f32).powf(-0.5);
            be.attention_selected(
                ql,
                lat,
                lat,
                &st.sel,
                &st.counts,
                n,
                c.max_selected(),
                (nh, 1, r),
                scale,
                ol,
            );
        }
        {
            let [ol, ov] = pick2(b, OL, OV);
            be.matmul_experts(&a.v_abs, c.v_dim, ol, true, &st.heads, n, nh, ov);
        }
        let [ov, y] = pick2(b, OV, Y);
        be.matmul(&a.o, ov, n, y);
        Ok(())
    }

    /// The indexer's choice for the queries at `positions` ([`Self::index_keys`] ran; `QR` holds
    /// the normalised q_a rows): each query's pools, then its tokens into `sel` / `counts`.
    fn select(
        &self,
        st: &mut Glm5State<B>,
        ix: &Indexer<B>,
        ent: usize,
        il: usize,
        positions: &[u32],
    ) -> Result<()> {
        let be = &*self.backend;
        let c = &self.cfg;
        let n = positions.len();
        let (ni, di, m) = (c.idx_heads, c.idx_dim, c.idx_pool);
        let b = &mut st.bufs;
        {
            let [xn, wi] = pick2(b, XN, WI);
            be.matmul(&ix.weights, xn, n, wi);
            be.scale(wi, n * ni, (ni as f32).powf(-0.5));
        }
        {
            let [qr, qi] = pick2(b, QR, QI);
            be.matmul(&ix.wq, qr, n, qi);
        }
        let blk = st.extra.blocks_mut(ent)?;
        // The chosen pools' tokens and the open pool's tail, in ascending order, straight into
        // the attention's selection (no read-back).
        let p = LightningParams {
            n_head: ni,
            head_dim: di,
            ratio: m,
            top_k: c.idx_pools(),
            scale: (di as f32).powf(-0.5),
            expand: true,
        };
        debug_assert_eq!(p.width(), c.max_selected());
        be.lightning_select(
            &b[QI],
            &b[WI],
            blk.rows,
            positions,
            &p,
            &mut st.sel,
            &mut st.counts,
        );
        if let Some(log) = &mut st.selections {
            let w = p.width();
            let (mut sel, mut cnt) = (vec![0u32; n * w], vec![0u32; n]);
            be.read_ids(&st.sel, &mut sel);
            be.read_ids(&st.counts, &mut cnt);
            for (t, &pos) in positions.iter().enumerate() {
                log.push((il, pos, sel[t * w..t * w + cnt[t] as usize].to_vec()));
            }
        }
        Ok(())
    }

    /// The cache rows of an MLA layer for the normalised inputs in `XN` at `positions`, without
    /// the attention: the latent rows and, with an indexer, its raw rows and completed pools.
    pub(super) fn mla_cache(
        &self,
        st: &mut Glm5State<B>,
        a: &Mla<B>,
        ent: &[usize],
        positions: &[u32],
    ) -> Result<()> {
        let be = &*self.backend;
        let (n, r) = (positions.len(), self.cfg.kv_rank);
        {
            let [xn, lat] = pick2(&mut st.bufs, XN, LAT);
            be.matmul(&a.kv_a, xn, n, lat);
            be.rms_norm_inplace(lat, &a.kv_norm, n, r, self.cfg.eps);
        }
        be.store_rows_at(
            &st.bufs[LAT],
            r,
            positions,
            0,
            st.extra.blocks_mut(ent[0])?.rows,
        );
        match &a.indexer {
            Some(ix) => self.index_keys(st, ix, ent[1], positions),
            None => Ok(()),
        }
    }

    /// The indexer's keys of a forward (inputs in `XN`): the raw `[key | gate]` rows into the
    /// ring and the pools they complete.
    fn index_keys(
        &self,
        st: &mut Glm5State<B>,
        ix: &Indexer<B>,
        ent: usize,
        positions: &[u32],
    ) -> Result<()> {
        let be = &*self.backend;
        let c = &self.cfg;
        let n = positions.len();
        let (di, m) = (c.idx_dim, c.idx_pool);
        let b = &mut st.bufs;
        {
            let [xn, ki, zi] = b.get_disjoint_mut([XN, KI, ZI]).expect("distinct");
            be.matmul_many(&[&ix.wk, &ix.gate], xn, n, &mut [ki, zi]);
            be.rms_norm_inplace(ki, &ix.k_norm, n, di, 1e-6);
            be.add_bias(ki, &ix.k_bias, n);
        }
        // Raw row [key | gate logits] of position p in ring slot p % slots (stored on the
        // device by position: a decode step's launches do not depend on it).
        {
            let [ki, zi, kz] = b.get_disjoint_mut([KI, ZI, KZ]).expect("distinct");
            for i in 0..n {
                be.copy_rows(ki, i, 1, di, kz, 2 * i);
                be.copy_rows(zi, i, 1, di, kz, 2 * i + 1);
            }
        }
        let blk = st.extra.blocks_mut(ent)?;
        let slots = blk.raw_slots;
        be.store_rows_at(&b[KZ], 2 * di, positions, slots, blk.raw);
        // The pools these rows complete.
        be.compress_pool_at(
            blk.raw,
            (slots, 2 * di),
            di,
            &ix.ape,
            (m, false),
            positions,
            &mut b[ENT],
            blk.rows,
        );
        Ok(())
    }
}
