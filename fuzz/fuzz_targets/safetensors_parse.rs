//! Fuzz the safetensors header reader and the decoders of DeepSeek V4's microscaled storage:
//! parsing arbitrary bytes returns `Ok` or an error, never panics; every tensor of a file that
//! parses lies within it and decodes to as many values as its shape says; a `.weight`/`.scale`
//! pair of FP8 or MXFP4 bytes decodes or fails cleanly whatever its shapes, and where MXFP4
//! becomes Q8_0 blocks those hold exactly the decoded values.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vela_formats::quant::{dequantize, fp8, GgmlType};
use vela_formats::safetensors::{bytes_to_f32, parse_header, Dtype};

fuzz_target!(|data: &[u8]| {
    let Ok((tensors, _metadata)) = parse_header(data) else {
        return;
    };
    for (name, e) in &tensors {
        assert!(e.start <= e.end && e.end <= data.len(), "{name}: out of the file");
        let b = &data[e.start..e.end];
        assert_eq!(b.len(), e.n_elements() * e.dtype.size(), "{name}");
        assert_eq!(bytes_to_f32(e.dtype, b).len(), e.n_elements(), "{name}");
        if e.shape.len() != 2 {
            continue;
        }
        let stem = name.strip_suffix(".weight").unwrap_or(name);
        let Some(s) = tensors.get(&format!("{stem}.scale")) else {
            continue;
        };
        let sb = &data[s.start..s.end];
        let (rows, cols) = (e.shape[0], e.shape[1]);
        match e.dtype {
            Dtype::F8E4M3 => {
                let _ = fp8::dequant_fp8(b, rows, cols, sb);
            }
            Dtype::I8 => {
                let cols = cols * 2;
                let f = fp8::dequant_mxfp4(b, rows, cols, sb);
                if let Ok(Some(q)) = fp8::mxfp4_to_q8_0(b, rows, cols, sb) {
                    let want = f.expect("the f32 decoding accepts what Q8_0 accepted");
                    let mut got = vec![0f32; rows * cols];
                    dequantize(GgmlType::Q8_0, &q, &mut got).expect("whole Q8_0 blocks");
                    assert!(got == want, "{name}: MXFP4 as Q8_0 is not exact");
                }
            }
            _ => {}
        }
    }
});
