//! Latency histograms with 1 % wide logarithmic buckets: cheap to record on the measured path,
//! small to print from a rank, and exact to merge across writers.

use std::collections::BTreeMap;
use std::time::Duration;

/// Bucket `i` holds latencies in `[GROWTH^i, GROWTH^(i+1))` nanoseconds.
const GROWTH: f64 = 1.01;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Histogram {
    buckets: BTreeMap<u32, u64>,
    count: u64,
}

impl Histogram {
    pub fn record(&mut self, latency: Duration) {
        let ns = latency.as_nanos().max(1) as f64;
        let bucket = (ns.ln() / GROWTH.ln()) as u32;
        *self.buckets.entry(bucket).or_insert(0) += 1;
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (&bucket, &n) in &other.buckets {
            *self.buckets.entry(bucket).or_insert(0) += n;
        }
        self.count += other.count;
    }

    /// The latency (µs, the bucket's upper edge) below which a fraction `q` of the samples lie.
    pub fn quantile_us(&self, q: f64) -> f64 {
        let rank = ((self.count as f64 * q).ceil() as u64).clamp(1, self.count.max(1));
        let mut seen = 0;
        for (&bucket, &n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return GROWTH.powi(bucket as i32 + 1) / 1e3;
            }
        }
        0.0
    }

    /// `bucket:count,...`
    pub fn encode(&self) -> String {
        let pairs: Vec<String> = self.buckets.iter().map(|(b, n)| format!("{b}:{n}")).collect();
        pairs.join(",")
    }

    pub fn decode(text: &str) -> Option<Histogram> {
        let mut h = Histogram::default();
        for pair in text.split(',').filter(|p| !p.is_empty()) {
            let (b, n) = pair.split_once(':')?;
            let n: u64 = n.parse().ok()?;
            *h.buckets.entry(b.parse().ok()?).or_insert(0) += n;
            h.count += n;
        }
        Some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_a_bucket_and_survive_encoding() {
        let mut h = Histogram::default();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        for (q, want) in [(0.5, 500.0), (0.99, 990.0), (0.999, 999.0)] {
            let got = h.quantile_us(q);
            assert!((got / want - 1.0).abs() < 0.021, "q{q}: {got} vs {want}");
        }
        let back = Histogram::decode(&h.encode()).unwrap();
        assert_eq!(back, h);
        let mut twice = back.clone();
        twice.merge(&h);
        assert_eq!(twice.count(), 2000);
        assert!((twice.quantile_us(0.5) / 500.0 - 1.0).abs() < 0.021);
    }
}
