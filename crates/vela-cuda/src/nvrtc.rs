//! A minimal run-time loader for NVRTC (the CUDA run-time compiler), independent of the driver.
//!
//! Only the handful of entry points vela needs are resolved, with `dlopen`, from the first
//! library found in this order: `$VELA_NVRTC_LIB` (a full path), then the sonames
//! `libnvrtc.so`, `libnvrtc.so.13`, `libnvrtc.so.12`, `libnvrtc.so.11.2` on the loader's search
//! path, then the same names under `$CUDA_HOME/lib64`, `/usr/local/cuda/lib64` and
//! `/usr/local/cuda/targets/x86_64-linux/lib`. The PyPI wheel `nvidia-cuda-nvrtc-cu12` ships a
//! usable `libnvrtc.so.12` in `site-packages/nvidia/cuda_nvrtc/lib/` (see docs/cuda.md).

use anyhow::{anyhow, bail, Context, Result};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

type Prog = *mut c_void;
type Res = c_int;

/// The resolved NVRTC entry points.
pub struct Nvrtc {
    _lib: libloading::Library,
    /// Where the library was loaded from (for messages).
    pub path: String,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Res,
    error_string: unsafe extern "C" fn(Res) -> *const c_char,
    create: unsafe extern "C" fn(
        *mut Prog,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Res,
    compile: unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> Res,
    log_size: unsafe extern "C" fn(Prog, *mut usize) -> Res,
    log: unsafe extern "C" fn(Prog, *mut c_char) -> Res,
    ptx_size: unsafe extern "C" fn(Prog, *mut usize) -> Res,
    ptx: unsafe extern "C" fn(Prog, *mut c_char) -> Res,
    cubin_size: unsafe extern "C" fn(Prog, *mut usize) -> Res,
    cubin: unsafe extern "C" fn(Prog, *mut c_char) -> Res,
    destroy: unsafe extern "C" fn(*mut Prog) -> Res,
}

/// What to compile for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Machine code (CUBIN) for `sm_XY` (XY = major*10+minor).
    Cubin(u32),
    /// Portable PTX for the virtual architecture `compute_XY`.
    Ptx(u32),
}

/// Candidate library paths, in search order.
pub fn candidates() -> Vec<PathBuf> {
    let names = [
        "libnvrtc.so",
        "libnvrtc.so.13",
        "libnvrtc.so.12",
        "libnvrtc.so.11.2",
    ];
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("VELA_NVRTC_LIB") {
        out.push(PathBuf::from(p));
    }
    out.extend(names.iter().map(PathBuf::from));
    for d in toolkit_dirs() {
        out.extend(names.iter().map(|n| d.join(n)));
    }
    out
}

/// The CUDA toolkit's library folders: `$CUDA_HOME/lib64`, then the usual /usr/local ones (the
/// NVRTC and cuBLAS searches).
pub(crate) fn toolkit_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(h) = std::env::var_os("CUDA_HOME") {
        dirs.push(PathBuf::from(h).join("lib64"));
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs.push(PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib"));
    dirs
}

impl Nvrtc {
    /// The process-wide NVRTC, loaded on first use.
    pub fn get() -> Result<&'static Nvrtc> {
        static NVRTC: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();
        NVRTC
            .get_or_init(|| Nvrtc::load().map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| anyhow!("{e}"))
    }

    fn load() -> Result<Nvrtc> {
        let explicit = std::env::var_os("VELA_NVRTC_LIB").is_some();
        for (i, path) in candidates().into_iter().enumerate() {
            // SAFETY: loading NVRTC runs no initialisers with preconditions we could violate.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => return Nvrtc::resolve(lib, path.display().to_string()),
                Err(e) if i == 0 && explicit => {
                    bail!("VELA_NVRTC_LIB={} cannot be loaded: {e}", path.display())
                }
                Err(_) => {}
            }
        }
        bail!(
            "NVRTC (libnvrtc.so) not found: install the CUDA toolkit or \
             `pip install nvidia-cuda-nvrtc-cu12` and set VELA_NVRTC_LIB to its libnvrtc.so.12"
        )
    }

    fn resolve(lib: libloading::Library, path: String) -> Result<Nvrtc> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the signature matches the NVRTC C API declaration of this symbol.
                unsafe {
                    *lib.get($name.as_bytes())
                        .with_context(|| format!("{path} lacks the symbol {}", $name))?
                }
            };
        }
        Ok(Nvrtc {
            version: sym!("nvrtcVersion"),
            error_string: sym!("nvrtcGetErrorString"),
            create: sym!("nvrtcCreateProgram"),
            compile: sym!("nvrtcCompileProgram"),
            log_size: sym!("nvrtcGetProgramLogSize"),
            log: sym!("nvrtcGetProgramLog"),
            ptx_size: sym!("nvrtcGetPTXSize"),
            ptx: sym!("nvrtcGetPTX"),
            cubin_size: sym!("nvrtcGetCUBINSize"),
            cubin: sym!("nvrtcGetCUBIN"),
            destroy: sym!("nvrtcDestroyProgram"),
            _lib: lib,
            path,
        })
    }

    /// (major, minor) of the loaded NVRTC.
    pub fn version(&self) -> Result<(i32, i32)> {
        let (mut a, mut b) = (0, 0);
        // SAFETY: two valid out-pointers.
        self.check(unsafe { (self.version)(&mut a, &mut b) }, "nvrtcVersion")?;
        Ok((a, b))
    }

    fn check(&self, r: Res, what: &str) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string.
        let s = unsafe { CStr::from_ptr((self.error_string)(r)) };
        bail!("{what} failed: {}", s.to_string_lossy())
    }

    /// Compile one CUDA C source; returns the CUBIN bytes or the PTX text (NUL-terminated).
    pub fn compile(&self, src: &str, name: &str, target: Target) -> Result<Vec<u8>> {
        let c_src = CString::new(src).context("kernel source contains NUL")?;
        let c_name = CString::new(name).context("kernel name contains NUL")?;
        let arch = match target {
            Target::Cubin(a) => format!("--gpu-architecture=sm_{a}"),
            Target::Ptx(a) => format!("--gpu-architecture=compute_{a}"),
        };
        let opts: Vec<CString> = [arch.as_str(), "--std=c++17", "-default-device"]
            .iter()
            .map(|s| CString::new(*s).unwrap())
            .collect();
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|s| s.as_ptr()).collect();
        let mut prog: Prog = std::ptr::null_mut();
        // SAFETY: valid C strings; no headers.
        self.check(
            unsafe {
                (self.create)(
                    &mut prog,
                    c_src.as_ptr(),
                    c_name.as_ptr(),
                    0,
                    std::ptr::null(),
                    std::ptr::null(),
                )
            },
            "nvrtcCreateProgram",
        )?;
        let result = self.compile_prog(prog, &opt_ptrs, name, target);
        // SAFETY: `prog` was created above and is destroyed once.
        unsafe { (self.destroy)(&mut prog) };
        result
    }

    fn compile_prog(
        &self,
        prog: Prog,
        opts: &[*const c_char],
        name: &str,
        target: Target,
    ) -> Result<Vec<u8>> {
        // SAFETY: `prog` is live; `opts` are valid C strings.
        let r = unsafe { (self.compile)(prog, opts.len() as c_int, opts.as_ptr()) };
        if r != 0 {
            let log = self.program_log(prog).unwrap_or_default();
            let first: Vec<&str> = log
                .lines()
                .filter(|l| !l.trim().is_empty())
                .take(6)
                .collect();
            bail!(
                "NVRTC failed to compile {name} for {target:?}: {}",
                first.join(" | ")
            );
        }
        let (size_fn, get_fn) = match target {
            Target::Cubin(_) => (self.cubin_size, self.cubin),
            Target::Ptx(_) => (self.ptx_size, self.ptx),
        };
        let mut n = 0usize;
        // SAFETY: `prog` compiled successfully; the buffer has the reported size.
        self.check(unsafe { size_fn(prog, &mut n) }, "nvrtcGet*Size")?;
        let mut out = vec![0u8; n];
        self.check(
            unsafe { get_fn(prog, out.as_mut_ptr() as *mut c_char) },
            "nvrtcGet*",
        )?;
        Ok(out)
    }

    fn program_log(&self, prog: Prog) -> Result<String> {
        let mut n = 0usize;
        // SAFETY: `prog` is live; the buffer has the reported size.
        self.check(unsafe { (self.log_size)(prog, &mut n) }, "log size")?;
        let mut buf = vec![0u8; n.max(1)];
        self.check(
            unsafe { (self.log)(prog, buf.as_mut_ptr() as *mut c_char) },
            "log",
        )?;
        Ok(String::from_utf8_lossy(&buf)
            .trim_end_matches('\0')
            .to_string())
    }
}
