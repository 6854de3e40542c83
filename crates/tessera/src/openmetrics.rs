//! Writing metric families from a prometheus-client `Collector`: one descriptor per family,
//! then each labelled sample. Collectors here read counters that already exist at scrape
//! time rather than registering metrics that the I/O path would have to update.

use std::fmt;

use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

pub type Labels = Vec<(&'static str, String)>;

/// One family of samples: its descriptor once, then each labelled sample.
pub fn family<T>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: &[(Labels, T)],
    mut each: impl FnMut(&mut prometheus_client::encoding::MetricEncoder, &T) -> fmt::Result,
) -> fmt::Result {
    if samples.is_empty() {
        return Ok(());
    }
    let mut metric = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in samples {
        if labels.is_empty() {
            // A family of one sample without labels: `name 1`, not `name{} 1`.
            each(&mut metric, value)?;
        } else {
            let mut sample = metric.encode_family(labels)?;
            each(&mut sample, value)?;
        }
    }
    Ok(())
}

pub fn counters(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    s: &[(Labels, u64)],
) -> fmt::Result {
    family(enc, name, help, MetricType::Counter, s, |m, v| {
        m.encode_counter::<NoLabelSet, _, u64>(v, None)
    })
}

/// Counters of a real quantity (seconds waited, say).
pub fn counters_f64(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    s: &[(Labels, f64)],
) -> fmt::Result {
    family(enc, name, help, MetricType::Counter, s, |m, v| {
        m.encode_counter::<NoLabelSet, _, u64>(v, None)
    })
}

pub fn gauges(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    s: &[(Labels, i64)],
) -> fmt::Result {
    family(enc, name, help, MetricType::Gauge, s, |m, v| {
        m.encode_gauge(v)
    })
}
