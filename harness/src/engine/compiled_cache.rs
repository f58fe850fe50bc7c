//! Compiled modules kept on disk, keyed by (module sha256, wasmtime's compatibility hash), so a
//! second run of the same module skips Cranelift. Loading compiled code is `unsafe`: the file
//! is machine code that runs as is. So the cache is used only in a directory the current user
//! owns and nobody else can write; otherwise modules are compiled in memory and the cache is
//! left alone. A file that fails to load is compiled again and replaced.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::{Engine, Module};

#[derive(Debug, thiserror::Error)]
pub enum CompiledCacheError {
    #[error("compiled-code cache {path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error("compiled-code cache {path} is not safe to load code from: {reason}; fix its owner and mode (0700) or set WASM_HARNESS_CACHE_DIR")]
    Unsafe { path: PathBuf, reason: String },
}

/// Whether a module came from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Cached,
    Compiled,
}

#[derive(Debug, Clone)]
pub struct CompiledCache {
    dir: PathBuf,
}

impl CompiledCache {
    /// `$WASM_HARNESS_CACHE_DIR` (`off` disables the cache), else
    /// `$XDG_CACHE_HOME/wasm-harness/compiled`, else `~/.cache/wasm-harness/compiled`.
    pub fn default_dir() -> Option<PathBuf> {
        match std::env::var_os("WASM_HARNESS_CACHE_DIR") {
            Some(d) if d == "off" => return None,
            Some(d) if !d.is_empty() => return Some(PathBuf::from(d)),
            _ => {}
        }
        Some(
            wasm_common::dirs::user_cache_dir()?
                .join("wasm-harness")
                .join("compiled"),
        )
    }

    /// Creates the directory (0700) if needed and checks that only this user can write it.
    pub fn open(dir: &Path) -> Result<Self, CompiledCacheError> {
        let io = |e: std::io::Error| CompiledCacheError::Io {
            path: dir.to_path_buf(),
            message: e.to_string(),
        };
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(dir).map_err(io)?;
        check_private(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the compiled form of `bytes` lives for this engine.
    pub fn path_for(&self, engine: &Engine, bytes: &[u8]) -> PathBuf {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        let sha = Sha256::digest(bytes);
        self.dir
            .join(format!("{}-{:016x}.cwasm", hex::encode(sha), h.finish()))
    }

    /// The module from the cache, or compiled now and stored for next time.
    pub fn load_or_compile(
        &self,
        engine: &Engine,
        bytes: &[u8],
    ) -> wasmtime::Result<(Module, Origin)> {
        let path = self.path_for(engine, bytes);
        if path.is_file() {
            // SAFETY: the file is in a directory only this user can write (checked in `open`),
            // named by the module's sha256 and this engine's compatibility hash, and written
            // by `store` below from `Module::serialize`; wasmtime also checks its header.
            match unsafe { Module::deserialize_file(engine, &path) } {
                Ok(m) => return Ok((m, Origin::Cached)),
                Err(e) => tracing::warn!(path = %path.display(), "recompiling: {e:#}"),
            }
        }
        let module = Module::new(engine, bytes)?;
        if let Err(e) = self.store(&path, &module) {
            tracing::warn!(path = %path.display(), "cannot store compiled module: {e:#}");
        }
        Ok((module, Origin::Compiled))
    }

    fn store(&self, path: &Path, module: &Module) -> wasmtime::Result<()> {
        let bytes = module.serialize()?;
        let private = wasm_common::fs::Mode::Private;
        wasm_common::fs::write_whole(&self.dir, ".compiling-", path, &bytes, private, false)?;
        Ok(())
    }
}

#[cfg(unix)]
fn check_private(dir: &Path) -> Result<(), CompiledCacheError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(dir).map_err(|e| CompiledCacheError::Io {
        path: dir.to_path_buf(),
        message: e.to_string(),
    })?;
    let unsafe_because = |reason: String| CompiledCacheError::Unsafe {
        path: dir.to_path_buf(),
        reason,
    };
    if !meta.is_dir() {
        return Err(unsafe_because("not a directory (a symlink?)".into()));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(unsafe_because(format!(
            "owned by uid {}, not by this user (uid {me})",
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(unsafe_because(format!(
            "writable by group or others (mode {:o})",
            meta.mode() & 0o777
        )));
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_private(_dir: &Path) -> Result<(), CompiledCacheError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAT: &str = r#"(module (func (export "answer") (result i32) i32.const 42))"#;

    fn answer(engine: &Engine, module: &Module) -> i32 {
        let mut store = wasmtime::Store::new(engine, ());
        let instance = wasmtime::Instance::new(&mut store, module, &[]).unwrap();
        let f = instance
            .get_typed_func::<(), i32>(&mut store, "answer")
            .unwrap();
        f.call(&mut store, ()).unwrap()
    }

    #[test]
    fn second_load_comes_from_disk_and_runs() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CompiledCache::open(&dir.path().join("c")).unwrap();
        let engine = Engine::default();
        let bytes = wat::parse_str(WAT).unwrap();
        let (m, origin) = cache.load_or_compile(&engine, &bytes).unwrap();
        assert_eq!(origin, Origin::Compiled);
        assert_eq!(answer(&engine, &m), 42);
        let (m, origin) = cache.load_or_compile(&engine, &bytes).unwrap();
        assert_eq!(origin, Origin::Cached);
        assert_eq!(answer(&engine, &m), 42);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(cache.dir()).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700);
        }
    }

    #[test]
    fn a_damaged_file_is_compiled_again() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CompiledCache::open(dir.path()).unwrap();
        let engine = Engine::default();
        let bytes = wat::parse_str(WAT).unwrap();
        cache.load_or_compile(&engine, &bytes).unwrap();
        std::fs::write(cache.path_for(&engine, &bytes), b"garbage").unwrap();
        let (m, origin) = cache.load_or_compile(&engine, &bytes).unwrap();
        assert_eq!(origin, Origin::Compiled);
        assert_eq!(answer(&engine, &m), 42);
        let (_, origin) = cache.load_or_compile(&engine, &bytes).unwrap();
        assert_eq!(origin, Origin::Cached, "the damaged file was replaced");
    }

    #[test]
    fn the_key_includes_the_engine_settings() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CompiledCache::open(dir.path()).unwrap();
        let bytes = wat::parse_str(WAT).unwrap();
        let plain = Engine::default();
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        let epoch = Engine::new(&config).unwrap();
        assert_ne!(
            cache.path_for(&plain, &bytes),
            cache.path_for(&epoch, &bytes)
        );
        assert_ne!(
            cache.path_for(&plain, &bytes),
            cache.path_for(&plain, &wat::parse_str("(module)").unwrap())
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_directory_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = CompiledCache::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("writable by group or others"), "{e}");
    }
}
