//! The overlap probe (`CudaBackend::overlap_probe`, docs/cuda.md "What is next"): what a
//! persistent decode kernel whose phases meet at counter edges could reach at the Qwen2.5-0.5B
//! and Llama-3-8B layer geometries, without and with weights copied ahead of each edge, and the
//! decomposition (the weight stream without the edges, the edges without the weights). Timing
//! only (RESULT lines, compared by hand with the real decode's µs per layer); it fails if a block
//! ever ran ahead of a producer.

use super::*;

#[test]
fn overlap_probe_decode_geometries() {
    let Some(g) = gpu() else { return };
    for (name, d, qkv, ff, layers) in [
        ("qwen2.5-0.5b", 896u32, 1152u32, 4864u32, 24u32),
        ("llama3-8b", 4096, 6144, 14336, 32),
    ] {
        // (threads, bytes ahead, flags): the whole layer, then without the edges (the weight
        // stream alone) and without the weight rows (the edges alone).
        let mut runs = Vec::new();
        for threads in [512u32, 1024] {
            for pf in [0u32, 32 << 10, 96 << 10] {
                runs.push((threads, pf, 0u32));
            }
        }
        runs.extend([
            (1024, 0, 1),
            (1024, 96 << 10, 1),
            (1024, 0, 2),
            (1024, 0, 5),
        ]);
        for (threads, pf, flags) in runs {
            let r = match g.overlap_probe(d, qkv, ff, layers, threads, pf, flags, 5) {
                Err(e) if e.to_string().contains("sm_80") => return,
                r => r.unwrap(),
            };
            let what = probe_what(flags);
            eprintln!(
                "RESULT | overlap probe {name} x{layers} {what} | {} blocks x {threads} threads | ahead {} KiB | {:.2} us per layer | {:.0} us per token | {:.0} GB/s | info |",
                r.blocks,
                pf >> 10,
                r.layer_us,
                r.layer_us * layers as f64,
                r.layer_bytes as f64 / (r.layer_us * 1e3)
            );
        }
    }
}

/// The stream probe (`CudaBackend::stream_probe`): the same layers with the weights streamed by
/// a producer warp through a shared-memory ring that runs ahead of the edges (the overlap probe
/// copied at most 96 KiB ahead, then loaded the rest after the edge with plain loads). Timing
/// only; fails if a wait timed out or a block ran ahead of a producer.
#[test]
fn stream_probe_decode_geometries() {
    let Some(g) = gpu() else { return };
    for (name, d, qkv, ff, layers) in [
        ("qwen2.5-0.5b", 896u32, 1152u32, 4864u32, 24u32),
        ("llama3-8b", 4096, 6144, 14336, 32),
    ] {
        // Up to 31 consumer warps (the producer is the 32nd); 5 = the ring's stream and the dot
        // products alone (no edges, no input pass).
        let mut runs = Vec::new();
        for consumers in [8u32, 16, 31] {
            runs.extend([(consumers, 0u32), (consumers, 1), (consumers, 5)]);
        }
        runs.extend([(31, 2), (31, 4)]);
        for (consumers, flags) in runs {
            let r = match g.stream_probe(d, qkv, ff, layers, consumers, flags, 5) {
                Err(e) if e.to_string().contains("sm_90") => return,
                r => r.unwrap(),
            };
            let what = probe_what(flags);
            eprintln!(
                "RESULT | stream probe {name} x{layers} {what} | {} blocks x {} threads | {:.2} us per layer | {:.0} us per token | {:.0} GB/s | info |",
                r.blocks,
                r.threads,
                r.layer_us,
                r.layer_us * layers as f64,
                r.layer_bytes as f64 / (r.layer_us * 1e3)
            );
        }
    }
}

/// The probes' `flags` in words.
fn probe_what(flags: u32) -> &'static str {
    match flags {
        0 => "layer",
        1 => "no edges",
        2 => "no weights",
        4 => "no input pass",
        5 => "stream only",
        _ => "other",
    }
}
