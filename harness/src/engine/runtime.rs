//! The Wasm runtime the harness's VMs share, set up as wasmtime's
//! `examples/fast_instantiation.rs` does: one `Engine` (with the pooling allocator and epoch
//! interruption), one `Linker` with every hostcall, and code loading: a module's bytecode, the
//! on-disk compiled-code cache ([`super::compiled_cache`]), or the module's precompiled
//! section ([`super::precompiled_section`]), checked against the Proxy-Wasm ABI before it is
//! linked.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Engine, InstancePre, Linker, Module};

use crate::engine::abi::AbiVersion;
use crate::engine::compiled_cache::CompiledCache;
use crate::engine::host::memory::MAX_MEMORY_BYTES;
use crate::engine::host::{self, HostState};
use crate::engine::precompiled_section as precompiled;

/// How often the epoch ticks; deadlines are whole ticks.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(10);
/// The most elements a VM's table may have, as the pooling allocator's default allows. The
/// same limit holds when instances are allocated on demand: otherwise one `table.grow` and
/// `table.fill` (a single instruction, which no deadline interrupts) would have the host
/// write gigabytes.
pub const MAX_TABLE_ELEMENTS: usize = 20_000;
/// Default time one callback may run before the harness interrupts it. Envoy has no such
/// limit (a looping guest hangs its worker); the harness reports it instead of hanging.
pub const DEFAULT_CALLBACK_DEADLINE: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("cannot read Wasm module {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("Wasm module {path} is not a Wasm binary (it does not begin with \"\\0asm\"); only a file named *.wat is read as WebAssembly text")]
    NotWasm { path: PathBuf },
    #[error("Wasm module {path} failed to compile: {message}")]
    Compile { path: PathBuf, message: String },
    #[error("Wasm module {path}: Missing or unknown Proxy-Wasm ABI version (no proxy_abi_version_* export)")]
    NoAbiVersion { path: PathBuf },
    #[error("Wasm module {path} failed to link: {message}")]
    Link { path: PathBuf, message: String },
    #[error("Wasm module {path} failed to start: {message}")]
    Start { path: PathBuf, message: String },
    #[error(
        "Wasm module {path} is missing malloc function (export malloc or proxy_on_memory_allocate)"
    )]
    NoAllocator { path: PathBuf },
}

/// Instances a runtime's pool holds at least (canary + workers, times distinct VMs, plus
/// restarts). Each slot reserves address space, not memory.
pub const POOLED_INSTANCES: usize = 128;

/// Beyond this many instances the runtime allocates each instance on demand instead of
/// reserving slots for all of them up front (a few TiB of address space).
pub const MAX_POOLED_INSTANCES: usize = 1024;

/// The engine, the linker with every hostcall, and the thread that advances the epoch.
pub struct Runtime {
    engine: Engine,
    linker: Linker<HostState>,
    /// How long one callback may run (see [`DEFAULT_CALLBACK_DEADLINE`]).
    pub callback_deadline: Duration,
    /// Compiled modules on disk (see [`crate::engine::compiled_cache`]); `None` compiles in memory.
    pub compiled: Option<CompiledCache>,
}

/// `pool`: how many instances the pooling allocator holds; `None` allocates on demand.
fn engine_config(pool: Option<u32>) -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config.epoch_interruption(true);
    if let Some(slots) = pool {
        // Instances come from preallocated slots, so starting a worker VM costs no mmap:
        // that is most of what makes a VM start take microseconds, not milliseconds.
        let mut pool = wasmtime::PoolingAllocationConfig::default();
        pool.total_core_instances(slots)
            .total_memories(slots)
            .total_tables(slots)
            .max_memory_size(MAX_MEMORY_BYTES)
            .table_elements(MAX_TABLE_ELEMENTS);
        config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
    }
    config
}

impl Runtime {
    /// A runtime with the pooling allocator (falling back to on-demand allocation where the
    /// address space cannot be reserved) and the compiled-code cache of
    /// [`CompiledCache::default_dir`] when that directory is safe to use.
    pub fn new() -> wasmtime::Result<Self> {
        Self::with_capacity(POOLED_INSTANCES)
    }

    /// A runtime for `instances` VM instances alive at once: pooled up to
    /// [`MAX_POOLED_INSTANCES`], allocated on demand beyond, so no number of workers runs out
    /// of slots.
    pub fn with_capacity(instances: usize) -> wasmtime::Result<Self> {
        let slots = instances.max(POOLED_INSTANCES);
        let pool = u32::try_from(slots)
            .ok()
            .filter(|_| slots <= MAX_POOLED_INSTANCES);
        if pool.is_none() {
            tracing::info!(
                "{instances} VM instances: more than the {MAX_POOLED_INSTANCES} the pooling allocator holds; allocating on demand"
            );
        }
        let engine = Engine::new(&engine_config(pool)).or_else(|e| {
            tracing::warn!("pooling allocator unavailable ({e:#}); allocating on demand");
            Engine::new(&engine_config(None))
        })?;
        let compiled = CompiledCache::default_dir().and_then(|dir| {
            CompiledCache::open(&dir)
                .map_err(|e| tracing::warn!("{e}; compiling in memory"))
                .ok()
        });
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("wasm-harness-epoch".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            })?;
        let mut linker = Linker::new(&engine);
        host::add_to_linker(&mut linker)?;
        Ok(Self {
            engine,
            linker,
            callback_deadline: DEFAULT_CALLBACK_DEADLINE,
            compiled,
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Compiles (or finds compiled) the module at `path`. With a `precompiled` section name
    /// (see [`precompiled::section_for`]), code precompiled into that section of the module
    /// is used when it loads, as cpp-host does.
    pub fn load(
        &self,
        path: &Path,
        precompiled: Option<&str>,
    ) -> Result<Arc<LoadedModule>, VmError> {
        let bytes = crate::engine::input::read(path, crate::engine::input::MAX_MODULE_BYTES)
            .map_err(|source| VmError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        let is_text = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("wat"));
        if !is_text && !bytes.starts_with(b"\0asm") {
            return Err(VmError::NotWasm {
                path: path.to_path_buf(),
            });
        }
        let compile_error = |e: wasmtime::Error| VmError::Compile {
            path: path.to_path_buf(),
            message: format!("{e:#}"),
        };
        let precompiled = match precompiled {
            Some(section) => self.load_precompiled(path, &bytes, section)?,
            None => None,
        };
        let (module, code) = match precompiled {
            Some(m) => (m, CodeSource::Precompiled),
            None => match &self.compiled {
                Some(cache) => {
                    let (m, origin) = cache
                        .load_or_compile(&self.engine, &bytes)
                        .map_err(compile_error)?;
                    let code = match origin {
                        crate::engine::compiled_cache::Origin::Cached => CodeSource::Cache,
                        crate::engine::compiled_cache::Origin::Compiled => CodeSource::Compiled,
                    };
                    (m, code)
                }
                None => (
                    Module::new(&self.engine, &bytes).map_err(compile_error)?,
                    CodeSource::Compiled,
                ),
            },
        };
        let abi = AbiVersion::detect(
            module
                .exports()
                .filter(|e| e.ty().func().is_some())
                .map(|e| e.name()),
        )
        .ok_or_else(|| VmError::NoAbiVersion {
            path: path.to_path_buf(),
        })?;
        if let Some(import) = module
            .imports()
            .find(|i| i.module() == "env" && !abi.links_import(i.name()))
        {
            return Err(VmError::Link {
                path: path.to_path_buf(),
                message: format!(
                    "import env.{} is not part of Proxy-Wasm ABI {} (Envoy does not link it for this module)",
                    import.name(),
                    abi.as_str()
                ),
            });
        }
        let pre = self
            .linker
            .instantiate_pre(&module)
            .map_err(|e| VmError::Link {
                path: path.to_path_buf(),
                message: format!("{e:#}"),
            })?;
        let names_functions = if is_text {
            wat::parse_bytes(&bytes).is_ok_and(|b| names_functions(&b))
        } else {
            names_functions(&bytes)
        };
        Ok(Arc::new(LoadedModule {
            path: path.to_path_buf(),
            abi,
            names_functions,
            code,
            pre,
        }))
    }

    /// The module from its section `name`, or `None` (no section, or code another wasmtime
    /// or other settings made: then the bytecode is compiled, as in cpp-host).
    fn load_precompiled(
        &self,
        path: &Path,
        bytes: &[u8],
        name: &str,
    ) -> Result<Option<Module>, VmError> {
        let section = precompiled::find_section(bytes, name).map_err(|e| VmError::Compile {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let Some(code) = section else {
            return Ok(None);
        };
        // SAFETY: this is what `allow_precompiled` means in Envoy: the operator trusts the
        // module's precompiled code (see `crate::engine::precompiled_section`). wasmtime checks the header,
        // version and engine settings before using it.
        match unsafe { Module::deserialize(&self.engine, code) } {
            Ok(m) => Ok(Some(m)),
            Err(e) => {
                tracing::warn!(path = %path.display(), "section {name} does not load here, compiling the bytecode: {e:#}");
                Ok(None)
            }
        }
    }
}

/// Where a module's machine code came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeSource {
    /// The module's own `precompiled_wasmtime_*` section (`allow_precompiled`).
    Precompiled,
    /// The harness's compiled-code cache.
    Cache,
    /// Compiled from the bytecode now.
    Compiled,
}

pub struct LoadedModule {
    pub path: PathBuf,
    pub abi: AbiVersion,
    /// Whether its `name` section names functions: then a trap's report has a backtrace, as
    /// V8's in Envoy has.
    pub names_functions: bool,
    pub code: CodeSource,
    pub(crate) pre: InstancePre<HostState>,
}

/// Whether the module's `name` section names any function: then V8 prints backtraces.
fn names_functions(bytes: &[u8]) -> bool {
    use wasmparser::{Name, NameSectionReader, Parser, Payload};
    for payload in Parser::new(0).parse_all(bytes) {
        let Ok(Payload::CustomSection(section)) = payload else {
            continue;
        };
        if section.name() != "name" {
            continue;
        }
        let reader = NameSectionReader::new(wasmparser::BinaryReader::new(
            section.data(),
            section.data_offset(),
        ));
        for name in reader.into_iter().flatten() {
            if let Name::Function(map) = name {
                if map.count() > 0 {
                    return true;
                }
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_section_with_function_names_is_found() {
        let named = wat::parse_str("(module (func $f))").unwrap();
        let unnamed = wat::parse_str("(module (func))").unwrap();
        assert!(names_functions(&named));
        assert!(!names_functions(&unnamed));
    }
}
