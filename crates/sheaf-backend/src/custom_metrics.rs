//! Metrics that models define themselves (Triton's custom metrics: `pb_utils.MetricFamily`),
//! kept for the server's `/metrics`.
//!
//! A family has a name, a description and a kind (counter, gauge or histogram); its series are
//! told apart by their labels. A family is shared by every instance that declares it, as under
//! Triton: two processes of one model that count into the same labels count into one series.
//! Each declaration is held by its owner (a model process) and the family goes once the last
//! owner releases it, so a model's metrics leave `/metrics` when it unloads.
//!
//! The store holds plain numbers; the server renders them (`sheaf_core::metrics`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// What a family measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up.
    Counter,
    /// Goes up and down, or is set.
    Gauge,
    /// Observations counted into buckets, with their sum and count.
    Histogram,
}

impl MetricKind {
    /// The kind Prometheus' text format names (`counter`, `gauge`, `histogram`).
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }

    /// Parses a kind as [`MetricKind::as_str`] names it.
    pub fn parse(text: &str) -> Option<MetricKind> {
        match text {
            "counter" => Some(MetricKind::Counter),
            "gauge" => Some(MetricKind::Gauge),
            "histogram" => Some(MetricKind::Histogram),
            _ => None,
        }
    }
}

/// A series' labels, sorted by name.
pub type Labels = Vec<(String, String)>;

/// A series' value.
#[derive(Debug, Clone, PartialEq)]
pub enum SeriesValue {
    /// A counter's or a gauge's number.
    Number(f64),
    /// A histogram: each bucket's upper bound with the observations at or below it (not
    /// cumulative here; the renderer adds them up), then the sum and count of all.
    Histogram {
        bounds: Vec<f64>,
        counts: Vec<u64>,
        sum: f64,
        count: u64,
    },
}

/// One family as the renderer sees it.
#[derive(Debug, Clone)]
pub struct FamilyView {
    pub name: String,
    pub description: String,
    pub kind: MetricKind,
    pub series: Vec<(Labels, SeriesValue)>,
}

/// A change to one series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Update {
    /// Adds to a counter (not below zero) or a gauge.
    Increment(f64),
    /// Sets a gauge.
    Set(f64),
    /// Counts an observation into a histogram.
    Observe(f64),
}

#[derive(Debug)]
struct Family {
    description: String,
    kind: MetricKind,
    owners: usize,
    series: BTreeMap<Labels, SeriesValue>,
}

/// The custom metrics of one backend's models; clones share one store.
#[derive(Debug, Clone, Default)]
pub struct CustomMetrics(Arc<Mutex<BTreeMap<String, Family>>>);

/// Names the server's own metrics use: no model may declare one.
const RESERVED_PREFIX: &str = "sheaf_";

impl CustomMetrics {
    fn families(&self) -> MutexGuard<'_, BTreeMap<String, Family>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Declares the family `name` for one more owner, or joins the one declared already with
    /// the same kind. The name follows Prometheus' rules and does not start with `sheaf_`.
    pub fn declare(&self, name: &str, description: &str, kind: MetricKind) -> Result<(), String> {
        if !is_metric_name(name) {
            return Err(format!(
                "'{name}' is not a metric name: letters, digits, '_' and ':', not starting \
                 with a digit"
            ));
        }
        if name.starts_with(RESERVED_PREFIX) {
            return Err(format!(
                "'{name}': names starting with '{RESERVED_PREFIX}' are the server's own"
            ));
        }
        let mut families = self.families();
        match families.get_mut(name) {
            Some(f) if f.kind != kind => Err(format!(
                "the metric family '{name}' exists already as a {}, not a {}",
                f.kind.as_str(),
                kind.as_str()
            )),
            Some(f) => {
                f.owners += 1;
                Ok(())
            }
            None => {
                families.insert(
                    name.to_string(),
                    Family {
                        description: description.to_string(),
                        kind,
                        owners: 1,
                        series: BTreeMap::new(),
                    },
                );
                Ok(())
            }
        }
    }

    /// Gives up one owner's hold on `name`; the family and its series go with the last.
    pub fn release(&self, name: &str) {
        let mut families = self.families();
        if let Some(f) = families.get_mut(name) {
            f.owners = f.owners.saturating_sub(1);
            if f.owners == 0 {
                families.remove(name);
            }
        }
    }

    /// Makes the series of `family` with `labels` (sorted here), if it is not there yet. A
    /// histogram's series takes its buckets' upper bounds, in increasing order; a counter's or
    /// a gauge's takes none. A series made again keeps its value; a histogram's must name the
    /// same buckets.
    pub fn series(
        &self,
        family: &str,
        mut labels: Labels,
        buckets: Option<Vec<f64>>,
    ) -> Result<(), String> {
        if let Some((bad, _)) = labels.iter().find(|(k, _)| !is_label_name(k)) {
            return Err(format!(
                "'{bad}' is not a label name: letters, digits and '_', not starting with a \
                 digit or '__'"
            ));
        }
        labels.sort();
        if labels.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err("a label is named twice".into());
        }
        let mut families = self.families();
        let f = families
            .get_mut(family)
            .ok_or_else(|| format!("no metric family '{family}'"))?;
        let fresh = match (f.kind, buckets) {
            (MetricKind::Histogram, Some(bounds)) => {
                if bounds.iter().any(|b| b.is_nan()) || bounds.windows(2).any(|w| w[0] >= w[1]) {
                    return Err("a histogram's buckets must increase".into());
                }
                SeriesValue::Histogram {
                    counts: vec![0; bounds.len()],
                    bounds,
                    sum: 0.0,
                    count: 0,
                }
            }
            (MetricKind::Histogram, None) => {
                return Err("a histogram's metric needs its buckets".into())
            }
            (kind, Some(_)) => {
                return Err(format!("a {}'s metric takes no buckets", kind.as_str()))
            }
            (_, None) => SeriesValue::Number(0.0),
        };
        match f.series.get(&labels) {
            Some(SeriesValue::Histogram { bounds, .. }) => match &fresh {
                SeriesValue::Histogram { bounds: asked, .. } if asked != bounds => Err(format!(
                    "the metric of '{family}' with these labels exists already with other \
                     buckets ({bounds:?})"
                )),
                _ => Ok(()),
            },
            Some(_) => Ok(()),
            None => {
                f.series.insert(labels, fresh);
                Ok(())
            }
        }
    }

    /// Applies `update` to the series of `family` with `labels`.
    pub fn update(&self, family: &str, mut labels: Labels, update: Update) -> Result<(), String> {
        labels.sort();
        let mut families = self.families();
        let f = families
            .get_mut(family)
            .ok_or_else(|| format!("no metric family '{family}'"))?;
        let kind = f.kind;
        let series = f
            .series
            .get_mut(&labels)
            .ok_or_else(|| format!("no metric of '{family}' with labels {labels:?}"))?;
        match (series, update) {
            (SeriesValue::Number(v), Update::Increment(by)) => {
                if kind == MetricKind::Counter && by < 0.0 {
                    return Err(format!("a counter only goes up: cannot add {by}"));
                }
                *v += by;
                Ok(())
            }
            (SeriesValue::Number(v), Update::Set(to)) if kind == MetricKind::Gauge => {
                *v = to;
                Ok(())
            }
            (
                SeriesValue::Histogram {
                    bounds,
                    counts,
                    sum,
                    count,
                },
                Update::Observe(x),
            ) => {
                if let Some(i) = bounds.iter().position(|b| x <= *b) {
                    counts[i] += 1;
                }
                *sum += x;
                *count += 1;
                Ok(())
            }
            (_, update) => Err(format!(
                "a {} cannot be changed by {}",
                kind.as_str(),
                match update {
                    Update::Increment(_) => "increment",
                    Update::Set(_) => "set",
                    Update::Observe(_) => "observe",
                }
            )),
        }
    }

    /// The number a counter's or a gauge's series holds.
    pub fn value(&self, family: &str, mut labels: Labels) -> Result<f64, String> {
        labels.sort();
        let families = self.families();
        let f = families
            .get(family)
            .ok_or_else(|| format!("no metric family '{family}'"))?;
        match f.series.get(&labels) {
            Some(SeriesValue::Number(v)) => Ok(*v),
            Some(SeriesValue::Histogram { .. }) => {
                Err("a histogram has no single value: read it from /metrics".into())
            }
            None => Err(format!("no metric of '{family}' with labels {labels:?}")),
        }
    }

    /// Every family with its series, by name.
    pub fn snapshot(&self) -> Vec<FamilyView> {
        self.families()
            .iter()
            .map(|(name, f)| FamilyView {
                name: name.clone(),
                description: f.description.clone(),
                kind: f.kind,
                series: f
                    .series
                    .iter()
                    .map(|(l, v)| (l.clone(), v.clone()))
                    .collect(),
            })
            .collect()
    }
}

/// Prometheus' metric names: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Prometheus' label names: `[a-zA-Z_][a-zA-Z0-9_]*`, less the reserved `__` prefix.
fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with("__")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn owners_share_a_family_and_its_series_until_the_last_releases_it() {
        let m = CustomMetrics::default();
        m.declare("latency_ns", "time spent", MetricKind::Counter)
            .unwrap();
        m.declare("latency_ns", "time spent", MetricKind::Counter)
            .unwrap();
        let l = labels(&[("version", "1"), ("model", "m")]);
        m.series("latency_ns", l.clone(), None).unwrap();
        m.series(
            "latency_ns",
            labels(&[("model", "m"), ("version", "1")]),
            None,
        )
        .unwrap();
        m.update("latency_ns", l.clone(), Update::Increment(5.0))
            .unwrap();
        m.update(
            "latency_ns",
            labels(&[("model", "m"), ("version", "1")]),
            Update::Increment(2.5),
        )
        .unwrap();
        assert_eq!(m.value("latency_ns", l.clone()).unwrap(), 7.5);
        m.release("latency_ns");
        assert_eq!(m.snapshot().len(), 1, "one owner holds it still");
        m.release("latency_ns");
        assert!(m.snapshot().is_empty());
        assert!(m.value("latency_ns", l).is_err());
    }

    #[test]
    fn a_family_is_refused_a_bad_name_a_reserved_one_or_another_kind() {
        let m = CustomMetrics::default();
        assert!(m.declare("1abc", "", MetricKind::Gauge).is_err());
        assert!(m.declare("a-b", "", MetricKind::Gauge).is_err());
        assert!(m.declare("", "", MetricKind::Gauge).is_err());
        let e = m
            .declare("sheaf_request_success", "", MetricKind::Counter)
            .unwrap_err();
        assert!(e.contains("server's own"), "{e}");
        m.declare("queue:items", "", MetricKind::Gauge).unwrap();
        let e = m
            .declare("queue:items", "", MetricKind::Counter)
            .unwrap_err();
        assert!(e.contains("exists already as a gauge"), "{e}");
    }

    #[test]
    fn each_kind_takes_only_its_own_changes() {
        let m = CustomMetrics::default();
        m.declare("c", "", MetricKind::Counter).unwrap();
        m.declare("g", "", MetricKind::Gauge).unwrap();
        m.declare("h", "", MetricKind::Histogram).unwrap();
        m.series("c", vec![], None).unwrap();
        m.series("g", vec![], None).unwrap();
        assert!(m.series("h", vec![], None).is_err(), "buckets needed");
        assert!(m.series("g", vec![], Some(vec![1.0])).is_err());
        assert!(m.series("h", vec![], Some(vec![2.0, 1.0])).is_err());
        m.series("h", vec![], Some(vec![1.0, 2.0])).unwrap();
        assert!(m.series("h", vec![], Some(vec![1.0, 3.0])).is_err());

        assert!(m.update("c", vec![], Update::Increment(-1.0)).is_err());
        assert!(m.update("c", vec![], Update::Set(3.0)).is_err());
        assert!(m.update("c", vec![], Update::Observe(3.0)).is_err());
        m.update("g", vec![], Update::Set(3.0)).unwrap();
        m.update("g", vec![], Update::Increment(-4.0)).unwrap();
        assert_eq!(m.value("g", vec![]).unwrap(), -1.0);
        assert!(m.update("h", vec![], Update::Increment(1.0)).is_err());
        for x in [0.5, 1.0, 1.5, 9.0] {
            m.update("h", vec![], Update::Observe(x)).unwrap();
        }
        assert!(m.value("h", vec![]).is_err());
        let h = m.snapshot().into_iter().find(|f| f.name == "h").unwrap();
        assert_eq!(
            h.series[0].1,
            SeriesValue::Histogram {
                bounds: vec![1.0, 2.0],
                counts: vec![2, 1],
                sum: 12.0,
                count: 4
            }
        );
    }

    #[test]
    fn labels_are_checked() {
        let m = CustomMetrics::default();
        m.declare("g", "", MetricKind::Gauge).unwrap();
        assert!(m.series("g", labels(&[("a b", "x")]), None).is_err());
        assert!(m.series("g", labels(&[("__name", "x")]), None).is_err());
        assert!(m
            .series("g", labels(&[("a", "x"), ("a", "y")]), None)
            .is_err());
        assert!(m.series("missing", vec![], None).is_err());
        assert!(m
            .update("g", labels(&[("a", "x")]), Update::Set(1.0))
            .is_err());
    }
}
