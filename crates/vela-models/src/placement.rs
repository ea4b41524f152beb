//! Where a model's weights live: the placement of routed experts (`--experts`). Attention, the
//! dense weights and the sequence state stay on the model's backend; a MoE layer's routed
//! experts either go there too or stay in host memory, where the CPU multiplies them in place
//! (memory-mapped from the file, never repacked; [`crate::blocks::experts`]). The planner
//! decides per layer from the tensors' loaded sizes and the device's free memory; the loader
//! applies the plan through [`LoadSpec`].

pub use crate::blocks::expert_stream::{Prefill, StreamCosts};
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use vela_compute::cpu::CpuBackend;
use vela_formats::quant::GgmlType;

/// How a model is loaded: the load-time type of its float matrices ([`crate::weights`]) and
/// which layers' routed experts stay in host memory.
#[derive(Clone, Default)]
pub struct LoadSpec {
    pub quant: Option<GgmlType>,
    pub host_experts: Option<HostExperts>,
}

impl LoadSpec {
    pub fn quant(quant: Option<GgmlType>) -> LoadSpec {
        LoadSpec {
            quant,
            host_experts: None,
        }
    }
}

/// The layers whose routed experts the CPU runs from host memory, and the CPU backend that
/// runs them (its own thread pool, shared by those layers).
#[derive(Clone)]
pub struct HostExperts {
    pub cpu: Arc<CpuBackend>,
    /// Sorted layer indices.
    pub layers: Vec<usize>,
    /// Device memory per layer for its cache of the most used experts (0: no cache).
    pub cache_bytes: u64,
    /// Where a batch runs: the CPU or the device with its experts streamed, by measured cost
    /// ([`crate::blocks::expert_stream`]).
    pub prefill: Prefill,
    /// The costs those layers measure, shared.
    pub costs: Arc<Mutex<StreamCosts>>,
}

impl HostExperts {
    pub fn new(cpu: Arc<CpuBackend>, layers: Vec<usize>, cache_bytes: u64) -> HostExperts {
        HostExperts {
            cpu,
            layers,
            cache_bytes,
            prefill: Prefill::Measured,
            costs: Arc::default(),
        }
    }

    pub fn has(&self, layer: usize) -> bool {
        self.layers.binary_search(&layer).is_ok()
    }
}

/// `--experts`: where routed experts go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ExpertsMode {
    /// On the device while they fit its budget, layer by layer from the first; the rest on the
    /// host.
    #[default]
    Auto,
    /// All on the device.
    Gpu,
    /// All in host memory, run by the CPU.
    Cpu,
    /// The first N MoE layers' experts in host memory (llama.cpp's `--n-cpu-moe N`).
    HostFirst(usize),
}

impl FromStr for ExpertsMode {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<ExpertsMode> {
        Ok(match s {
            "auto" => ExpertsMode::Auto,
            "gpu" | "device" => ExpertsMode::Gpu,
            "cpu" | "host" => ExpertsMode::Cpu,
            _ => match s.parse() {
                Ok(n) => ExpertsMode::HostFirst(n),
                Err(_) => bail!("bad --experts '{s}': gpu, cpu, auto, or a number of layers"),
            },
        })
    }
}

/// The layer of a routed-expert tensor, by name: llama.cpp's `blk.L.ffn_{gate,up,down,
/// gate_up}_exps.*` and the checkpoints' `layers.L.….experts.…` (shared experts are dense).
pub fn expert_layer(name: &str) -> Option<usize> {
    let after = |prefix: &str| -> Option<usize> {
        let i = name.find(prefix)? + prefix.len();
        let rest = &name[i..];
        let end = rest.find('.').unwrap_or(rest.len());
        rest[..end].parse().ok()
    };
    if name.starts_with("blk.") && name.contains("_exps") {
        return after("blk.");
    }
    if name.contains(".experts.") || name.ends_with(".experts") {
        return after("layers.");
    }
    None
}

/// A model's loaded weight bytes: each MoE layer's routed experts and everything else.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sizes {
    pub experts: BTreeMap<usize, u64>,
    pub dense: u64,
}

impl Sizes {
    /// From `(tensor name, loaded bytes)` pairs.
    pub fn from_tensors<'a>(tensors: impl Iterator<Item = (&'a str, u64)>) -> Sizes {
        let mut s = Sizes::default();
        for (name, bytes) in tensors {
            match expert_layer(name) {
                Some(l) => *s.experts.entry(l).or_default() += bytes,
                None => s.dense += bytes,
            }
        }
        s
    }

    pub fn total(&self) -> u64 {
        self.dense + self.experts.values().sum::<u64>()
    }
}

/// The planner's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Layers whose experts stay in host memory (sorted).
    pub host_layers: Vec<usize>,
    /// Bytes on the device (dense + device experts) and in host memory (host experts).
    pub device_bytes: u64,
    pub host_bytes: u64,
    /// What the plan had to work with: the device budget for weights (None: not known).
    pub budget: Option<u64>,
    pub mode: ExpertsMode,
    /// Device memory per host layer for its cache of the most used experts: what the budget
    /// leaves, shared by the host layers.
    pub cache_bytes: u64,
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// Place the experts of `sizes` for `mode` with `budget` bytes of device memory for weights
/// (free memory less the reserve for state and scratch; `None`: unknown, then `auto` keeps all
/// on the device as before placement existed). An error when even the dense weights alone do
/// not fit the budget.
pub fn plan(sizes: &Sizes, mode: ExpertsMode, budget: Option<u64>) -> Result<Plan> {
    let layers: Vec<usize> = sizes.experts.keys().copied().collect();
    let host_layers: Vec<usize> = match mode {
        ExpertsMode::Gpu => Vec::new(),
        ExpertsMode::Cpu => layers.clone(),
        ExpertsMode::HostFirst(n) => layers.iter().copied().take(n).collect(),
        ExpertsMode::Auto => match budget {
            None => Vec::new(),
            Some(b) => {
                // Device layers from the first while they fit; once one does not, it and every
                // later layer stay on the host (llama.cpp's `--n-cpu-moe` keeps a prefix on the
                // CPU instead; which end does not change the bytes, only where the CPU waits).
                let mut used = sizes.dense;
                let mut host = Vec::new();
                for (&l, &bytes) in &sizes.experts {
                    if host.is_empty() && used + bytes <= b {
                        used += bytes;
                    } else {
                        host.push(l);
                    }
                }
                host
            }
        },
    };
    let host_bytes: u64 = host_layers.iter().map(|l| sizes.experts[l]).sum();
    let device_bytes = sizes.total() - host_bytes;
    if let Some(b) = budget {
        if device_bytes > b {
            if mode == ExpertsMode::Gpu || sizes.experts.is_empty() {
                bail!(
                    "the model's weights need {} on the device but its budget is {}{}",
                    gib(device_bytes),
                    gib(b),
                    if sizes.experts.is_empty() {
                        ""
                    } else {
                        " (--experts auto or cpu keeps routed experts in host memory)"
                    }
                );
            }
            bail!(
                "even with {} of routed experts in host memory the device needs {} for the \
                 rest, more than its budget of {}",
                gib(host_bytes),
                gib(device_bytes),
                gib(b)
            );
        }
    }
    let cache_bytes = match budget {
        Some(b) if !host_layers.is_empty() => (b - device_bytes) / host_layers.len() as u64,
        _ => 0,
    };
    Ok(Plan {
        host_layers,
        device_bytes,
        host_bytes,
        budget,
        mode,
        cache_bytes,
    })
}

impl Plan {
    /// The plan as printed at start and by `vela plan`; `gpu`: the model's backend is a GPU
    /// (else the CPU, where "on the device" means repacked and "host" used in place).
    pub fn describe(&self, sizes: &Sizes, gpu: bool) -> String {
        let mut s = String::new();
        let n = sizes.experts.len();
        let (dev, host) = if gpu {
            ("on the GPU", "in host memory, run by the CPU")
        } else {
            ("repacked", "used in place from the file")
        };
        let _ = writeln!(
            s,
            "experts placement ({:?}): dense weights {}; routed experts of {} MoE layers: {} {dev}, {} {host}",
            self.mode,
            gib(sizes.dense),
            n,
            n - self.host_layers.len(),
            self.host_layers.len()
        );
        let _ = write!(
            s,
            "  {} {dev} (budget {}), {} {host}",
            gib(self.device_bytes),
            self.budget.map_or("not set".into(), gib),
            gib(self.host_bytes)
        );
        if !self.host_layers.is_empty() {
            let _ = write!(s, "; host layers {}", ranges(&self.host_layers));
        }
        if self.cache_bytes > 0 {
            let _ = write!(
                s,
                "; GPU cache of the most used experts {} per host layer",
                gib(self.cache_bytes)
            );
        }
        s
    }
}

/// `0-3,7,9-10`.
fn ranges(v: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_tensors_by_name() {
        assert_eq!(expert_layer("blk.3.ffn_gate_exps.weight"), Some(3));
        assert_eq!(expert_layer("blk.12.ffn_gate_up_exps.weight"), Some(12));
        assert_eq!(expert_layer("blk.3.ffn_gate_shexp.weight"), None);
        assert_eq!(expert_layer("blk.3.ffn_gate_inp.weight"), None);
        assert_eq!(
            expert_layer("model.language_model.layers.5.experts.gate_up_proj"),
            Some(5)
        );
        assert_eq!(expert_layer("layers.7.ffn.experts.31.w2.weight"), Some(7));
        assert_eq!(
            expert_layer("model.layers.2.mlp.experts.0.down_proj.weight"),
            Some(2)
        );
        assert_eq!(
            expert_layer("model.layers.2.mlp.shared_expert.down_proj.weight"),
            None
        );
        assert_eq!(expert_layer("layers.7.ffn.shared_experts.w2.weight"), None);
        assert_eq!(expert_layer("mtp.0.ffn.experts.3.w1.weight"), None);
    }

    fn sizes() -> Sizes {
        Sizes::from_tensors(
            [
                ("token_embd.weight", 100),
                ("blk.0.ffn_gate_exps.weight", 40),
                ("blk.0.ffn_down_exps.weight", 20),
                ("blk.1.ffn_gate_up_exps.weight", 60),
                ("blk.2.ffn_gate_up_exps.weight", 60),
                ("blk.2.attn_q.weight", 10),
            ]
            .into_iter(),
        )
    }

    #[test]
    fn plans() {
        let s = sizes();
        assert_eq!(s.dense, 110);
        assert_eq!(s.experts.values().sum::<u64>(), 180);
        let p = plan(&s, ExpertsMode::Auto, Some(240)).unwrap();
        assert_eq!(p.host_layers, vec![2]);
        assert_eq!((p.device_bytes, p.host_bytes), (230, 60));
        assert_eq!(p.cache_bytes, 10);
        // Once a layer goes to the host, so do the later ones (no gaps filled by smaller ones).
        let p = plan(&s, ExpertsMode::Auto, Some(200)).unwrap();
        assert_eq!(p.host_layers, vec![1, 2]);
        assert_eq!(p.cache_bytes, 15);
        assert_eq!(
            plan(&s, ExpertsMode::Auto, None).unwrap().host_layers,
            Vec::<usize>::new()
        );
        assert_eq!(
            plan(&s, ExpertsMode::Cpu, Some(110)).unwrap().host_layers,
            vec![0, 1, 2]
        );
        assert_eq!(
            plan(&s, ExpertsMode::HostFirst(2), None)
                .unwrap()
                .host_layers,
            vec![0, 1]
        );
        let e = plan(&s, ExpertsMode::Gpu, Some(200))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--experts auto or cpu"), "{e}");
        let e = plan(&s, ExpertsMode::Auto, Some(100))
            .unwrap_err()
            .to_string();
        assert!(e.contains("even with"), "{e}");
        let d = plan(&s, ExpertsMode::Auto, Some(240))
            .unwrap()
            .describe(&s, true);
        assert!(d.contains("host layers 2"), "{d}");
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
    }

    #[test]
    fn modes_parse() {
        assert_eq!("auto".parse::<ExpertsMode>().unwrap(), ExpertsMode::Auto);
        assert_eq!("gpu".parse::<ExpertsMode>().unwrap(), ExpertsMode::Gpu);
        assert_eq!("cpu".parse::<ExpertsMode>().unwrap(), ExpertsMode::Cpu);
        assert_eq!(
            "12".parse::<ExpertsMode>().unwrap(),
            ExpertsMode::HostFirst(12)
        );
        assert!("most".parse::<ExpertsMode>().is_err());
    }
}
