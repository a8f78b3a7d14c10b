//! Latency histograms with 1 % wide logarithmic buckets: cheap to record on the measured path,
//! small to send from a rank (as JSON, `{"bucket": count, ...}`), and exact to merge across
//! writers.

use std::collections::BTreeMap;
use std::time::Duration;

/// Bucket `i` holds latencies in `[GROWTH^i, GROWTH^(i+1))` nanoseconds.
const GROWTH: f64 = 1.01;

/// Serialized as its buckets alone (a JSON object of bucket to count); the count is their sum.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(from = "BTreeMap<u32, u64>", into = "BTreeMap<u32, u64>")]
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
}

impl From<BTreeMap<u32, u64>> for Histogram {
    fn from(buckets: BTreeMap<u32, u64>) -> Histogram {
        let count = buckets.values().sum();
        Histogram { buckets, count }
    }
}

impl From<Histogram> for BTreeMap<u32, u64> {
    fn from(histogram: Histogram) -> BTreeMap<u32, u64> {
        histogram.buckets
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_a_bucket_and_survive_json() {
        let mut h = Histogram::default();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        for (q, want) in [(0.5, 500.0), (0.99, 990.0), (0.999, 999.0)] {
            let got = h.quantile_us(q);
            assert!((got / want - 1.0).abs() < 0.021, "q{q}: {got} vs {want}");
        }
        let back: Histogram = serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
        assert_eq!(back, h);
        let mut twice = back.clone();
        twice.merge(&h);
        assert_eq!(twice.count(), 2000);
        assert!((twice.quantile_us(0.5) / 500.0 - 1.0).abs() < 0.021);
    }
}
