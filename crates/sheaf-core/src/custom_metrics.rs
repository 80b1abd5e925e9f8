//! The metrics models define themselves ([`sheaf_backend::CustomMetrics`]), written in
//! Prometheus' text format 0.0.4 after the server's own.
//!
//! Written here rather than through `prometheus-client`, whose encoder names every counter's
//! samples `<name>_total`: a model's metric keeps the exact name the model gave it, as Triton
//! shows it, so dashboards and scripts written against a Triton model read the same series.

use std::fmt::Write;

use sheaf_backend::custom_metrics::{FamilyView, SeriesValue};

/// Appends every family of `stores` to `out`.
pub(crate) fn render(stores: &[sheaf_backend::CustomMetrics], out: &mut String) {
    for family in stores.iter().flat_map(|s| s.snapshot()) {
        render_family(&family, out);
    }
}

fn render_family(f: &FamilyView, out: &mut String) {
    // Writing into a String cannot fail.
    let _ = writeln!(out, "# HELP {} {}", f.name, escape_help(&f.description));
    let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind.as_str());
    for (labels, value) in &f.series {
        match value {
            SeriesValue::Number(v) => {
                let _ = writeln!(out, "{}{} {}", f.name, label_set(labels, None), number(*v));
            }
            SeriesValue::Histogram {
                bounds,
                counts,
                sum,
                count,
            } => {
                let mut below = 0;
                for (bound, n) in bounds.iter().zip(counts) {
                    below += n;
                    let le = number(*bound);
                    let _ = writeln!(
                        out,
                        "{}_bucket{} {below}",
                        f.name,
                        label_set(labels, Some(&le))
                    );
                }
                let _ = writeln!(
                    out,
                    "{}_bucket{} {count}",
                    f.name,
                    label_set(labels, Some("+Inf"))
                );
                let _ = writeln!(
                    out,
                    "{}_sum{} {}",
                    f.name,
                    label_set(labels, None),
                    number(*sum)
                );
                let _ = writeln!(out, "{}_count{} {count}", f.name, label_set(labels, None));
            }
        }
    }
}

/// `{a="x",b="y"}` (with `le` last for a bucket), or nothing without labels.
fn label_set(labels: &[(String, String)], le: Option<&str>) -> String {
    let pairs: Vec<String> = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain(le.map(|le| ("le", le)))
        .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
        .collect();
    if pairs.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", pairs.join(","))
    }
}

/// A sample value as Prometheus reads it: `+Inf`, `-Inf`, `NaN`, or the number.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_label(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use sheaf_backend::custom_metrics::{MetricKind, Update};
    use sheaf_backend::CustomMetrics;

    #[test]
    fn families_are_written_with_their_own_names_escaped_and_cumulative() {
        let m = CustomMetrics::default();
        m.declare(
            "requests_ns",
            "Time \\ spent\nin total",
            MetricKind::Counter,
        )
        .unwrap();
        let labels = vec![
            ("model".to_string(), "a\"b".to_string()),
            ("version".to_string(), "1".to_string()),
        ];
        m.series("requests_ns", labels.clone(), None).unwrap();
        m.update("requests_ns", labels, Update::Increment(1500.0))
            .unwrap();
        m.declare("size", "", MetricKind::Histogram).unwrap();
        m.series("size", vec![], Some(vec![1.0, 2.5])).unwrap();
        for x in [0.5, 2.0, 2.0, 7.0] {
            m.update("size", vec![], Update::Observe(x)).unwrap();
        }
        m.declare("level", "", MetricKind::Gauge).unwrap();
        m.series("level", vec![], None).unwrap();
        m.update("level", vec![], Update::Set(f64::INFINITY))
            .unwrap();
        let mut out = String::new();
        super::render(&[m], &mut out);
        let expected = "\
# HELP level 
# TYPE level gauge
level +Inf
# HELP requests_ns Time \\\\ spent\\nin total
# TYPE requests_ns counter
requests_ns{model=\"a\\\"b\",version=\"1\"} 1500
# HELP size 
# TYPE size histogram
size_bucket{le=\"1\"} 1
size_bucket{le=\"2.5\"} 3
size_bucket{le=\"+Inf\"} 4
size_sum 11.5
size_count 4
";
        assert_eq!(out, expected);
    }
}
