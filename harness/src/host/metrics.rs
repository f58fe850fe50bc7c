//! Metrics as Envoy defines them: every `proxy_define_metric` returns a fresh id whose low two
//! bits are the type (counter 0, gauge 1, histogram 2), ids are per VM, counters only grow.

use std::collections::HashMap;

use wasmtime::{Caller, Linker};

use super::{finish, memory, HostState};
use crate::abi::Status;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Metric {
    pub name: String,
    pub ty: MetricType,
    pub value: u64,
    pub samples: Vec<u64>,
}

#[derive(Debug, Default)]
pub struct Metrics {
    pub by_id: HashMap<u32, Metric>,
    next: u32,
}

impl Metrics {
    pub fn define(&mut self, ty: MetricType, name: &str) -> u32 {
        self.next += 1;
        let id = (self.next << 2) | ty as u32;
        self.by_id.insert(
            id,
            Metric {
                name: format!("wasmcustom.{name}"),
                ty,
                value: 0,
                samples: Vec::new(),
            },
        );
        id
    }

    pub fn increment(&mut self, id: u32, delta: i64) -> Result<(), Status> {
        let m = self.by_id.get_mut(&id).ok_or(Status::NotFound)?;
        match m.ty {
            MetricType::Counter if delta > 0 => m.value += delta as u64,
            MetricType::Gauge => m.value = m.value.wrapping_add_signed(delta),
            _ => return Err(Status::BadArgument),
        }
        Ok(())
    }

    pub fn record(&mut self, id: u32, value: u64) -> Result<(), Status> {
        let m = self.by_id.get_mut(&id).ok_or(Status::NotFound)?;
        match m.ty {
            MetricType::Counter => m.value += value,
            MetricType::Gauge => m.value = value,
            MetricType::Histogram => m.samples.push(value),
        }
        Ok(())
    }

    pub fn get(&self, id: u32) -> Result<u64, Status> {
        let m = self.by_id.get(&id).ok_or(Status::NotFound)?;
        match m.ty {
            MetricType::Histogram => Err(Status::BadArgument),
            _ => Ok(m.value),
        }
    }
}

fn proxy_define_metric(
    mut caller: Caller<'_, HostState>,
    ty: i32,
    name_ptr: i32,
    name_size: i32,
    ret_id: i32,
) -> wasmtime::Result<i32> {
    finish((|| {
        let ty = match ty {
            0 => MetricType::Counter,
            1 => MetricType::Gauge,
            2 => MetricType::Histogram,
            _ => return Err(Status::BadArgument.into()),
        };
        let name = memory::read_string(&caller, name_ptr, name_size)?;
        let id = caller.data_mut().metrics.define(ty, &name);
        memory::write_u32(&mut caller, ret_id, id)
    })())
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
            finish((|| {
                let v = c.data().metrics.get(id as u32)?;
                memory::write_u64(&mut c, ret, v)
            })())
        },
    )?;
    Ok(())
}
