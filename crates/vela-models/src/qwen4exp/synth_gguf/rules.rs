//! The type and metadata rules of llama.cpp 0c1e570 that `super` follows: the converter's tensor
//! types at a float `--outtype`, llama-quantize's per-tensor choice (`llama-quant.cpp`:
//! `tensor_allows_quantization`, `llama_tensor_get_type_impl`, `tensor_type_fallback`), gguf-py's
//! size label, and the synthetic vocabulary.

use crate::synth::{fallback, QuantScheme};
use vela_formats::gguf::Value;
use vela_formats::quant::GgmlType;

/// `use_more_bits` of llama-quantize (which layers the `_M` mixtures give more bits).
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i as i64 - (n / 8) as i64) % 3 == 2
}

/// The type the converter at `--outtype ty` (a float type) gives a tensor.
pub(super) fn converter_type(name: &str, dims: &[u64], ty: GgmlType) -> GgmlType {
    let forced = name.ends_with("_norm.weight")
        || name.ends_with(".ffn_gate_inp.weight")
        || name.ends_with(".ffn_gate_inp_shexp.weight")
        || name.ends_with(".ssm_conv1d.weight")
        || !name.ends_with(".weight");
    if dims.len() <= 1 || forced {
        GgmlType::F32
    } else {
        ty
    }
}

/// llama-quantize's choice for every tensor of an F32 `qwen4exp` file (in its order) under
/// `scheme`.
pub(super) fn quantize_types(
    list: &[(&str, &[u64])],
    scheme: QuantScheme,
    n_layer: usize,
    n_expert: usize,
) -> Vec<GgmlType> {
    let kept = [
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ssm_conv1d",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
    ];
    quantize_types_with(list, scheme, (n_layer, n_expert), &kept, &[])
}

/// llama-quantize's choice for every tensor of an F32 file (in its order) under `scheme`, for
/// an architecture whose tensors containing a `kept` name stay F32 and those containing a
/// `q8` name become Q8_0. `(n_layer, n_expert)`: the file's blocks and experts.
pub(crate) fn quantize_types_with(
    list: &[(&str, &[u64])],
    scheme: QuantScheme,
    (n_layer, n_expert): (usize, usize),
    kept: &[&str],
    q8: &[&str],
) -> Vec<GgmlType> {
    use GgmlType::*;
    let base = scheme.base();
    let (q4ks, mixture) = (
        scheme == QuantScheme::Mostly(Q4_K),
        matches!(scheme, QuantScheme::Q4KM | QuantScheme::Q5KM),
    );
    let n_wv = list
        .iter()
        .filter(|(n, _)| n.contains("attn_qkv.weight") || n.contains("attn_v.weight"))
        .count();
    let mut i_wv = 0;
    let layer = |n: &str| -> usize {
        n.strip_prefix("blk.")
            .and_then(|s| s.split('.').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    list.iter()
        .map(|&(n, dims)| {
            // ggml_n_dims: trailing dimensions of 1 do not count.
            let n_dims = dims.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
            if n_dims < 2 || !n.ends_with("weight") || kept.iter().any(|k| n.contains(k)) {
                return F32;
            }
            let ne0 = dims[0] as usize;
            let mut t = base;
            if q8.iter().any(|k| n.contains(k)) {
                t = Q8_0;
            } else if n == "output.weight" {
                t = if !ne0.is_multiple_of(base.block_size()) || base == Q8_0 {
                    Q8_0
                } else {
                    Q6_K
                };
            } else if n == "token_embd.weight" || n == "per_layer_token_embd.weight" {
            } else if n.contains("attn_qkv.weight") || n.contains("attn_v.weight") {
                if mixture && use_more_bits(i_wv, n_wv) {
                    t = Q6_K;
                } else if q4ks && i_wv < 4 {
                    t = Q5_K;
                }
                if n_expert == 8 {
                    t = Q8_0;
                }
                i_wv += 1;
            } else if n.contains("attn_k.weight") {
                if n_expert == 8 {
                    t = Q8_0;
                }
            } else if n.contains("ffn_down") {
                let i = layer(n);
                if mixture && use_more_bits(i, n_layer) {
                    t = Q6_K;
                } else if q4ks && i < n_layer / 8 {
                    t = Q5_K;
                }
            } else if n.contains("attn_output.weight")
                && n_expert == 8
                && matches!(scheme, QuantScheme::Mostly(Q4_K) | QuantScheme::Q4KM)
            {
                t = Q5_K;
            }
            fallback(t, ne0)
        })
        .collect()
}

/// `model_weight_count_rounded_notation` of gguf-py.
fn rounded(n: u64) -> String {
    let (scale, suffix) = match n as f64 {
        x if x > 1e12 => (1e-12, "T"),
        x if x > 1e9 => (1e-9, "B"),
        x if x > 1e6 => (1e-6, "M"),
        _ => (1e-3, "K"),
    };
    let x = n as f64 * scale;
    let digits = format!("{}", x.round_ties_even() as u64)
        .trim_start_matches('0')
        .len();
    format!("{x:.*}{suffix}", 2usize.saturating_sub(digits))
}

/// `general.size_label` as the converter computes it (experts × per-expert plus shared) from the
/// tensors' names and shapes.
pub(crate) fn size_label<'a>(tensors: impl Iterator<Item = (&'a str, &'a [u64])>) -> String {
    let (mut shared, mut expert, mut count, mut n) = (0u64, 0u64, 0u64, 0u64);
    for (name, dims) in tensors {
        let size: u64 = dims.iter().product();
        if name.contains("_exps.") && dims.len() >= 3 {
            expert += size / dims[2];
            count += dims[2];
            n += 1;
        } else {
            shared += size;
        }
    }
    match count.checked_div(n) {
        Some(e) => format!("{e}x{}", rounded(shared + expert)),
        None => rounded(shared),
    }
}

/// The synthetic vocabulary: `<t{i}>` tokens, the one-entry merges list llama.cpp's BPE loader
/// needs, EOS.
pub(super) fn synthetic_tokenizer(n_vocab: usize, eos: u32) -> Vec<(String, Value)> {
    let s = |x: &str| Value::String(x.into());
    vec![
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("qwen35")),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array((0..n_vocab).map(|i| s(&format!("<t{i}>"))).collect()),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(vec![Value::I32(1); n_vocab]),
        ),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(vec![s("<t0> <t1>")]),
        ),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(eos)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_labels_round_as_gguf_py() {
        assert_eq!(rounded(991_000), "991K");
        assert_eq!(rounded(1_540_000), "1.5M");
        assert_eq!(rounded(31_700_000_000), "32B");
        assert_eq!(rounded(9_400_000), "9.4M");
    }

    #[test]
    fn llama_quantize_rules() {
        use GgmlType::*;
        let d = |a: &[u64]| a.to_vec();
        let names = [
            ("output.weight", d(&[2560, 1000])),
            ("token_embd.weight", d(&[2560, 1000])),
            ("blk.0.attn_qkv.weight", d(&[2560, 10240])),
            ("blk.0.ffn_down_exps.weight", d(&[640, 2560, 512])),
            ("blk.0.ffn_gate_inp.weight", d(&[2560, 512])),
            ("blk.0.ffn_gate_inp_shexp.weight", d(&[2560, 1])),
            ("blk.0.ssm_conv1d.weight", d(&[4, 10240])),
            ("blk.0.ple_conv1d.weight", d(&[4, 10240])),
            ("blk.0.hc_attn_up.weight", d(&[320, 10240])),
            ("blk.3.indexer.q_proj.weight", d(&[2560, 512])),
            ("per_layer_token_embd.weight", d(&[160, 1000])),
        ];
        let list: Vec<(&str, &[u64])> = names.iter().map(|(n, d)| (*n, d.as_slice())).collect();
        let t = quantize_types(&list, QuantScheme::Mostly(Q4_0), 12, 512);
        assert_eq!(
            t,
            [Q6_K, Q4_0, Q4_0, Q4_0, F32, F32, F32, F16, Q4_0, F32, Q4_0]
        );
        let t = quantize_types(&list, QuantScheme::Q4KM, 12, 512);
        // ffn_down of a more-bits layer: Q6_K, whose 256-blocks do not fit 640 columns → Q8_0.
        assert_eq!(t[..4], [Q6_K, Q4_K, Q6_K, Q8_0]);
        assert_eq!(t[8], Q5_0); // 320 is not a multiple of 256
        assert_eq!(t[10], Q5_0);
        // Eight experts: attn_qkv to Q8_0.
        let t = quantize_types(&list, QuantScheme::Mostly(Q4_0), 12, 8);
        assert_eq!(t[2], Q8_0);
    }
}
