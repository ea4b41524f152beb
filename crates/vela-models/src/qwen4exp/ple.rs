//! The n-gram embedding of Qwen3.8's PLE layers (docs/qwen4exp-spec.md §4.1-4.2): token
//! n-grams hashed into a table of prime-sized heads. The table stays in host memory where the
//! checkpoint maps it (51B parameters in the real model); only the rows a token needs are read.

use anyhow::{anyhow, bail, Result};
use vela_compute::HostWeight;
use vela_formats::quant::GgmlType;

/// One PLE layer's table and hash constants.
pub struct NgramTable {
    /// Row shards in order (HF's `ngram_embedding.shard_<p>`), each `rows_per_shard` rows.
    shards: Vec<HostWeight>,
    rows_per_shard: usize,
    /// A generated table instead (`vela_models::qwen4exp::synth`): its stream key, rows and the
    /// type its rows are rounded through.
    synthetic: Option<(u64, u64, GgmlType)>,
    /// Width of a head's row (`ple_embed_dim / heads`).
    pub width: usize,
    /// `layer_multipliers` (one per n-gram position), head sizes (primes) and offsets.
    mult: Vec<u64>,
    sizes: Vec<u64>,
    offsets: Vec<u64>,
    heads_per_ngram: usize,
}

impl NgramTable {
    pub fn new(
        shards: Vec<HostWeight>,
        mult: Vec<u64>,
        sizes: Vec<u64>,
        offsets: Vec<u64>,
        heads_per_ngram: usize,
    ) -> Result<Self> {
        let first = shards
            .first()
            .ok_or_else(|| anyhow!("PLE: no table shards"))?;
        let (rows, width) = (first.rows, first.cols);
        if shards.iter().any(|s| s.cols != width || s.ty != first.ty) {
            bail!("PLE: table shards differ in width or type");
        }
        // Any type a row dequantizes from: llama-quantize quantizes `per_layer_token_embd` like
        // `token_embd` (Q4_0 in a Q4_0 file).
        let mut probe = vec![0f32; width];
        first
            .row_range(0, 1, "ple row")
            .and_then(|r| vela_formats::quant::dequantize(r.ty, r.bytes(), &mut probe))
            .map_err(|e| anyhow!("PLE: table type {}: {e}", first.ty.name()))?;
        let total: usize = shards.iter().map(|s| s.rows).sum();
        if sizes.len() != offsets.len()
            || !sizes.len().is_multiple_of(heads_per_ngram)
            || mult.is_empty()
        {
            bail!("PLE: inconsistent hash constants");
        }
        let need = sizes
            .iter()
            .zip(&offsets)
            .map(|(s, o)| s + o)
            .max()
            .unwrap_or(0);
        if need as usize > total || sizes.contains(&0) {
            bail!("PLE: the table has {total} rows, the hash heads need {need}");
        }
        if shards[..shards.len() - 1].iter().any(|s| s.rows != rows) {
            bail!("PLE: table shards of unequal rows");
        }
        Ok(NgramTable {
            shards,
            rows_per_shard: rows,
            synthetic: None,
            width,
            mult,
            sizes,
            offsets,
            heads_per_ngram,
        })
    }

    /// A table of N(0, 1) rows generated from stream `key` (never materialised), as large as
    /// the hash heads need, each row rounded through type `ty` (as a file of that type holds it).
    pub fn synthetic(
        key: u64,
        width: usize,
        ty: GgmlType,
        mult: Vec<u64>,
        sizes: Vec<u64>,
        offsets: Vec<u64>,
        heads_per_ngram: usize,
    ) -> Result<Self> {
        if sizes.len() != offsets.len() || mult.is_empty() || width == 0 {
            bail!("PLE: inconsistent hash constants");
        }
        if ty.row_bytes(width as u64).is_none() {
            bail!("PLE: rows of {width} cannot be {}", ty.name());
        }
        let rows = sizes
            .iter()
            .zip(&offsets)
            .map(|(s, o)| s + o)
            .max()
            .unwrap_or(0);
        Ok(NgramTable {
            shards: Vec::new(),
            rows_per_shard: 1,
            synthetic: Some((key, rows, ty)),
            width,
            mult,
            sizes,
            offsets,
            heads_per_ngram,
        })
    }

    pub fn n_heads(&self) -> usize {
        self.sizes.len()
    }

    /// The table rows of the token at position `p` of history `h` (`h[..=p]` known):
    /// predecessors at or before the last EOS before `p`, or before the sequence, read as EOS.
    pub fn row_ids(&self, h: &[u32], p: usize, eos: u32, out: &mut Vec<u64>) {
        out.clear();
        let orders = self.mult.len();
        // sh(s): the token s places back, or EOS past the sequence start or the last EOS.
        let mut shifted = vec![eos as u64; orders];
        shifted[0] = h[p] as u64;
        for (s, v) in shifted.iter_mut().enumerate().skip(1) {
            if s > p {
                break;
            }
            let q = p - s;
            // Kept only if no EOS lies at q..p (an EOS at q reads as EOS anyway).
            if h[q..p].contains(&eos) {
                break;
            }
            *v = h[q] as u64;
        }
        for o in 2..=orders {
            let mix = shifted[..o]
                .iter()
                .zip(&self.mult)
                .fold(0u64, |m, (v, k)| m ^ v.wrapping_mul(*k));
            for j in (o - 2) * self.heads_per_ngram..(o - 1) * self.heads_per_ngram {
                out.push(mix % self.sizes[j] + self.offsets[j]);
            }
        }
    }

    /// Row `r` of the table as f32 into `out` (`width` values).
    pub fn row(&self, r: u64, out: &mut [f32]) -> Result<()> {
        if let Some((key, rows, ty)) = self.synthetic {
            if r >= rows {
                bail!("PLE: row {r} past the table");
            }
            for (j, x) in out.iter_mut().enumerate() {
                *x = crate::synth::normal(key, r * self.width as u64 + j as u64);
            }
            if ty != GgmlType::F32 {
                let mut q = vec![0u8; ty.row_bytes(out.len() as u64).unwrap_or(0) as usize];
                vela_formats::quant::quantize(ty, out, &mut q)?;
                vela_formats::quant::dequantize(ty, &q, out)?;
            }
            return Ok(());
        }
        let r = r as usize;
        let s = self
            .shards
            .get(r / self.rows_per_shard)
            .ok_or_else(|| anyhow!("PLE: row {r} past the table"))?;
        let i = r % self.rows_per_shard;
        let w = s.row_range(i, 1, "ple row")?;
        vela_formats::quant::dequantize(w.ty, w.bytes(), out)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hash constants only (the table rows are never read by `row_ids`).
    fn table(mult: Vec<u64>, sizes: Vec<u64>) -> NgramTable {
        let offsets = vec![0; sizes.len()];
        NgramTable {
            shards: Vec::new(),
            rows_per_shard: 1,
            synthetic: None,
            width: 1,
            mult,
            sizes,
            offsets,
            heads_per_ngram: 1,
        }
    }

    /// The constructor checks the table against the hash heads.
    #[test]
    fn table_checks() {
        let w = |rows: usize| {
            HostWeight::owned("t", GgmlType::F32, rows, 2, vec![0; rows * 8]).unwrap()
        };
        assert!(NgramTable::new(vec![w(10)], vec![1, 3], vec![4, 6], vec![0, 4], 1).is_ok());
        let e = NgramTable::new(vec![w(9)], vec![1, 3], vec![4, 6], vec![0, 4], 1)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("9 rows"), "{e}");
        assert!(NgramTable::new(vec![], vec![1], vec![4], vec![0], 1).is_err());
    }

    /// EOS handling: predecessors at or before the last EOS before p read as EOS; the EOS token
    /// itself still sees its predecessors.
    #[test]
    fn predecessors_stop_at_eos() {
        let t = table(vec![1, 1000, 1_000_000], vec![1 << 40, 1 << 40]);
        let eos = 9;
        let h = [1, 2, 9, 3, 4];
        let mut ids = Vec::new();
        // p = 3: its predecessor is the EOS (reads as EOS), the one before that too.
        t.row_ids(&h, 3, eos, &mut ids);
        assert_eq!(ids, [3 ^ (9 * 1000), 3 ^ (9 * 1000) ^ (9 * 1_000_000)]);
        // p = 2 (the EOS itself): sees 2 and 1.
        t.row_ids(&h, 2, eos, &mut ids);
        assert_eq!(ids, [9 ^ 2000, 9 ^ 2000 ^ 1_000_000]);
        // p = 0: everything before is EOS.
        t.row_ids(&h, 0, eos, &mut ids);
        assert_eq!(ids, [1 ^ 9000, 1 ^ 9000 ^ 9_000_000]);
    }
}
