//! The HTTP(S) client: `ureq` over rustls.
//!
//! Trust roots: the system CA bundle (`$SSL_CERT_FILE`, else the usual Debian/RedHat/Alpine
//! paths) when one is found, so that TLS-intercepting corporate proxies whose CA is installed
//! locally work; Mozilla's bundled roots (`webpki-roots`) otherwise. Proxies come from the
//! standard `HTTPS_PROXY`/`HTTP_PROXY`/`ALL_PROXY`/`NO_PROXY` variables (ureq's default).

use std::io::{Read, Write};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use sha2::{Digest, Sha256};
use ureq::tls::{PemItem, RootCerts, TlsConfig};

const CA_BUNDLES: [&str; 5] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
];

fn system_roots() -> Option<RootCerts> {
    let from_env = std::env::var_os("SSL_CERT_FILE").map(std::path::PathBuf::from);
    let candidates = from_env
        .into_iter()
        .chain(CA_BUNDLES.iter().map(Into::into));
    for path in candidates {
        let Ok(pem) = std::fs::read(&path) else {
            continue;
        };
        let certs: Vec<_> = ureq::tls::parse_pem(&pem)
            .filter_map(|item| match item {
                Ok(PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        if !certs.is_empty() {
            return Some(RootCerts::new_with_certs(&certs));
        }
    }
    None
}

/// A configured HTTP agent.
pub(crate) struct Http {
    agent: ureq::Agent,
}

/// Outcome of streaming a response body.
pub(crate) struct Streamed {
    /// Bytes received.
    pub bytes: u64,
    /// SHA-256 of the bytes received.
    pub sha256: [u8; 32],
}

/// Whether an error is worth retrying (network trouble or a 5xx/429 answer).
pub(crate) fn is_transient(e: &anyhow::Error) -> bool {
    e.chain().any(|c| match c.downcast_ref::<ureq::Error>() {
        Some(ureq::Error::StatusCode(s)) => *s >= 500 || *s == 429,
        Some(_) => true,
        None => c
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error() != Some(28)),
    })
}

impl Http {
    pub(crate) fn new() -> Http {
        let roots = system_roots().unwrap_or(RootCerts::WebPki);
        let config = ureq::Agent::config_builder()
            .tls_config(TlsConfig::builder().root_certs(roots).build())
            .user_agent(format!(
                "vela/{} (+https://github.com/vela)",
                env!("CARGO_PKG_VERSION")
            ))
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            // A stalled transfer (no byte for 2 minutes) fails instead of hanging forever.
            .timeout_per_read(Some(Duration::from_secs(120)))
            .build();
        Http {
            agent: ureq::Agent::new_with_config(config),
        }
    }

    /// GET a JSON document. `Ok(None)` on 404.
    pub(crate) fn get_json(&self, url: &str) -> Result<Option<serde_json::Value>> {
        let resp = match self.agent.get(url).call() {
            Ok(r) => r,
            Err(ureq::Error::StatusCode(404)) => return Ok(None),
            Err(e) => return Err(anyhow!(e).context(format!("network error fetching {url}"))),
        };
        let body = resp
            .into_body()
            .with_config()
            .limit(64 << 20)
            .read_to_vec()
            .with_context(|| format!("network error reading {url}"))?;
        let v = serde_json::from_slice(&body).with_context(|| format!("bad JSON from {url}"))?;
        Ok(Some(v))
    }

    /// GET `url` and stream the body into `out`, hashing it and calling `on_bytes` per chunk.
    /// Write errors (e.g. disk full) are returned as `std::io::Error` in the chain.
    pub(crate) fn download(
        &self,
        url: &str,
        out: &mut dyn Write,
        on_bytes: &mut dyn FnMut(u64),
    ) -> Result<Streamed> {
        let resp = self
            .agent
            .get(url)
            .call()
            .with_context(|| format!("network error fetching {url}"))?;
        let content_length: Option<u64> = resp
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.trim().parse().ok());
        let mut reader = resp.into_body().into_reader();
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 256 << 10];
        let mut bytes = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(anyhow!(e)).with_context(|| {
                        format!("network error downloading {url} after {bytes} bytes")
                    })
                }
            };
            out.write_all(&buf[..n]).context("writing download")?;
            hasher.update(&buf[..n]);
            bytes += n as u64;
            on_bytes(n as u64);
        }
        if let Some(cl) = content_length {
            if cl != bytes {
                let eof = std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("connection closed after {bytes} of {cl} bytes"),
                );
                return Err(anyhow!(eof))
                    .with_context(|| format!("network error downloading {url}"));
            }
        }
        Ok(Streamed {
            bytes,
            sha256: hasher.finalize().into(),
        })
    }
}
