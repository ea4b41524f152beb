//! Reading an assistant checkpoint: llama.cpp tensor names for HF names, a small safetensors
//! reader that also takes the int64 `token_ordering` buffer, and the in-memory GGUF image the
//! weights are uploaded from.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use vela_formats::gguf::GgufFile;
use vela_formats::quant::GgmlType;

/// llama.cpp's GGUF name for an HF assistant tensor (`None`: not a weight we read).
pub(super) fn gguf_name(hf: &str) -> Option<String> {
    const TOP: &[(&str, &str)] = &[
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
        ("pre_projection.weight", "nextn.pre_projection.weight"),
        ("post_projection.weight", "nextn.post_projection.weight"),
        (
            "masked_embedding.centroids.weight",
            "masked_embd_centroids.weight",
        ),
    ];
    const LAYER: &[(&str, &str)] = &[
        ("input_layernorm.weight", "attn_norm.weight"),
        ("self_attn.q_proj.weight", "attn_q.weight"),
        ("self_attn.o_proj.weight", "attn_output.weight"),
        ("self_attn.q_norm.weight", "attn_q_norm.weight"),
        (
            "post_attention_layernorm.weight",
            "post_attention_norm.weight",
        ),
        ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
        ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
        ("mlp.gate_proj.weight", "ffn_gate.weight"),
        ("mlp.up_proj.weight", "ffn_up.weight"),
        ("mlp.down_proj.weight", "ffn_down.weight"),
        ("layer_scalar", "layer_output_scale.weight"),
    ];
    if let Some((_, g)) = TOP.iter().find(|(h, _)| *h == hf) {
        return Some(g.to_string());
    }
    let (il, rest) = hf.strip_prefix("model.layers.")?.split_once('.')?;
    let (_, g) = LAYER.iter().find(|(h, _)| *h == rest)?;
    Some(format!("blk.{il}.{g}"))
}

/// One tensor read from a safetensors file: dtype name, shape, little-endian bytes.
pub(super) type RawTensor = (String, Vec<usize>, Vec<u8>);

/// Read every tensor of `model.safetensors` (or the shards of `model.safetensors.index.json`) in
/// `dir`. The assistant is small, so a plain read is fine.
pub(super) fn read_safetensors(dir: &Path) -> Result<BTreeMap<String, RawTensor>> {
    let index = dir.join("model.safetensors.index.json");
    let files: Vec<PathBuf> = if index.is_file() {
        let j: Value = serde_json::from_str(&std::fs::read_to_string(&index)?)
            .with_context(|| format!("{} is not valid JSON", index.display()))?;
        let map = j
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| anyhow!("{}: no weight_map", index.display()))?;
        let mut f: Vec<String> = map
            .values()
            .filter_map(|v| v.as_str().map(String::from))
            .collect();
        f.sort();
        f.dedup();
        f.into_iter().map(|n| dir.join(n)).collect()
    } else {
        vec![dir.join("model.safetensors")]
    };
    let mut out = BTreeMap::new();
    for path in files {
        let buf =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        parse_safetensors(&buf, &mut out).with_context(|| format!("{}", path.display()))?;
    }
    Ok(out)
}

fn parse_safetensors(buf: &[u8], out: &mut BTreeMap<String, RawTensor>) -> Result<()> {
    if buf.len() < 8 {
        bail!("file shorter than the safetensors header length");
    }
    let n = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes")) as usize;
    if n > buf.len() - 8 {
        bail!("safetensors header length {n} exceeds the file");
    }
    let data = &buf[8 + n..];
    let j: Value = serde_json::from_slice(&buf[8..8 + n]).context("header is not valid JSON")?;
    let obj = j
        .as_object()
        .ok_or_else(|| anyhow!("header is not a JSON object"))?;
    for (name, v) in obj {
        if name == "__metadata__" {
            continue;
        }
        let dt = v.get("dtype").and_then(Value::as_str).unwrap_or("");
        let size = match dt {
            "F32" | "I32" => 4,
            "F16" | "BF16" => 2,
            "I64" => 8,
            _ => bail!("tensor '{name}': dtype '{dt}' is not supported"),
        };
        let shape: Vec<usize> = v
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect())
            .ok_or_else(|| anyhow!("tensor '{name}': bad shape"))?;
        let offs: Vec<usize> = v
            .get("data_offsets")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect())
            .ok_or_else(|| anyhow!("tensor '{name}': bad data_offsets"))?;
        let n_el = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| anyhow!("tensor '{name}': shape overflows"))?;
        if offs.len() != 2
            || offs[0] > offs[1]
            || offs[1] > data.len()
            || offs[1] - offs[0] != n_el * size
        {
            bail!("tensor '{name}': data_offsets {offs:?} do not fit {dt} {shape:?}");
        }
        out.insert(
            name.clone(),
            (dt.to_string(), shape, data[offs[0]..offs[1]].to_vec()),
        );
    }
    Ok(())
}

/// Build an in-memory GGUF image (no metadata) of float tensors, dimensions reversed into GGUF
/// order, so every backend takes them through [`HostWeight`].
pub(super) fn gguf_image(tensors: &[(String, Vec<usize>, GgmlType, &[u8])]) -> Result<GgufFile> {
    const ALIGN: usize = 32;
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    let mut off = 0u64;
    for (name, shape, ty, bytes) in tensors {
        let mut dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        if dims.is_empty() {
            dims.push(1);
        }
        out.extend_from_slice(&(name.len() as u64).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in &dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&ty.id().to_le_bytes());
        out.extend_from_slice(&off.to_le_bytes());
        off += bytes.len().div_ceil(ALIGN) as u64 * ALIGN as u64;
    }
    for (_, _, _, bytes) in tensors {
        out.resize(out.len().div_ceil(ALIGN) * ALIGN, 0);
        out.extend_from_slice(bytes);
    }
    out.resize(out.len().div_ceil(ALIGN) * ALIGN, 0);
    GgufFile::from_bytes(out).context("building the assistant's in-memory GGUF image")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_names_map_to_llama_cpp_names() {
        assert_eq!(
            gguf_name("model.layers.3.self_attn.q_proj.weight").as_deref(),
            Some("blk.3.attn_q.weight")
        );
        assert_eq!(
            gguf_name("pre_projection.weight").as_deref(),
            Some("nextn.pre_projection.weight")
        );
        assert_eq!(
            gguf_name("model.layers.0.layer_scalar").as_deref(),
            Some("blk.0.layer_output_scale.weight")
        );
        assert_eq!(gguf_name("masked_embedding.token_ordering"), None);
    }

    #[test]
    fn safetensors_reader_takes_int64_and_rejects_bad_offsets() {
        let build = |dt: &str, shape: &[usize], data: Vec<u8>| {
            let h = serde_json::json!({"t": {"dtype": dt, "shape": shape,
                "data_offsets": [0, data.len()]}})
            .to_string();
            let mut b = (h.len() as u64).to_le_bytes().to_vec();
            b.extend_from_slice(h.as_bytes());
            b.extend_from_slice(&data);
            b
        };
        let mut m = BTreeMap::new();
        let ok = build(
            "I64",
            &[2],
            [7i64, 9].iter().flat_map(|v| v.to_le_bytes()).collect(),
        );
        parse_safetensors(&ok, &mut m).unwrap();
        assert_eq!(m["t"].0, "I64");
        let bad = build("I64", &[3], vec![0; 16]);
        let e = parse_safetensors(&bad, &mut BTreeMap::new()).unwrap_err();
        assert!(e.to_string().contains("do not fit"), "{e}");
        let e = parse_safetensors(&build("U8", &[1], vec![0]), &mut m).unwrap_err();
        assert!(e.to_string().contains("not supported"), "{e}");
    }
}
