//! One JSON line per event, on stderr or appended to `--events FILE`.
//!
//! Every line is an object that starts with `"supervisor": "<event>"`,
//! `"name"`, `"t_ns"` (CLOCK_MONOTONIC) and
//! `"ts"` (wall clock, RFC 3339 with milliseconds), then the event's own
//! fields in a fixed order.  Each line is written with a single write(2).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

use serde_json::Value;

use crate::clock;

pub struct EventLog {
    name: String,
    file: Option<File>,
}

/// An event being built: `ev("spawn").u("pid", 1).s("mode", "warm")`.
pub struct Event {
    kind: &'static str,
    fields: Vec<(&'static str, Value)>,
}

pub fn ev(kind: &'static str) -> Event {
    Event {
        kind,
        fields: Vec::with_capacity(12),
    }
}

impl Event {
    pub fn v(mut self, k: &'static str, v: impl Into<Value>) -> Self {
        self.fields.push((k, v.into()));
        self
    }
    pub fn s(self, k: &'static str, v: impl AsRef<str>) -> Self {
        let s = v.as_ref().to_string();
        self.v(k, s)
    }
    pub fn u(self, k: &'static str, v: u64) -> Self {
        self.v(k, v)
    }
    pub fn i(self, k: &'static str, v: i64) -> Self {
        self.v(k, v)
    }
    pub fn opt<T: Into<Value>>(self, k: &'static str, v: Option<T>) -> Self {
        match v {
            Some(v) => self.v(k, v),
            None => self,
        }
    }
    pub fn kind(&self) -> &'static str {
        self.kind
    }
    /// A field's value, for those that count events (cluster/metrics.rs).
    pub fn field(&self, k: &str) -> Option<&Value> {
        self.fields.iter().find(|(n, _)| *n == k).map(|(_, v)| v)
    }
}

impl EventLog {
    pub fn open(name: &str, path: Option<&Path>) -> std::io::Result<Self> {
        let file = match path {
            Some(p) => Some(OpenOptions::new().create(true).append(true).open(p)?),
            None => None,
        };
        Ok(EventLog {
            name: name.to_string(),
            file,
        })
    }

    /// Renders the line (without the newline); public for tests.
    pub fn render(&self, e: &Event) -> String {
        let mut out = String::with_capacity(256);
        out.push('{');
        push_pair(&mut out, "supervisor", &Value::from(e.kind), true);
        push_pair(&mut out, "name", &Value::from(self.name.as_str()), false);
        push_pair(&mut out, "t_ns", &Value::from(clock::now_ns()), false);
        let ts = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
        push_pair(&mut out, "ts", &Value::from(ts), false);
        for (k, v) in &e.fields {
            push_pair(&mut out, k, v, false);
        }
        out.push('}');
        out
    }

    pub fn emit(&mut self, e: Event) {
        let mut line = self.render(&e);
        line.push('\n');
        let r = match &mut self.file {
            Some(f) => f.write_all(line.as_bytes()).and_then(|_| f.flush()),
            None => {
                let mut err = std::io::stderr().lock();
                err.write_all(line.as_bytes()).and_then(|_| err.flush())
            }
        };
        if r.is_err() && self.file.is_some() {
            // the events file went away (disk full, ...): say so on stderr once
            self.file = None;
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(
                b"rekindle: cannot write the events file; events go to stderr from now on\n",
            );
            let _ = err.write_all(line.as_bytes());
        }
    }
}

fn push_pair(out: &mut String, k: &str, v: &Value, first: bool) {
    if !first {
        out.push(',');
    }
    out.push_str(&Value::from(k).to_string());
    out.push(':');
    out.push_str(&v.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_json_with_the_common_fields_first() {
        let log = EventLog::open("svc", None).unwrap_or_else(|e| panic!("{e}"));
        let line = log.render(
            &ev("spawn")
                .u("pid", 7)
                .s("mode", "warm\"x")
                .opt::<u64>("none", None),
        );
        assert!(
            line.starts_with("{\"supervisor\":\"spawn\",\"name\":\"svc\""),
            "{line}"
        );
        let v: Value = serde_json::from_str(&line).unwrap_or_default();
        assert_eq!(v["pid"], 7);
        assert_eq!(v["mode"], "warm\"x");
        assert!(v["t_ns"].as_u64().is_some());
        assert!(v["ts"].as_str().is_some_and(|s| s.ends_with('Z')));
        assert!(v.get("none").is_none());
    }
}
