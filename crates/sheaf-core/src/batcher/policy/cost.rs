//! An online estimate of a model's cost curve on one device: t(b) ≈ a + c·b.
//!
//! A weighted least-squares line through the measured (batch size, time) pairs, with older
//! observations fading by `DECAY` per new one, so the curve follows the device as load or clocks
//! change. `a` is the fixed cost of a batch (launch, framework overhead), `c` the cost per item.

use std::time::Duration;

/// Weight kept by older observations at each new one.
const DECAY: f64 = 0.98;

/// Least-squares sums over the observations, with fading weights.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CostModel {
    w: f64,
    sb: f64,
    sbb: f64,
    st: f64,
    sbt: f64,
}

impl CostModel {
    /// Adds one executed batch.
    pub fn observe(&mut self, size: usize, took: Duration) {
        let (b, t) = (size as f64, took.as_secs_f64());
        self.w = self.w * DECAY + 1.0;
        self.sb = self.sb * DECAY + b;
        self.sbb = self.sbb * DECAY + b * b;
        self.st = self.st * DECAY + t;
        self.sbt = self.sbt * DECAY + b * t;
    }

    /// `(a, c)` in seconds, once there is anything to fit. With a single batch size seen so far,
    /// the whole time counts as fixed cost.
    pub fn fit(&self) -> Option<(f64, f64)> {
        if self.w < 1.0 {
            return None;
        }
        let spread = self.w * self.sbb - self.sb * self.sb;
        if spread <= 1e-9 * self.w * self.w {
            return Some((self.st / self.w, 0.0));
        }
        let c = ((self.w * self.sbt - self.sb * self.st) / spread).max(0.0);
        let a = ((self.st - c * self.sb) / self.w).max(0.0);
        Some((a, c))
    }

    /// Predicted time of a batch of `size` items.
    pub fn predict(&self, size: usize) -> Option<Duration> {
        self.fit()
            .map(|(a, c)| Duration::from_secs_f64((a + c * size as f64).max(0.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1000.0)
    }

    #[test]
    fn recovers_a_linear_curve() {
        let mut m = CostModel::default();
        assert_eq!(m.fit(), None);
        for b in [1, 4, 8, 16, 32, 2, 64] {
            m.observe(b, ms(35.0 + 17.0 / 3.0 * (b as f64 - 1.0) / 1.0 * 1.0));
        }
        let (a, c) = m.fit().unwrap();
        // t(b) = 35 + (17/3)(b - 1) ms = 29.33 + 5.667 b ms.
        assert!((a * 1000.0 - 29.333).abs() < 0.01, "a = {a}");
        assert!((c * 1000.0 - 5.6667).abs() < 0.001, "c = {c}");
        assert!((m.predict(4).unwrap().as_secs_f64() * 1000.0 - 52.0).abs() < 0.01);
    }

    #[test]
    fn one_size_counts_as_fixed_cost() {
        let mut m = CostModel::default();
        m.observe(1, ms(2.0));
        m.observe(1, ms(2.0));
        let (a, c) = m.fit().unwrap();
        assert!((a - 0.002).abs() < 1e-12 && c == 0.0);
    }

    #[test]
    fn follows_a_changed_device() {
        let mut m = CostModel::default();
        for i in 0..200 {
            m.observe(1 + i % 8, ms(10.0));
        }
        for i in 0..400 {
            m.observe(1 + i % 8, ms(1.0 + (1 + i % 8) as f64));
        }
        let (a, c) = m.fit().unwrap();
        assert!(
            (a * 1000.0 - 1.0).abs() < 0.05 && (c * 1000.0 - 1.0).abs() < 0.05,
            "{a} {c}"
        );
    }
}
