//! Fuzz the GGUF reader: parsing arbitrary bytes must return `Ok` or a one-line error, never
//! panic; a file that parses must have every tensor's data in range and the first block of
//! every supported tensor type must dequantize.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vela_formats::gguf::GgufFile;
use vela_formats::quant::dequantize;

fuzz_target!(|data: &[u8]| {
    let g = match GgufFile::from_bytes(data.to_vec()) {
        Ok(g) => g,
        Err(e) => {
            // Names from the file are shown escaped: every error is one line.
            let m = format!("{e:#}");
            assert!(!m.contains('\n'), "multi-line error: {m:?}");
            return;
        }
    };
    let _ = g.architecture();
    for key in &g.key_order {
        let v = g.get(key).expect("key_order lists only present keys");
        let _ = (
            v.as_i64(),
            v.as_f64(),
            v.as_str(),
            v.as_bool(),
            v.as_array(),
        );
    }
    for t in &g.tensors {
        assert!(g.tensor(&t.name).is_some());
        let bytes = g.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.size);
        // Touch every byte (the reader hands out slices of the image without copying).
        std::hint::black_box(bytes.iter().fold(0u8, |a, &b| a ^ b));
        let (bs, ts) = (t.ty.block_size(), t.ty.type_size());
        if bytes.len() < ts {
            continue;
        }
        let mut out = vec![0f32; bs];
        let r = dequantize(t.ty, &bytes[..ts], &mut out);
        assert_eq!(r.is_ok(), t.ty.is_supported(), "{}: {r:?}", t.ty);
        let _ = (t.n_elements(), t.ne0(), t.n_rows());
    }
});
