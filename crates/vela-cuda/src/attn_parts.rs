//! How many split-K parts the decode attention runs (attn.rs): the four-warp parts by the grid
//! and the cache's capacity, the one-warp parts following the keys seen, and the tensor-core
//! decode's non-empty parts. Pure functions of the shapes.

/// Most split-K parts (`attention_part*` blocks per query head) by default, and with head
/// dims above 256 (`attention_combine` merges at most 128).
const SPLIT_MAX_PARTS: usize = 32;
const SPLIT_MAX_PARTS_D512: usize = 128;

/// Keys per tile of the tensor-core decode attention (`FD_KEYS` in flash.cu).
pub(crate) const FD_KEYS: usize = 64;

/// Non-empty parts the tensor-core decode attention cuts `keys` keys into when the grid allows
/// `most` (flash.cu's `fd_parts`): tiles of `FD_KEYS`, each part at least `min_tiles` of them.
pub(crate) fn fd_parts_for(keys: usize, most: usize, min_tiles: usize) -> usize {
    let n_tiles = keys.div_ceil(FD_KEYS);
    let per = n_tiles.div_ceil(most.max(1)).max(min_tiles.max(1));
    n_tiles.div_ceil(per)
}

/// Keys the longest of the query rows at `positions` attends to (`window`: 0 for none).
pub(crate) fn keys_seen(positions: &[u32], window: usize) -> usize {
    let n = positions.iter().max().map_or(0, |&p| p as usize + 1);
    if window > 0 {
        n.min(window)
    } else {
        n
    }
}

/// Split-K parts of the non-tensor-core decode attention: enough (head, token, part) blocks for
/// two waves over ~132 SMs, at least one part per [`split_keys`] keys of `capacity`, at most
/// [`split_max_parts`] and one per chunk of [`split_chunk`] keys (head dim `hd`).
pub(crate) fn split_parts(d512: bool, blocks_per_part: usize, capacity: usize, hd: usize) -> usize {
    (264 / blocks_per_part.max(1))
        .max(capacity / split_keys(d512))
        .clamp(1, split_max_parts(d512))
        .min(capacity.div_ceil(split_chunk(hd)))
}

/// Parts of the warp parts (`attention_partw_*`) for `keys` keys seen: the shape's `base`, or,
/// when the keys fill more than one `chunk`-key chunk (`split_chunk`) per part, one part per
/// chunk in steps of 16 up to `most` (and the capacity's chunks). The count follows the
/// position in steps, so a decode captures a few graphs over a long generation (graph.rs keeps
/// 8), as at the tensor-core decode's threshold.
pub(crate) fn warp_parts_for(
    base: usize,
    keys: usize,
    capacity: usize,
    most: usize,
    chunk: usize,
) -> usize {
    let chunks = keys.div_ceil(chunk);
    if most <= base || chunks <= base {
        return base;
    }
    chunks
        .next_multiple_of(16)
        .min(most)
        .min(capacity.div_ceil(chunk))
        .max(base)
}

/// Keys per chunk of the split-K parts for head dim `hd` (`split_chunk` in attention.cu).
pub(crate) fn split_chunk(hd: usize) -> usize {
    if hd == 256 {
        16
    } else {
        32
    }
}

/// Most parts of the split-K attention: [`SPLIT_MAX_PARTS`], or [`SPLIT_MAX_PARTS_D512`] for
/// head dims above 256 (Gemma 4's full layers, see [`split_keys`]).
pub(crate) fn split_max_parts(d512: bool) -> usize {
    if d512 {
        SPLIT_MAX_PARTS_D512
    } else {
        SPLIT_MAX_PARTS
    }
}

/// Cache capacity per split-K part: 256 keys, 128 for head dims above 256. Llama-3-8B Q4_0 at 8K
/// keys: 153 tok/s with one part per 256 keys against 73 with parts from the grid size alone;
/// Gemma 4 12B at 8K: 200 vs 190 with one part per 128 keys up to 128 (docs/perf-log.md).
pub(crate) fn split_keys(d512: bool) -> usize {
    if d512 {
        128
    } else {
        256
    }
}

#[cfg(test)]
mod tests {
    use super::{fd_parts_for, split_parts};

    /// The non-tensor-core decode attention's parts: one per 256 keys of capacity up to 32, one
    /// per 128 keys up to 128 with head dims above 256 (measured on Gemma 4 12B at 8K).
    #[test]
    fn split_parts_by_capacity() {
        // Gemma 4 12B full layers (16 query heads, one token) at 8K depth + 128: 8,448 keys.
        assert_eq!(split_parts(false, 16, 8448, 128), 32);
        assert_eq!(split_parts(true, 16, 8448, 512), 66);
        assert_eq!(split_parts(true, 16, 32768, 512), 128);
        // Short caches: the grid term (264 / 16 blocks) and one part per 32 keys.
        assert_eq!(split_parts(true, 16, 1024, 512), 16);
        assert_eq!(split_parts(true, 16, 256, 512), 8);
        // Head dim 256 parts by chunks of 16 keys: twice as many in a short cache.
        assert_eq!(split_parts(false, 8, 256, 256), 16);
        assert_eq!(split_parts(false, 8, 256, 64), 8);
    }

    /// The warp parts' count: the shape's below one chunk per part, then one per 32-key chunk
    /// in steps of 16, capped by `most` and the capacity.
    #[test]
    fn warp_parts_follow_the_keys() {
        use super::warp_parts_for;
        assert_eq!(warp_parts_for(18, 1, 8192, 64, 32), 18);
        assert_eq!(warp_parts_for(18, 576, 8192, 64, 32), 18);
        assert_eq!(warp_parts_for(18, 577, 8192, 64, 32), 32);
        assert_eq!(warp_parts_for(18, 1152, 8192, 64, 32), 48);
        assert_eq!(warp_parts_for(18, 2048, 8192, 64, 32), 64);
        assert_eq!(warp_parts_for(18, 9000, 8192, 64, 32), 64);
        assert_eq!(warp_parts_for(29, 1000, 8192, 64, 32), 32);
        assert_eq!(warp_parts_for(18, 2048, 1200, 64, 32), 38);
        assert_eq!(warp_parts_for(18, 2048, 8192, 0, 32), 18);
        assert_eq!(warp_parts_for(32, 2048, 8192, 16, 32), 32);
        // 16-key chunks.
        assert_eq!(warp_parts_for(18, 640, 8192, 64, 16), 48);
    }

    /// The host's count of non-empty tensor-core decode parts follows flash.cu's `fd_parts`
    /// (n_tiles = (p - first + 64) / 64 for keys = p - first + 1; most = min(S, target)).
    #[test]
    fn fd_parts_for_matches_the_kernel() {
        let kernel = |keys: usize, most: usize, min_tiles: usize| {
            let (p, first) = (keys as i64 - 1, 0i64);
            let n_tiles = (p - first + 64) / 64;
            let most = most.max(1) as i64;
            let per = ((n_tiles + most - 1) / most).max(min_tiles as i64);
            ((n_tiles + per - 1) / per) as usize
        };
        for keys in [
            1usize, 63, 64, 65, 896, 897, 960, 1024, 1025, 1536, 4095, 8192, 8321,
        ] {
            for most in [1usize, 2, 5, 16, 33, 128] {
                for min_tiles in [1usize, 2, 4, 8] {
                    assert_eq!(
                        fd_parts_for(keys, most, min_tiles),
                        kernel(keys, most, min_tiles),
                        "keys {keys}, most {most}, min_tiles {min_tiles}"
                    );
                }
            }
        }
        // Llama-3-8B (8 KV heads, 33 parts) at 1,024 keys: 4 parts, 32 blocks; Qwen2.5-0.5B
        // (2 KV heads) at 1,024: 4 parts, 8 blocks.
        assert_eq!(fd_parts_for(1025, 33, 4), 5);
        assert_eq!(fd_parts_for(1024, 33, 4), 4);
    }
}
