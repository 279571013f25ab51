//! What a test sees of the calls' spans ([`ClosedSpans`]), and a test run again in a child process
//! ([`in_child`]), for what may abort the process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// A `tracing_subscriber` layer that keeps every closed span (the calls' `idempotent` spans and any
/// other), in the order they closed, with its fields and `parent` (`<name>:<namespace>` of the span
/// it was opened in) when it has one.
#[derive(Clone, Default)]
pub struct ClosedSpans(Arc<Mutex<Vec<Closed>>>);

/// A closed span: its name, and the fields that had a value.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Closed {
    /// The span's name (`idempotent` for a call's).
    pub name: String,
    /// Its fields with a value.
    pub fields: HashMap<String, String>,
}

impl Closed {
    /// The field `field` ("" for none).
    #[must_use]
    pub fn get(&self, field: &str) -> String {
        self.fields.get(field).cloned().unwrap_or_default()
    }
}

impl ClosedSpans {
    /// Every closed span.
    #[must_use]
    pub fn all(&self) -> Vec<Closed> {
        self.0.lock().unwrap().clone()
    }

    /// The fields of each closed `idempotent` span.
    #[must_use]
    pub fn fields(&self) -> Vec<HashMap<String, String>> {
        self.all()
            .into_iter()
            .filter(|s| s.name == "idempotent")
            .map(|s| s.fields)
            .collect()
    }

    /// The `outcome` of each closed `idempotent` span (empty when it has none).
    #[must_use]
    pub fn outcomes(&self) -> Vec<String> {
        self.fields()
            .iter()
            .map(|f| f.get("outcome").cloned().unwrap_or_default())
            .collect()
    }

    /// The `namespace` and `outcome` of each closed `idempotent` span (empty when it has none).
    #[must_use]
    pub fn namespaces_and_outcomes(&self) -> Vec<(String, String)> {
        let get = |f: &HashMap<String, String>, k: &str| f.get(k).cloned().unwrap_or_default();
        self.fields()
            .iter()
            .map(|f| (get(f, "namespace"), get(f, "outcome")))
            .collect()
    }
}

/// A span's fields, as recorded.
#[derive(Default)]
struct Fields(HashMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for ClosedSpans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let span = ctx.span(id).unwrap();
        if let Some(parent) = span.parent() {
            let parent_namespace = parent
                .extensions()
                .get::<Fields>()
                .and_then(|f| f.0.get("namespace").cloned())
                .unwrap_or_default();
            fields.0.insert(
                "parent".to_owned(),
                format!("{}:{parent_namespace}", parent.name()),
            );
        }
        span.extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let mut extensions = span.extensions_mut();
        values.record(extensions.get_mut::<Fields>().unwrap());
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).unwrap();
        let fields = span.extensions().get::<Fields>().unwrap().0.clone();
        self.0.lock().unwrap().push(Closed {
            name: span.name().to_owned(),
            fields,
        });
    }
}

/// Runs the test named `test` (its full path in its test binary) again, alone, in a child process with
/// the variable `child` set, which the test reads to do its part there; the child's output, for the
/// parent to check its status (a process that aborted has no exit code).
#[must_use]
pub fn in_child(test: &str, child: &str) -> std::process::Output {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--test-threads=1", "--nocapture"])
        .env(child, "1")
        .output()
        .unwrap()
}
