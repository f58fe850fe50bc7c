//! Metrics as Envoy defines them: every `proxy_define_metric` returns a fresh id whose low two
//! bits are the type (counter 0, gauge 1, histogram 2); ids are per VM, but the stat behind a
//! name is the proxy's (Envoy's stats store): every worker's VM that defines
//! `requests` counts into the same `wasmcustom.requests`, and reads the total back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use wasm_common::sync::lock;
use wasmtime::{Caller, Linker};

use super::{finish, hostcall, memory, HostState};
use crate::engine::abi::Status;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
}

/// The most samples a histogram keeps (Envoy keeps buckets, not samples); later ones only
/// count in `dropped_samples`, so a guest recording in a loop cannot exhaust the host.
pub const MAX_HISTOGRAM_SAMPLES: usize = 1 << 20;

/// One stat of the store: a counter's or gauge's value, a histogram's samples.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Stat {
    pub value: u64,
    pub samples: Vec<u64>,
    /// Samples past [`MAX_HISTOGRAM_SAMPLES`], not kept.
    #[serde(skip_serializing_if = "is_zero")]
    pub dropped_samples: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The proxy-wide stats, by type and full name (`wasmcustom.<name>`), as Envoy keeps
/// counters, gauges and histograms apart.
pub type Stats = Arc<Mutex<HashMap<(MetricType, String), Stat>>>;

/// One VM's metric ids.
#[derive(Debug, Default)]
pub struct Metrics {
    by_id: HashMap<u32, (MetricType, String)>,
    next: u32,
    stats: Stats,
}

impl Metrics {
    pub fn new(stats: Stats) -> Self {
        Self {
            by_id: HashMap::new(),
            next: 0,
            stats,
        }
    }

    pub fn define(&mut self, ty: MetricType, name: &str) -> u32 {
        self.next += 1;
        let id = (self.next << 2) | ty as u32;
        let key = (ty, format!("wasmcustom.{name}"));
        lock(&self.stats).entry(key.clone()).or_default();
        self.by_id.insert(id, key);
        id
    }

    fn with<T>(&self, id: u32, f: impl FnOnce(MetricType, &mut Stat) -> T) -> Result<T, Status> {
        let key = self.by_id.get(&id).ok_or(Status::NotFound)?;
        let mut stats = lock(&self.stats);
        Ok(f(key.0, stats.entry(key.clone()).or_default()))
    }

    pub fn increment(&mut self, id: u32, delta: i64) -> Result<(), Status> {
        self.with(id, |ty, m| match ty {
            // Envoy's stats wrap as unsigned 64-bit atomics do; a guest never makes them panic.
            MetricType::Counter if delta > 0 => {
                m.value = m.value.wrapping_add(delta as u64);
                Ok(())
            }
            MetricType::Gauge => {
                m.value = m.value.wrapping_add_signed(delta);
                Ok(())
            }
            _ => Err(Status::BadArgument),
        })?
    }

    pub fn record(&mut self, id: u32, value: u64) -> Result<(), Status> {
        self.with(id, |ty, m| match ty {
            MetricType::Counter => m.value = m.value.wrapping_add(value),
            MetricType::Gauge => m.value = value,
            MetricType::Histogram if m.samples.len() < MAX_HISTOGRAM_SAMPLES => {
                m.samples.push(value)
            }
            MetricType::Histogram => m.dropped_samples += 1,
        })
    }

    pub fn get(&self, id: u32) -> Result<u64, Status> {
        self.with(id, |ty, m| match ty {
            MetricType::Histogram => Err(Status::BadArgument),
            _ => Ok(m.value),
        })?
    }
}

fn proxy_define_metric(
    mut caller: Caller<'_, HostState>,
    ty: i32,
    name_ptr: i32,
    name_size: i32,
    ret_id: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let ty = match ty {
            0 => MetricType::Counter,
            1 => MetricType::Gauge,
            2 => MetricType::Histogram,
            _ => return Err(Status::BadArgument.into()),
        };
        // Every define keeps its id and name for the VM's life: held against the budget.
        let size = memory::check(&caller, name_ptr, name_size)? + super::held::ENTRY_OVERHEAD;
        super::held::hold(caller.data(), size, "proxy_define_metric")?;
        let name = memory::read_string(&caller, name_ptr, name_size)?;
        let id = caller.data_mut().metrics.define(ty, &name);
        memory::write_u32(&mut caller, ret_id, id)
    })
}

pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_define_metric", proxy_define_metric)?;
    linker.func_wrap(
        "env",
        "proxy_increment_metric",
        |mut c: Caller<'_, HostState>, id: i32, delta: i64| {
            finish(
                c.data_mut()
                    .metrics
                    .increment(id as u32, delta)
                    .map_err(Into::into),
            )
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_record_metric",
        |mut c: Caller<'_, HostState>, id: i32, value: i64| {
            finish(
                c.data_mut()
                    .metrics
                    .record(id as u32, value as u64)
                    .map_err(Into::into),
            )
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_metric",
        |mut c: Caller<'_, HostState>, id: i32, ret: i32| {
            hostcall(|| {
                let v = c.data().metrics.get(id as u32)?;
                memory::write_u64(&mut c, ret, v)
            })
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_keeps_a_bounded_number_of_samples_and_counts_the_rest() {
        let stats = Stats::default();
        let mut metrics = Metrics::new(stats.clone());
        let id = metrics.define(MetricType::Histogram, "latency");
        for v in 0..(MAX_HISTOGRAM_SAMPLES as u64 + 5) {
            metrics.record(id, v).unwrap();
        }
        let stats = stats.lock().unwrap();
        let stat = &stats[&(MetricType::Histogram, "wasmcustom.latency".to_string())];
        assert_eq!(stat.samples.len(), MAX_HISTOGRAM_SAMPLES);
        assert_eq!(stat.dropped_samples, 5);
    }

    #[test]
    fn a_counter_pushed_past_u64_wraps_as_envoys_does() {
        let mut metrics = Metrics::new(Stats::default());
        let id = metrics.define(MetricType::Counter, "c");
        metrics.record(id, u64::MAX).unwrap();
        metrics.increment(id, 2).unwrap();
        assert_eq!(metrics.get(id), Ok(1));
        metrics.record(id, u64::MAX).unwrap();
        assert_eq!(metrics.get(id), Ok(0));
    }
}
