//! Routed experts: the part every MoE block shares (Gemma 4, Qwen3 MoE, Qwen3.8 Flash Next,
//! DeepSeek V4, GLM 5.3): each token's choice of experts ([`Backend::route`], or
//! [`Backend::route_hash`] for hash-routed layers), the expert products straight from the 3-D
//! expert tensors ([`Backend::matmul_experts`]) and the weighted combine per token in ascending
//! expert order, the order HF's expert loops add in ([`Backend::scatter_add_rows`]). Everything
//! stays on the backend: no read-back, so a MoE decode step can run as one recorded graph. Each
//! architecture's block adds its own router input, shared experts, norms and scales around it.
//!
//! A layer's experts may instead stay in host memory ([`crate::placement`]): then the layer's
//! input rows, expert ids and weights cross to the host once, the CPU runs the same three
//! products and the combine in the same order with its own kernels, and the result crosses
//! back once. On a CPU model that is bit-identical to the device path; on a GPU it differs by
//! what the CPU's kernels round differently from the GPU's (the products' int8 activation
//! quantization; tests bound it).

use super::expert_cache::ExpertCache;
use super::expert_stream::{upload_experts, Prefill, StreamCosts, STREAM_STATS};
use crate::placement::HostExperts;
use anyhow::Result;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use vela_compute::cpu::{ops::CpuWeight, CpuBackend};
use vela_compute::{Activation, Backend, HostWeight, RouteParams};

/// The gate and up products of every expert: one fused 3-D tensor or two.
pub enum GateUp<B: Backend> {
    /// `[E·2I, H]`: expert e's gate rows, then its up rows (HF `experts.gate_up_proj`,
    /// llama.cpp `ffn_gate_up_exps`).
    Fused(B::Weight),
    /// `[E·I, H]` each (llama.cpp `ffn_gate_exps`, `ffn_up_exps`).
    Split(B::Weight, B::Weight),
}

/// Where a layer's expert tensors are.
enum Placed<B: Backend> {
    Device {
        gate_up: GateUp<B>,
        /// `[E·H, I]`.
        down: B::Weight,
    },
    Host(Box<HostPart<B>>),
}

/// A host-memory layer: its tensors as the CPU uses them, and its device cache.
struct HostPart<B: Backend> {
    cpu: Arc<CpuBackend>,
    gate_up: GateUp<CpuBackend>,
    down: CpuWeight,
    cache: Option<Mutex<ExpertCache<B>>>,
    n_expert: usize,
    /// One expert's bytes in each tensor (gate and up, or gate_up; then down).
    expert_bytes: Vec<u64>,
    prefill: Prefill,
    costs: Arc<Mutex<StreamCosts>>,
}

impl<B: Backend> HostPart<B> {
    fn gate_up_hosts(&self) -> Vec<&HostWeight> {
        match &self.gate_up {
            GateUp::Fused(g) => vec![g.host()],
            GateUp::Split(g, u) => vec![g.host(), u.host()],
        }
    }
}

/// Traffic of the host-memory experts (all layers of a process): rows and bytes each way.
pub struct HostTraffic {
    pub calls: AtomicU64,
    pub bytes_to_host: AtomicU64,
    pub bytes_to_device: AtomicU64,
}

/// Counters for `/metrics` and `vela bench`.
pub static HOST_TRAFFIC: HostTraffic = HostTraffic {
    calls: AtomicU64::new(0),
    bytes_to_host: AtomicU64::new(0),
    bytes_to_device: AtomicU64::new(0),
};

/// A layer's experts: gated FFNs of width `n_ff`.
pub struct Experts<B: Backend> {
    placed: Placed<B>,
    pub n_ff: usize,
    pub act: Activation,
}

/// A layer's expert tensors as stored: gate and up fused (`[E·2I, H]`) or apart, and down.
pub enum ExpertTensors<'a> {
    Fused(&'a HostWeight, &'a HostWeight),
    Split(&'a HostWeight, &'a HostWeight, &'a HostWeight),
}

/// A checkpoint's per-expert matrices stacked into the 3-D layout [`Experts::place`] takes:
/// `read(e)` gives expert e's `[gate, up, down]`; returns (`[E·2I, H]`, gate rows then up rows
/// per expert; `[E·H, I]`). The experts are read (decoded, converted or generated) on every
/// core: hundreds of matrices per layer.
pub fn stack_per_expert(
    name: &str,
    n_expert: usize,
    read: impl Fn(usize) -> Result<[HostWeight; 3]> + Sync,
) -> Result<(HostWeight, HostWeight)> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(n_expert)
        .max(1);
    let per = n_expert.div_ceil(threads);
    let read = &read;
    let parts: Vec<Result<Vec<[HostWeight; 3]>>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|t| sc.spawn(move || (t * per..((t + 1) * per).min(n_expert)).map(read).collect()))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(anyhow::anyhow!("{name}: an expert-loading thread panicked"))
                })
            })
            .collect()
    });
    let mut gu = Vec::with_capacity(2 * n_expert);
    let mut down = Vec::with_capacity(n_expert);
    for part in parts {
        for [g, u, d] in part? {
            gu.push(g);
            gu.push(u);
            down.push(d);
        }
    }
    Ok((
        crate::weights::stack(&format!("{name}.gate_up"), &gu)?,
        crate::weights::stack(&format!("{name}.down"), &down)?,
    ))
}

impl<B: Backend> Experts<B> {
    /// Experts whose tensors are already on the backend.
    pub fn on_device(gate_up: GateUp<B>, down: B::Weight, n_ff: usize, act: Activation) -> Self {
        Experts {
            placed: Placed::Device { gate_up, down },
            n_ff,
            act,
        }
    }

    /// Layer `layer`'s experts: in host memory when `host` lists the layer (used in place, not
    /// copied), else uploaded with `upload` (the loader's, which counts the bytes).
    pub fn place(
        layer: usize,
        host: Option<&HostExperts>,
        t: ExpertTensors,
        mut upload: impl FnMut(&HostWeight) -> Result<B::Weight>,
        n_ff: usize,
        act: Activation,
    ) -> Result<Self> {
        let placed = match host.filter(|h| h.has(layer)) {
            Some(h) => {
                let cpu = h.cpu.clone();
                let (gate_up, down, n_expert) = match t {
                    ExpertTensors::Fused(gu, d) => {
                        (GateUp::Fused(cpu.map_weight(gu)?), d, gu.rows / (2 * n_ff))
                    }
                    ExpertTensors::Split(g, u, d) => (
                        GateUp::Split(cpu.map_weight(g)?, cpu.map_weight(u)?),
                        d,
                        g.rows / n_ff,
                    ),
                };
                let down = cpu.map_weight(down)?;
                let per = |w: &CpuWeight| w.host().bytes().len() as u64 / n_expert.max(1) as u64;
                let mut expert_bytes: Vec<u64> = match &gate_up {
                    GateUp::Fused(g) => vec![per(g)],
                    GateUp::Split(g, u) => vec![per(g), per(u)],
                };
                expert_bytes.push(per(&down));
                let per_expert: u64 = expert_bytes.iter().sum();
                let cap = (h.cache_bytes / per_expert.max(1)) as usize;
                let cache = (cap > 0).then(|| Mutex::new(ExpertCache::new(cap, n_expert)));
                Placed::Host(Box::new(HostPart {
                    cpu,
                    gate_up,
                    down,
                    cache,
                    n_expert,
                    expert_bytes,
                    prefill: h.prefill,
                    costs: h.costs.clone(),
                }))
            }
            None => {
                let (gate_up, down) = match t {
                    ExpertTensors::Fused(gu, d) => (GateUp::Fused(upload(gu)?), d),
                    ExpertTensors::Split(g, u, d) => (GateUp::Split(upload(g)?, upload(u)?), d),
                };
                Placed::Device {
                    gate_up,
                    down: upload(down)?,
                }
            }
        };
        Ok(Experts { placed, n_ff, act })
    }

    /// Whether this layer's experts run on the host (its forward reads back: no graph).
    pub fn on_host(&self) -> bool {
        matches!(self.placed, Placed::Host(_))
    }
}

/// Per-sequence scratch of the routed experts, for up to `max_batch` tokens of `k` slots.
pub struct ExpertScratch<B: Backend> {
    /// `[n·k]` expert ids and weights ([`Backend::route`] writes them).
    pub ids: B::Ids,
    pub weights: B::Buf,
    /// The token of each slot (`s / k`), for the combine.
    token_of_slot: B::Ids,
    /// Gate+up products `[n·k, 2I]` (the up products when split), activations `[n·k, I]`,
    /// expert outputs `[n·k, H]`.
    gu: B::Buf,
    act: B::Buf,
    y: B::Buf,
    /// `[n, H]` zeros: the combine's starting value.
    zeros: B::Buf,
    k: usize,
    /// For host-memory layers with a device cache (made on first use): the slots' cache ids,
    /// and the CPU's rows with their slots.
    cached: Option<CachedScratch<B>>,
    /// Rows and width the scratch was made for.
    nb: usize,
    d: usize,
}

struct CachedScratch<B: Backend> {
    mapped: B::Ids,
    rows: B::Buf,
    idx: B::Ids,
}

impl<B: Backend> ExpertScratch<B> {
    /// Scratch for `k` experts per token of width `n_ff`, hidden size `d`.
    pub fn new(be: &B, k: usize, n_ff: usize, d: usize, max_batch: usize) -> Self {
        let nb = max_batch;
        let mut token_of_slot = be.alloc_ids(nb * k);
        let tos: Vec<u32> = (0..nb * k).map(|s| (s / k) as u32).collect();
        be.write_ids(&mut token_of_slot, &tos);
        let mut zeros = be.alloc(nb * d);
        be.write(&mut zeros, &vec![0f32; nb * d]);
        ExpertScratch {
            ids: be.alloc_ids(nb * k),
            weights: be.alloc(nb * k),
            token_of_slot,
            gu: be.alloc(nb * k * 2 * n_ff),
            act: be.alloc(nb * k * n_ff),
            y: be.alloc(nb * k * d),
            zeros,
            k,
            cached: None,
            nb,
            d,
        }
    }

    fn cached(&mut self, be: &B) -> &mut CachedScratch<B> {
        let (n, d) = (self.nb * self.k, self.d);
        self.cached.get_or_insert_with(|| CachedScratch {
            mapped: be.alloc_ids(n),
            rows: be.alloc(n * d),
            idx: be.alloc_ids(n),
        })
    }

    /// Route `n` tokens by their router `logits` (`[n, E]`) into `ids` / `weights`.
    pub fn route(
        &mut self,
        be: &B,
        logits: &B::Buf,
        n: usize,
        p: &RouteParams,
        bias: Option<&B::Vector>,
        expert_scale: Option<&B::Vector>,
    ) {
        debug_assert_eq!(p.k, self.k);
        be.route(
            logits,
            n,
            p,
            bias,
            expert_scale,
            &mut self.ids,
            &mut self.weights,
        );
    }
}

impl<B: Backend> Experts<B> {
    /// Replace the `n` rows of `x` (width `d`, the experts' input) by the sum over each token's
    /// routed slots of weight · expert(x row), with the routing already in `s`
    /// ([`ExpertScratch::route`]).
    pub fn forward(&self, be: &B, x: &mut B::Buf, n: usize, d: usize, s: &mut ExpertScratch<B>) {
        let (gate_up, down) = match &self.placed {
            Placed::Device { gate_up, down } => (gate_up, down),
            Placed::Host(h) => return self.forward_host(be, h, x, n, d, s),
        };
        let (k, i_n) = (s.k, self.n_ff);
        products(
            be,
            gate_up,
            down,
            (i_n, d, self.act),
            x,
            &s.ids,
            n,
            k,
            &mut s.gu,
            &mut s.act,
            &mut s.y,
        );
        // The sum from zero, slots in ascending expert order.
        be.copy_rows(&s.zeros, 0, n, d, x, 0);
        be.scatter_add_rows(x, &s.y, &s.token_of_slot, Some(&s.weights), n * k, d);
    }

    /// [`Self::forward`] with the experts in host memory: the expert ids cross to the host,
    /// and the batch runs where the measured costs say ([`super::expert_stream`]). Streamed:
    /// its experts cross to the device and the device runs the layer as if they lived there.
    /// Else the rows and weights cross to the host too. Without a device cache (or none of
    /// the slots in it) the CPU runs the same products and the combine in the same order and
    /// the rows cross back once. With cached slots, those multiply on the device (launched
    /// before the CPU starts, so both run at once), the CPU's rows cross back into their
    /// slots, and the device combines as usual.
    fn forward_host(
        &self,
        be: &B,
        h: &HostPart<B>,
        x: &mut B::Buf,
        n: usize,
        d: usize,
        s: &mut ExpertScratch<B>,
    ) {
        let (k, i_n) = (s.k, self.n_ff);
        let ns = n * k;
        let dims = (i_n, d, self.act);
        let mut ids = vec![0u32; ns];
        be.read_ids(&s.ids, &mut ids);
        let t = &HOST_TRAFFIC;
        t.calls.fetch_add(1, Ordering::Relaxed);
        t.bytes_to_host
            .fetch_add((4 * ns) as u64, Ordering::Relaxed);
        if self.forward_streamed(be, h, x, n, d, s, &ids) {
            return;
        }
        let mut hx = vec![0f32; n * d];
        let mut w = vec![0f32; ns];
        be.read(&s.weights, &mut w);
        be.read(x, &mut hx);
        t.bytes_to_host
            .fetch_add((4 * (n * d + ns)) as u64, Ordering::Relaxed);
        let mut guard = h
            .cache
            .as_ref()
            .map(|c| c.lock().unwrap_or_else(|e| e.into_inner()));
        let mapped = guard.as_deref_mut().and_then(|c| {
            let gu = h.gate_up_hosts();
            if let Err(e) = c.observe(&ids, n, &gu, h.down.host(), be) {
                static WARNED: AtomicBool = AtomicBool::new(false);
                if !WARNED.swap(true, Ordering::Relaxed) {
                    eprintln!("warning: the device cache of host-memory experts is off: {e:#}");
                }
                c.cap = 0;
                c.weights = None;
            }
            let (m, any_hit, _) = c.map(&ids);
            any_hit.then_some(m)
        });
        let (Some(mapped), Some(c)) = (mapped, guard.as_deref()) else {
            let t0 = Instant::now();
            let (mut gu, mut act, mut y) = (
                vec![0f32; ns * 2 * i_n],
                vec![0f32; ns * i_n],
                vec![0f32; ns * d],
            );
            products(
                &*h.cpu, &h.gate_up, &h.down, dims, &hx, &ids, n, k, &mut gu, &mut act, &mut y,
            );
            let tos: Vec<u32> = (0..ns).map(|j| (j / k) as u32).collect();
            hx.fill(0.0);
            h.cpu.scatter_add_rows(&mut hx, &y, &tos, Some(&w), ns, d);
            h.record_cpu(ns, t0);
            be.write(x, &hx);
            t.bytes_to_device
                .fetch_add((4 * n * d) as u64, Ordering::Relaxed);
            return;
        };
        let cw = c.weights.as_ref().expect("a hit means cached weights");
        let held = c.held();
        be.write_ids(&mut s.cached(be).mapped, &mapped);
        let cs = s.cached.as_ref().expect("made above");
        products(
            be,
            &cw.gate_up,
            &cw.down,
            dims,
            x,
            &cs.mapped,
            n,
            k,
            &mut s.gu,
            &mut s.act,
            &mut s.y,
        );
        // The slots the cache does not hold, each as a token of its own, on the CPU meanwhile.
        let miss: Vec<usize> = (0..ns).filter(|&j| mapped[j] as usize >= held).collect();
        if !miss.is_empty() {
            let t0 = Instant::now();
            let nm = miss.len();
            let xm: Vec<f32> = miss
                .iter()
                .flat_map(|&j| hx[(j / k) * d..(j / k + 1) * d].iter().copied())
                .collect();
            let mids: Vec<u32> = miss.iter().map(|&j| ids[j]).collect();
            let (mut gu, mut act, mut ym) = (
                vec![0f32; nm * 2 * i_n],
                vec![0f32; nm * i_n],
                vec![0f32; nm * d],
            );
            products(
                &*h.cpu, &h.gate_up, &h.down, dims, &xm, &mids, nm, 1, &mut gu, &mut act, &mut ym,
            );
            // Per slot of the batch (the cache's hits included), the size the choice looks up.
            h.record_cpu(ns, t0);
            let idx: Vec<u32> = miss.iter().map(|&j| j as u32).collect();
            let cs = s.cached.as_mut().expect("made above");
            be.write(&mut cs.rows, &ym);
            be.write_ids(&mut cs.idx, &idx);
            // Into the zero rows the device left for them.
            be.scatter_add_rows(&mut s.y, &cs.rows, &cs.idx, None, nm, d);
            t.bytes_to_device
                .fetch_add((4 * (nm * d + nm)) as u64, Ordering::Relaxed);
        }
        be.copy_rows(&s.zeros, 0, n, d, x, 0);
        be.scatter_add_rows(x, &s.y, &s.token_of_slot, Some(&s.weights), ns, d);
    }

    /// The batch of routed `ids` on the device with its experts copied there for it, when the
    /// measured costs choose that (the experts that `ids` route to, or all of them when that
    /// is most); false: the CPU is to run it.
    #[allow(clippy::too_many_arguments)]
    fn forward_streamed(
        &self,
        be: &B,
        h: &HostPart<B>,
        x: &mut B::Buf,
        n: usize,
        d: usize,
        s: &mut ExpertScratch<B>,
        ids: &[u32],
    ) -> bool {
        let ne = h.n_expert;
        let mut used: Vec<usize> = ids
            .iter()
            .map(|&e| e as usize)
            .filter(|&e| e < ne)
            .collect();
        used.sort_unstable();
        used.dedup();
        let whole = used.len() * 2 > ne;
        let count = if whole { ne } else { used.len() } as u64;
        let bytes = count * h.expert_bytes.iter().sum::<u64>();
        // At the peak the device holds the copies so far and the largest one's staging.
        let peak = bytes + count * h.expert_bytes.iter().max().copied().unwrap_or(0);
        let mut costs = h.costs.lock().unwrap_or_else(|e| e.into_inner());
        let free = if costs.off || h.prefill == Prefill::Cpu {
            None
        } else {
            be.memory_free()
        };
        if !costs.stream(h.prefill, ids.len(), peak, free) {
            return false;
        }
        let t0 = Instant::now();
        let subset = (!whole).then_some(&used[..]);
        let up = upload_experts::<B>(&h.gate_up_hosts(), h.down.host(), ne, subset, |w| {
            be.upload_weight(w)
        });
        let (gate_up, down, sent) = match up {
            Ok(v) => v,
            Err(e) => {
                eprintln!(
                    "warning: streaming host-memory experts to the device is off, the CPU runs \
                     every batch: {e:#}"
                );
                costs.off = true;
                return false;
            }
        };
        costs.record_stream(sent, t0.elapsed().as_secs_f64());
        drop(costs);
        STREAM_STATS.batches.fetch_add(1, Ordering::Relaxed);
        STREAM_STATS.bytes.fetch_add(sent, Ordering::Relaxed);
        if !whole {
            let slot: Vec<u32> = ids
                .iter()
                .map(|&e| {
                    used.binary_search(&(e as usize))
                        .map_or(used.len() as u32, |p| p as u32)
                })
                .collect();
            be.write_ids(&mut s.cached(be).mapped, &slot);
        }
        let ids_buf = match &s.cached {
            Some(cs) if !whole => &cs.mapped,
            _ => &s.ids,
        };
        let (k, i_n) = (s.k, self.n_ff);
        products(
            be,
            &gate_up,
            &down,
            (i_n, d, self.act),
            x,
            ids_buf,
            n,
            k,
            &mut s.gu,
            &mut s.act,
            &mut s.y,
        );
        be.copy_rows(&s.zeros, 0, n, d, x, 0);
        be.scatter_add_rows(x, &s.y, &s.token_of_slot, Some(&s.weights), n * k, d);
        true
    }
}

impl<B: Backend> HostPart<B> {
    fn record_cpu(&self, slots: usize, t0: Instant) {
        let secs = t0.elapsed().as_secs_f64();
        self.costs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record_cpu(slots, secs);
    }
}

/// The three expert products of `n` tokens' `k` slots on backend `be`: gate and up (fused or
/// apart) into `gu` / `act`, the activation into `act`, down into `y`. `dims`: (I, H, act).
#[allow(clippy::too_many_arguments)]
fn products<C: Backend>(
    be: &C,
    gate_up: &GateUp<C>,
    down: &C::Weight,
    dims: (usize, usize, Activation),
    x: &C::Buf,
    ids: &C::Ids,
    n: usize,
    k: usize,
    gu: &mut C::Buf,
    act: &mut C::Buf,
    y: &mut C::Buf,
) {
    let (i_n, d, f) = dims;
    match gate_up {
        GateUp::Fused(w) => {
            be.matmul_experts(w, 2 * i_n, x, false, ids, n, k, gu);
            be.act_mul_split(gu, n * k, i_n, f, act);
        }
        GateUp::Split(wg, wu) => {
            be.matmul_experts(wg, i_n, x, false, ids, n, k, act);
            be.matmul_experts(wu, i_n, x, false, ids, n, k, gu);
            be.act_mul(act, gu, n * k * i_n, f);
        }
    }
    be.matmul_experts(down, d, act, true, ids, n, k, y);
}
