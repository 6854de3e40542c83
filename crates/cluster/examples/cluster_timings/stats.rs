//! Summaries of samples: sorted, nearest-rank percentiles (the samples are few, so no
//! histogram is needed).

use std::time::Duration;

/// Samples of one measurement, in seconds.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    pub seconds: Vec<f64>,
}

impl Samples {
    pub fn push(&mut self, d: Duration) {
        self.seconds.push(d.as_secs_f64());
    }

    pub fn len(&self) -> usize {
        self.seconds.len()
    }

    /// The nearest-rank percentile `p` (0..=100); `None` without samples.
    pub fn percentile(&self, p: f64) -> Option<f64> {
        assert!((0.0..=100.0).contains(&p), "a percentile is within 0..=100");
        let mut sorted = self.seconds.clone();
        sorted.sort_by(f64::total_cmp);
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied()
    }

    /// `median (min–max)` scaled by `unit` seconds, e.g. 1e-3 for milliseconds.
    pub fn range(&self, unit: f64, decimals: usize) -> String {
        match (
            self.percentile(50.0),
            self.percentile(0.0),
            self.percentile(100.0),
        ) {
            (Some(m), Some(lo), Some(hi)) => format!(
                "{:.d$} ({:.d$}–{:.d$})",
                m / unit,
                lo / unit,
                hi / unit,
                d = decimals
            ),
            _ => "–".into(),
        }
    }

    /// Every sample, in order taken, scaled by `unit` seconds.
    pub fn list(&self, unit: f64, decimals: usize) -> String {
        let each: Vec<String> = self
            .seconds
            .iter()
            .map(|s| format!("{:.d$}", s / unit, d = decimals))
            .collect();
        each.join(" / ")
    }
}

/// `n` with thousands separators, for message and byte rates.
pub fn grouped(n: f64) -> String {
    let digits = format!("{:.0}", n.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}
