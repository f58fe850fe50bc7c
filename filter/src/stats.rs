//! The `stats-aggregator` role, in two parts sharing one configuration shape:
//! `mode: record` on an HTTP listener puts one small [`Record`] per stream on a shared queue;
//! `mode: aggregate` in a singleton Wasm service drains the queue into an [`Aggregate`] and,
//! on every tick, logs a summary and (with a `collector`) posts it. A post that fails keeps
//! its counts, which go out with the next tick's: nothing is dropped silently.

use crate::quote::Quoted;
use serde::Deserialize;

use crate::stored;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatsConfig {
    #[serde(default)]
    pub mode: Mode,
    /// Aggregate only: seconds between summaries (default 10).
    pub tick_seconds: Option<u32>,
    /// Aggregate only: where summaries are posted.
    pub collector: Option<Collector>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Record,
    Aggregate,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Collector {
    /// A cluster of the bootstrap.
    pub cluster: String,
    #[serde(default = "default_path")]
    pub path: String,
    #[serde(default = "default_authority")]
    pub authority: String,
    #[serde(default = "default_timeout")]
    pub timeout_ms: u32,
}

fn default_path() -> String {
    "/".into()
}
fn default_authority() -> String {
    "stats-collector".into()
}
fn default_timeout() -> u32 {
    5000
}

impl StatsConfig {
    pub fn validate(&mut self) -> Result<(), String> {
        if self.mode == Mode::Record {
            if self.tick_seconds.is_some() {
                return Err("tick_seconds: only `mode: aggregate` (the service) ticks".into());
            }
            if self.collector.is_some() {
                return Err("collector: only `mode: aggregate` (the service) posts".into());
            }
        }
        if self.tick_seconds == Some(0) {
            return Err("tick_seconds: must be at least 1".into());
        }
        if let Some(c) = &self.collector {
            if c.cluster.is_empty() {
                return Err("collector.cluster: must name a cluster".into());
            }
            if !c.path.starts_with('/') {
                return Err(format!(
                    "collector.path {}: must start with /",
                    Quoted(&c.path)
                ));
            }
            if c.timeout_ms == 0 {
                return Err("collector.timeout_ms: must be at least 1".into());
            }
        }
        Ok(())
    }

    pub fn tick_ms(&self) -> u32 {
        self.tick_seconds.unwrap_or(10).saturating_mul(1000)
    }
}

/// Upper bounds of the latency buckets, in milliseconds; one more bucket holds the rest.
pub const LATENCY_BOUNDS_MS: [u64; 7] = [1, 5, 10, 50, 100, 500, 1000];
/// Distinct routes kept; more are counted as `(other)`, so a path scan cannot grow memory.
pub const MAX_ROUTES: usize = 256;
const MAX_ROUTE_LEN: usize = 64;

/// `route`'s first [`MAX_ROUTE_LEN`] bytes at most, cut at a character boundary.
fn cut_route(route: &str) -> &str {
    let mut end = route.len().min(MAX_ROUTE_LEN);
    while !route.is_char_boundary(end) {
        end -= 1;
    }
    route.get(..end).unwrap_or_default()
}
const CLASSES: [&str; 6] = ["none", "1xx", "2xx", "3xx", "4xx", "5xx"];

/// One stream, as it goes on the queue: `<status class>|<latency bucket>|<route>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The first segment of the path (`/api/items?x` -> `/api`), at most 64 bytes.
    pub route: String,
    /// 1-5 for 1xx-5xx, 0 when there was no response.
    pub class: u8,
    /// Index into [`LATENCY_BOUNDS_MS`] (its length: slower than the last bound).
    pub latency_bucket: u8,
}

impl Record {
    pub fn new(path: &str, status: Option<u16>, latency_ns: u64) -> Self {
        let path = path.split(['?', '#']).next().unwrap_or_default();
        let first = path
            .strip_prefix('/')
            .map(|rest| rest.split('/').next().unwrap_or_default())
            .unwrap_or_default();
        let route = cut_route(&format!("/{first}")).to_string();
        let class = match status {
            Some(s @ 100..=599) => (s / 100) as u8,
            _ => 0,
        };
        let ms = latency_ns / 1_000_000;
        let latency_bucket = LATENCY_BOUNDS_MS
            .iter()
            .position(|b| ms < *b)
            .unwrap_or(LATENCY_BOUNDS_MS.len()) as u8;
        Self {
            route,
            class,
            latency_bucket,
        }
    }

    pub fn encode(&self) -> String {
        format!("{}|{}|{}", self.class, self.latency_bucket, self.route)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let text = stored::text(bytes, "record")?;
        let bad = |problem| stored::malformed("record", text, problem);
        let mut parts = text.splitn(3, '|');
        let (Some(c), Some(l), Some(route)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad(format_args!("expected class|latency|route")));
        };
        let small = |n: &str| stored::number(n).and_then(|n| u8::try_from(n).ok());
        let Some(class) = small(c) else {
            return Err(bad(format_args!("bad class")));
        };
        let Some(latency_bucket) = small(l) else {
            return Err(bad(format_args!("bad latency")));
        };
        if usize::from(class) >= CLASSES.len()
            || usize::from(latency_bucket) > LATENCY_BOUNDS_MS.len()
        {
            return Err(bad(format_args!("out of range")));
        }
        Ok(Self {
            // Another worker's record is cut as this worker's own are: a route past the
            // bound would be kept in every summary.
            route: cut_route(route).to_string(),
            class,
            latency_bucket,
        })
    }
}

/// Records on the queue at once, across every worker. Envoy's shared queue has no bound of
/// its own, so with the service slow or gone each worker would keep adding to it: past this,
/// records are dropped and counted. About 100 bytes each in Envoy's memory.
pub const MAX_QUEUED: u64 = 10_000;

/// The shared-data key counting the records on the queue: workers add one per record they
/// enqueue, the service takes off what it dequeued.
pub fn backlog_key(prefix: &str, queue: &str) -> String {
    format!("{prefix}stats/{queue}/queued")
}

/// The shared-data key holding the service's latest summary (the JSON it logs and posts,
/// for the window that ended at its last tick), for any worker VM to read.
pub fn summary_key(prefix: &str, queue: &str) -> String {
    format!("{prefix}stats/{queue}/summary")
}

/// Whether one more record may go on the queue, given the backlog counter's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Yes: store this count, then enqueue.
    Queue(u64),
    /// The queue holds [`MAX_QUEUED`] records: drop this one.
    Full,
}

/// The backlog counter as text; absent or empty is zero.
pub fn decode_count(value: Option<&[u8]>) -> Result<u64, String> {
    match value.filter(|v| !v.is_empty()) {
        None => Ok(0),
        Some(v) => {
            let text = stored::text(v, "backlog")?;
            stored::number(text)
                .ok_or_else(|| stored::malformed("backlog", text, format_args!("not a number")))
        }
    }
}

pub fn admit(queued: u64) -> Admit {
    if queued >= MAX_QUEUED {
        Admit::Full
    } else {
        Admit::Queue(queued + 1)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Aggregate {
    pub requests: u64,
    /// Counts per route, in the routes' byte order (the summary's key order). A sorted `Vec`
    /// rather than a map: it holds at most `MAX_ROUTES + 1` entries, and it is far less code
    /// for V8 to compile in every VM.
    pub by_route: Vec<(String, [u64; CLASSES.len()])>,
    pub latency: [u64; LATENCY_BOUNDS_MS.len() + 1],
}

impl Aggregate {
    pub fn add(&mut self, r: &Record) {
        self.requests = self.requests.saturating_add(1);
        let counts = self.route(&r.route);
        if let Some(c) = counts.get_mut(usize::from(r.class)) {
            *c = c.saturating_add(1);
        }
        if let Some(l) = self.latency.get_mut(usize::from(r.latency_bucket)) {
            *l = l.saturating_add(1);
        }
    }

    /// Puts counts back (a failed post's), keeping the route bound.
    pub fn merge(&mut self, other: Aggregate) {
        self.requests = self.requests.saturating_add(other.requests);
        for (route, counts) in other.by_route {
            let mine = self.route(&route);
            for (m, o) in mine.iter_mut().zip(counts) {
                *m = m.saturating_add(o);
            }
        }
        for (m, o) in self.latency.iter_mut().zip(other.latency) {
            *m = m.saturating_add(o);
        }
    }

    /// The counts of `route`, added in order if new; past `MAX_ROUTES` a new route is
    /// counted as `(other)`.
    fn route(&mut self, route: &str) -> &mut [u64; CLASSES.len()] {
        let find = |v: &Vec<(String, _)>, r: &str| v.binary_search_by(|(k, _)| k.as_str().cmp(r));
        let mut at = find(&self.by_route, route);
        if at.is_err() && self.by_route.len() >= MAX_ROUTES {
            at = find(&self.by_route, "(other)");
        }
        let i = match at {
            Ok(i) => i,
            Err(i) => {
                let name = if self.by_route.len() >= MAX_ROUTES {
                    "(other)"
                } else {
                    route
                };
                self.by_route
                    .insert(i, (name.to_string(), [0; CLASSES.len()]));
                i
            }
        };
        &mut self.by_route[i].1
    }

    pub fn is_empty(&self) -> bool {
        self.requests == 0
    }

    /// One line of JSON: `{"latency_ms":{"<1":3},"requests":3,"routes":{"/api":{"2xx":2,"5xx":1}}}`
    /// (only non-zero counts; keys in byte order at every level, as serde_json's map keeps
    /// them).
    pub fn summary(&self) -> String {
        use serde_json::{Map, Value};
        let mut latency = Map::new();
        for (i, n) in self.latency.iter().enumerate() {
            if *n == 0 {
                continue;
            }
            let name = match LATENCY_BOUNDS_MS.get(i) {
                Some(b) => format!("<{b}"),
                None => format!(">={}", LATENCY_BOUNDS_MS[LATENCY_BOUNDS_MS.len() - 1]),
            };
            latency.insert(name, Value::from(*n));
        }
        let mut routes = Map::new();
        for (route, counts) in &self.by_route {
            let mut by_class = Map::new();
            for (name, n) in CLASSES.iter().zip(counts) {
                if *n > 0 {
                    by_class.insert((*name).to_string(), Value::from(*n));
                }
            }
            routes.insert(route.clone(), Value::Object(by_class));
        }
        let mut summary = Map::new();
        summary.insert("latency_ms".into(), Value::Object(latency));
        summary.insert("requests".into(), Value::from(self.requests));
        summary.insert("routes".into(), Value::Object(routes));
        Value::Object(summary).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PluginConfig;

    fn counts<'a>(a: &'a Aggregate, route: &str) -> &'a [u64; CLASSES.len()] {
        &a.by_route.iter().find(|(r, _)| r == route).unwrap().1
    }

    fn config(json: &str) -> Result<StatsConfig, String> {
        match PluginConfig::parse(json.as_bytes())? {
            PluginConfig::StatsAggregator(c) => Ok(c),
            other => Err(format!("parsed as {}", other.role())),
        }
    }

    #[test]
    fn records_name_the_route_class_and_latency() {
        let r = Record::new("/api/items?x=1", Some(201), 7_000_000);
        assert_eq!(
            r,
            Record {
                route: "/api".into(),
                class: 2,
                latency_bucket: 2
            }
        );
        assert_eq!(r.encode(), "2|2|/api");
        assert_eq!(Record::decode(b"2|2|/api").unwrap(), r);
        assert_eq!(Record::new("/", None, 0).encode(), "0|0|/");
        assert_eq!(
            Record::new("*", Some(999), 5 * 1_000_000_000).encode(),
            "0|7|/"
        );
        assert!(
            Record::new(&format!("/{}", "é".repeat(100)), None, 0)
                .route
                .len()
                <= 64
        );
        for bad in [&b"2|2"[..], b"9|0|/", b"0|8|/", b"a|0|/", b"\xff"] {
            assert!(Record::decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn aggregates_summarises_and_merges() {
        let mut a = Aggregate::default();
        for (path, status) in [("/api/a", 200), ("/api/b", 200), ("/api", 503), ("/x", 404)] {
            a.add(&Record::new(path, Some(status), 0));
        }
        assert_eq!(
            a.summary(),
            r#"{"latency_ms":{"<1":4},"requests":4,"routes":{"/api":{"2xx":2,"5xx":1},"/x":{"4xx":1}}}"#
        );
        let mut b = Aggregate::default();
        b.add(&Record::new("/x", Some(404), 2_000_000_000));
        b.merge(a);
        assert_eq!(b.requests, 5);
        assert_eq!(counts(&b, "/x")[4], 2);
        assert_eq!(b.latency[7], 1);
        assert!(!b.is_empty() && Aggregate::default().is_empty());
    }

    #[test]
    fn the_summary_is_the_json_serde_json_wrote() {
        // The summary's readers saw serde_json's output: sorted keys, its string escapes.
        let mut a = Aggregate::default();
        let latencies = [0, 2, 7, 20, 70, 200, 700, 5000];
        for (i, route) in ["/a\"b\\", "/\u{1}\u{1f}", "/é€", "/plain"]
            .iter()
            .enumerate()
        {
            for (j, status) in [None, Some(101), Some(204), Some(302), Some(404), Some(599)]
                .into_iter()
                .enumerate()
            {
                if (i + j) % 3 != 0 {
                    let ms = latencies[(i + j) % latencies.len()];
                    a.add(&Record::new(route, status, ms * 1_000_000));
                }
            }
        }
        let mut routes = serde_json::Map::new();
        for (route, counts) in &a.by_route {
            let mut by_class = serde_json::Map::new();
            for (name, n) in CLASSES.iter().zip(counts).filter(|(_, n)| **n > 0) {
                by_class.insert(name.to_string(), (*n).into());
            }
            routes.insert(route.clone(), by_class.into());
        }
        let mut latency = serde_json::Map::new();
        for (i, n) in a.latency.iter().enumerate().filter(|(_, n)| **n > 0) {
            let name = match LATENCY_BOUNDS_MS.get(i) {
                Some(b) => format!("<{b}"),
                None => ">=1000".to_string(),
            };
            latency.insert(name, (*n).into());
        }
        let want =
            serde_json::json!({"requests": a.requests, "routes": routes, "latency_ms": latency});
        assert_eq!(a.summary(), want.to_string());
        assert_eq!(
            Aggregate::default().summary(),
            r#"{"latency_ms":{},"requests":0,"routes":{}}"#
        );
    }

    #[test]
    fn the_backlog_admits_up_to_its_bound() {
        assert_eq!(decode_count(None), Ok(0));
        assert_eq!(decode_count(Some(b"")), Ok(0));
        assert_eq!(decode_count(Some(b"41")), Ok(41));
        assert!(decode_count(Some(b"x")).is_err());
        assert_eq!(admit(0), Admit::Queue(1));
        assert_eq!(admit(MAX_QUEUED - 1), Admit::Queue(MAX_QUEUED));
        assert_eq!(admit(MAX_QUEUED), Admit::Full);
        assert_eq!(backlog_key("p/", "q"), "p/stats/q/queued");
        assert_eq!(summary_key("p/", "q"), "p/stats/q/summary");
    }

    /// Any VM under the service's vm_id can put on the queue; a record is what a recorder
    /// made (a route of at most 64 bytes), so a longer route from the queue is cut the same
    /// way rather than kept whole in every summary the service logs, stores and posts.
    #[test]
    fn a_queued_record_with_a_huge_route_keeps_at_most_64_bytes_of_it() {
        let mut queued = b"2|0|/".to_vec();
        queued.extend(std::iter::repeat_n(b'a', 1 << 20));
        let r = Record::decode(&queued).unwrap();
        assert!(
            r.route.len() <= MAX_ROUTE_LEN,
            "a {}-byte route kept",
            r.route.len()
        );
        let mut a = Aggregate::default();
        a.add(&r);
        assert!(
            a.summary().len() < 1024,
            "a {}-byte summary",
            a.summary().len()
        );
    }

    #[test]
    fn routes_are_bounded() {
        let mut a = Aggregate::default();
        for i in 0..MAX_ROUTES + 10 {
            a.add(&Record::new(&format!("/r{i}"), Some(200), 0));
        }
        assert_eq!(a.by_route.len(), MAX_ROUTES + 1);
        assert_eq!(counts(&a, "(other)")[2], 10);
    }

    #[test]
    fn configuration() {
        let c = config(r#"{"role":"stats-aggregator","mode":"aggregate","tick_seconds":2,"collector":{"cluster":"collector"}}"#).unwrap();
        assert_eq!(c.tick_ms(), 2000);
        assert_eq!(c.collector.as_ref().unwrap().path, "/");
        assert_eq!(
            config(r#"{"role":"stats-aggregator"}"#).unwrap().mode,
            Mode::Record
        );
        for (json, want) in [
            (r#""tick_seconds":5"#, "tick_seconds: only"),
            (r#""collector":{"cluster":"c"}"#, "collector: only"),
            (
                r#""mode":"aggregate","tick_seconds":0"#,
                "tick_seconds: must",
            ),
            (
                r#""mode":"aggregate","collector":{"cluster":""}"#,
                "collector.cluster",
            ),
            (
                r#""mode":"aggregate","collector":{"cluster":"c","path":"x"}"#,
                "collector.path",
            ),
            (
                r#""mode":"aggregate","collector":{"cluster":"c","timeout_ms":0}"#,
                "collector.timeout_ms",
            ),
            (r#""mode":"sum""#, "unknown variant `sum`"),
        ] {
            let e = config(&format!(r#"{{"role":"stats-aggregator",{json}}}"#)).unwrap_err();
            assert!(e.contains(want), "{json}: {e}");
        }
    }
}
